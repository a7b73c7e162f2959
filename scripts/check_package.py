"""Build the sdist and the wheel, run twine check on them, and check that the wheel holds what
the app needs at run time (templates, Lua scripts, migrations, py.typed) and the licence.

    python scripts/check_package.py        # (tox -e package: with build and twine installed)
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "django_reliable_executor"
# Patterns the wheel must match at least once each (fnmatch-style, by path inside the wheel).
REQUIRED = {
    "py.typed": f"{PACKAGE}/py.typed",
    "a Lua script": f"{PACKAGE}/storage/redis/lua/",
    "an admin template": f"{PACKAGE}/templates/",
    "a migration": f"{PACKAGE}/migrations/0001_initial.py",
    "the licence": ".dist-info/licenses/LICENSE",
}


def main() -> int:
    with tempfile.TemporaryDirectory() as out:
        subprocess.run(
            [sys.executable, "-m", "build", "--sdist", "--wheel", "--outdir", out, str(ROOT)],
            check=True,
        )
        built = sorted(Path(out).iterdir())
        subprocess.run([sys.executable, "-m", "twine", "check", "--strict", *map(str, built)],
                       check=True)  # fmt: skip
        [wheel] = [path for path in built if path.suffix == ".whl"]
        names = zipfile.ZipFile(wheel).namelist()
        missing = [what for what, part in REQUIRED.items() if not any(part in n for n in names)]
        if missing:
            print(f"{wheel.name} lacks: {', '.join(missing)}", file=sys.stderr)
            return 1
        lua = sum(name.endswith(".lua") for name in names)
        templates = sum(f"{PACKAGE}/templates/" in name for name in names)
        print(f"{wheel.name}: {len(names)} files, {lua} Lua scripts, {templates} templates: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
