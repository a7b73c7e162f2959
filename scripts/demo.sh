#!/usr/bin/env bash
# The demo, from a fresh clone: make a virtualenv (.venv) if there is none, install the package
# into it, migrate the test project's SQLite database, then run `manage.py demo`, which submits
# a mix of tasks, runs `manage.py runexecutor` until they settle and prints their final statuses.
#
#   bash scripts/demo.sh              # any extra arguments go to `manage.py demo` (e.g. --timeout 90)
#   RE_STORAGE=redis bash scripts/demo.sh   # the same demo with the tasks in the local Redis
#
# Environment: PYTHON picks the interpreter for a new virtualenv (default: the first of python3,
# python3.13 .. python3.10 that is 3.10 or newer); VENV its directory (default .venv).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
VENV=${VENV:-.venv}

find_python() {
    local candidate
    for candidate in ${PYTHON:-} python3 python3.13 python3.12 python3.11 python3.10; do
        if command -v "$candidate" >/dev/null 2>&1 &&
            "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
            echo "$candidate"
            return 0
        fi
    done
    return 1
}

if [ ! -x "$VENV/bin/python" ]; then
    if ! python=$(find_python); then
        echo "demo: Python 3.10 or newer is needed (set PYTHON=/path/to/python3)" >&2
        exit 1
    fi
    echo "Creating the virtualenv $VENV with $($python --version 2>&1) ..."
    if ! "$python" -m venv "$VENV"; then
        echo "demo: '$python -m venv' failed; on Debian/Ubuntu: apt-get install python3-venv" >&2
        exit 1
    fi
fi
PY="$VENV/bin/python"

# Install (editable) when the package is missing or pyproject.toml changed since the last install.
# RE_STORAGE=redis runs the same demo on the Redis at RE_REDIS_URL (default 127.0.0.1:6379):
# it needs the redis extra.
target="."
if [ "${RE_STORAGE:-database}" = "redis" ]; then
    target=".[redis]"
fi
stamp="$VENV/.reliable-executor-demo"
wanted="$(cksum pyproject.toml | cut -d' ' -f1) $target"
if [ "$(cat "$stamp" 2>/dev/null)" != "$wanted" ] ||
    ! "$PY" -c 'import django, django_reliable_executor' >/dev/null 2>&1; then
    echo "Installing django-reliable-executor into $VENV (pip install -e '$target') ..."
    "$PY" -m pip install --quiet --disable-pip-version-check -e "$target"
    echo "$wanted" >"$stamp"
fi

echo "Migrating the test project's database (testproject/db.sqlite3) ..."
"$PY" testproject/manage.py migrate --noinput --verbosity 0

exec "$PY" testproject/manage.py demo "$@"
