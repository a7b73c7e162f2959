"""Retake the admin screenshots of the docs (docs/images/admin-*.png) on Django 6.1.

    python scripts/admin_screenshots.py                  # all of them (about 6 minutes)
    python scripts/admin_screenshots.py summary graph    # some: the names listed by --list
    python scripts/admin_screenshots.py --list           # each image, and the test that takes it

Each image is taken by a browser test of tests/integration/admin/ (headless Chromium driven by
Playwright, 1280 px wide, against the test project's admin on SQLite, with the demo handlers and
real workers); with RE_UPDATE_SCREENSHOTS=1 the test writes it into docs/images/ instead of its
temporary directory. This script runs those tests that way, with this script's interpreter, and
names the images written. Open each one before committing it: layout, wording, cut tables.

Needs the test extra on Django 6.1 (the docs show 6.1's admin) and Debian's Chromium:

    python3.12 -m venv ../venv61
    ../venv61/bin/pip install -e ".[test]" "Django>=6.1,<6.2"
    apt-get install chromium                 # or RE_CHROMIUM=/path/to/chromium
    ../venv61/bin/python scripts/admin_screenshots.py

To see the pages on another Django version without touching docs/images/, run the same tests
without RE_UPDATE_SCREENSHOTS: they leave their screenshots in pytest's temporary directory.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
IMAGES = ROOT / "docs" / "images"
TESTS = "tests/integration/admin/"
DJANGO = (6, 1)

# name -> (test module taking it, the images it writes)
SHOTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "list": (
        "test_admin_browser.py",
        ("admin-list.png", "admin-detail.png", "admin-schedules.png"),
    ),
    "summary": ("test_admin_browser_summary.py", ("admin-summary.png",)),
    "steps": ("test_admin_browser_steps.py", ("admin-task-steps.png",)),
    "waiting": ("test_admin_browser_waits.py", ("admin-task-waiting.png",)),
    "stack": ("test_admin_browser_stacks.py", ("admin-task-stack.png",)),
    "graph": ("test_admin_browser_workflow_graph.py", ("admin-workflow-graph.png",)),
    "bulk": (
        "test_admin_browser_bulk_actions.py",
        ("admin-bulk-confirm.png", "admin-bulk-progress.png"),
    ),
}


def check_setup() -> str | None:
    """Why the screenshots cannot be taken with this interpreter, or None."""
    try:
        import django
        import playwright  # noqa: F401
    except ImportError as error:
        return f"{error.name} is not installed here: pip install -e '.[test]' 'Django>=6.1,<6.2'"
    if django.VERSION[:2] != DJANGO:
        return f"Django {django.get_version()} here; the docs show 6.1's admin"
    chromium = os.environ.get("RE_CHROMIUM", "/usr/bin/chromium")
    if not os.path.exists(chromium):
        return f"no Chromium at {chromium}: apt-get install chromium, or set RE_CHROMIUM"
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", metavar="name", help="images to take (default: all)")
    parser.add_argument("--list", action="store_true", help="list the images and their tests")
    args = parser.parse_args()
    if args.list:
        for name, (module, images) in SHOTS.items():
            print(f"{name:8} {TESTS}{module}: {', '.join(images)}")
        return 0
    unknown = sorted(set(args.names) - set(SHOTS))
    problem = f"unknown {', '.join(unknown)} (see --list)" if unknown else None
    problem = problem or check_setup()
    if problem:
        print(f"admin_screenshots: {problem}", file=sys.stderr)
        return 2
    modules = [TESTS + SHOTS[name][0] for name in args.names or SHOTS]
    started = time.time()
    # -k sqlite: the images are taken on SQLite; the tests' Redis runs would only repeat them.
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-k", "sqlite"]
    env = {**os.environ, "RE_UPDATE_SCREENSHOTS": "1"}
    code = subprocess.run([*command, *modules], cwd=ROOT, env=env).returncode
    written = sorted(p.name for p in IMAGES.glob("admin-*.png") if p.stat().st_mtime >= started)
    print(f"written to {IMAGES.relative_to(ROOT)}/: {', '.join(written) or 'none'}")
    return code


if __name__ == "__main__":
    sys.exit(main())
