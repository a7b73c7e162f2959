#!/usr/bin/env bash
# The whole test suite, the same way CI runs it: tox over the matrix in tox.ini, one env after
# the other: the package check (sdist and wheel built, twine check, the wheel's contents), the
# documentation site (mkdocs build --strict), then Python 3.11 + Django 5.2 with the
# django-tasks backport, Python 3.12 + Django 6.0, and Python 3.12 + Django 6.1 for the Django
# Tasks backend suites. Each test env runs ruff, mypy,
# the import layers, `makemigrations --check` and pytest against SQLite, MariaDB, PostgreSQL
# and Redis.
#
#   bash scripts/test.sh                                  # every env
#   bash scripts/test.sh -e py311-django52 -- -k cancel   # one env; after -- go pytest arguments
#
# It makes its own tools virtualenv (.venv-tools, with tox) and finds python3.11 and python3.12
# on PATH or in pyenv. MariaDB (127.0.0.1:3306, root, no password) and PostgreSQL
# (127.0.0.1:5432, user postgres, trust) must be running: their tests skip when a server is
# down, and fail instead when CI=true. The RE_* variables in testproject/testproject/settings.py
# point the tests at other servers.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
TOOLS=${TOOLS_VENV:-.venv-tools}
started=$(date +%s)

works() { command -v "$1" >/dev/null 2>&1 && "$1" -c 'import sys' >/dev/null 2>&1; }

# The matrix's interpreters: from PATH, else from pyenv's versions (no `pyenv init` needed).
pyenv_root=$(pyenv root 2>/dev/null || echo "${PYENV_ROOT:-$HOME/.pyenv}")
for version in 3.11 3.12; do
    works "python$version" && continue
    for bin in $(ls -d "$pyenv_root/versions/$version".*/bin 2>/dev/null | sort -V -r); do
        if [ -x "$bin/python$version" ]; then
            PATH="$bin:$PATH"
            break
        fi
    done
    works "python$version" || echo "test.sh: python$version not found; its tox env will fail" >&2
done
export PATH

if [ ! -x "$TOOLS/bin/tox" ]; then
    python=""
    for candidate in python3 python3.12 python3.11 python3.13 python3.10; do
        if works "$candidate"; then
            python=$candidate
            break
        fi
    done
    if [ -z "$python" ]; then
        echo "test.sh: no python3 found" >&2
        exit 1
    fi
    echo "Creating $TOOLS with tox ($($python --version 2>&1)) ..."
    rm -rf "$TOOLS"
    "$python" -m venv "$TOOLS"
    "$TOOLS/bin/python" -m pip install --quiet --disable-pip-version-check "tox>=4.14"
fi

set +e
"$TOOLS/bin/tox" run "$@"
status=$?
set -e
echo "test.sh: tox exited with $status after $(($(date +%s) - started)) s"
exit "$status"
