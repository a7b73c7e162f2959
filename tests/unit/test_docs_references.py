"""The docs pages the package names exist: in the system checks' hints and the messages (as
"docs/<page>.md, <section>", the section a heading of that page), and in its comments and
docstrings. The project has no public documentation URL, so that path is what users get."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PACKAGE = ROOT / "django_reliable_executor"

PAGE = re.compile(r"docs/([\w./-]+?\.md)")
# "See docs/redis.md, Durability: configure the Redis server.", see("redis.md", "..."), and
# OPERATIONS_DOC = "docs/operations.md, Database and Redis care" (used as "(see {...})")
SECTIONS = (
    re.compile(r"[Ss]ee docs/([\w./-]+?\.md), ([^.\"()]+?)[.)\"]"),
    re.compile(r"\bsee\(\s*\"([\w./-]+?\.md)\",\s*\"([^\"]+)\"\s*\)"),
    re.compile(r"_DOC = \"docs/([\w./-]+?\.md), ([^\"]+)\""),
)


def package_texts() -> dict[Path, str]:
    files = [*PACKAGE.rglob("*.py"), *PACKAGE.rglob("*.lua"), *PACKAGE.rglob("*.html")]
    return {path: path.read_text(encoding="utf-8") for path in files}


def headings(page: str) -> set[str]:
    text = (DOCS / page).read_text(encoding="utf-8")
    return {
        line.lstrip("#").strip().replace("`", "")
        for line in text.splitlines()
        if line.startswith("#") and " " in line
    }


def test_every_docs_page_the_package_names_exists() -> None:
    missing = sorted(
        (str(path.relative_to(ROOT)), page)
        for path, text in package_texts().items()
        for page in PAGE.findall(text)
        if not (DOCS / page).is_file()
    )
    assert missing == []


def test_every_section_the_hints_and_messages_name_is_a_heading_of_its_page() -> None:
    named = {
        (page, section.strip())
        for text in package_texts().values()
        for pattern in SECTIONS
        for page, section in pattern.findall(text)
        if (DOCS / page).is_file()
    }
    assert ("redis.md", "Durability: configure the Redis server") in named
    assert ("operations.md", "Database and Redis care") in named
    missing = sorted(
        (page, section)
        for page, section in named
        if not any(heading.startswith(section) for heading in headings(page))
    )
    assert missing == []
