"""Teeth of the model-based test: re-introduce past defects one at a time, run the test on each.

Each mutant is a small patch applied to a copy of the repository (the working tree, without
.git) in a temporary directory: exact text replacements (a fix commit's diff reversed stops
applying as soon as the code around it changes). A
mutant of a defect the code still has (a known divergence of tests/model/reference.py) needs
no patch: the test runs with that rule demanded (RE_MODEL_STRICT) on the code as it is.

    python bench/mutants.py                    # every mutant, its storage each
    python bench/mutants.py cancel-keeps-token # some of them, by name
    python bench/mutants.py --list

Prints one line per mutant (caught, survived or broken, with seconds) and caught/total last.
A mutant is caught when the model test fails on it; the unpatched tree must pass first.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYTEST = os.environ.get("RE_PYTEST", str(Path(sys.executable).with_name("pytest")))
IDS = {"sqlite": "sqlite", "mariadb": "mariadb", "postgres": "postgres", "redis": "redis"}


@dataclasses.dataclass(frozen=True)
class Mutant:
    name: str
    storage: str  # where the defect lived (the test runs there)
    what: str
    # (path, old text, new text): old must occur exactly once
    replace: tuple[tuple[str, str, str], ...] = ()
    strict: str = ""  # a known divergence of the model to demand (no patch)


DB = "django_reliable_executor/storage/database/"
LUA = "django_reliable_executor/storage/redis/lua/"

MUTANTS = [
    Mutant(
        "cancel-keeps-token",
        "sqlite",
        "a cancel does not bump the token: a claim taken before can still start the task",
        replace=(
            (
                DB + "transitions.py",
                '            "lease_token": F("lease_token") + 1,\n',
                "",
            ),
        ),
    ),
    Mutant(
        "retry-keeps-token",
        "sqlite",
        "a manual retry does not bump the token: an earlier claim can start the retried task",
        replace=(
            (
                DB + "transitions.py",
                '                lease_token=F("lease_token") + 1,  # no earlier claim of it'
                " counts any more\n",
                "",
            ),
        ),
    ),
    Mutant(
        "release-keeps-token",
        "sqlite",
        "a hand-back does not bump the token: the old holder can still start the task",
        replace=(
            (
                DB + "transitions.py",
                '                    lease_token=F("lease_token") + 1,  # the old holder can no'
                " longer start it\n",
                "",
            ),
        ),
    ),
    Mutant(
        "retry-ignores-running-handler",
        "sqlite",
        "a retry of a timed-out attempt does not wait for its handler (its lease)",
        replace=(
            (
                DB + "transitions.py",
                "        lease_gone = Q(lease_expires_at__isnull=True)"
                " | Q(lease_expires_at__lte=now)",
                "        lease_gone = Q()",
            ),
        ),
    ),
    Mutant(
        "redis-retry-ignores-running-handler",
        "redis",
        "the same on Redis (retry.lua)",
        replace=((LUA + "retry.lua", "if held and tonumber(held) > NOWN then", "if false then"),),
    ),
    Mutant(
        "timeout-drops-lease",
        "sqlite",
        "expire_overdue drops a running task's lease: its handler no longer counts as running",
        replace=(
            (
                DB + "chores.py",
                '                del changes["lease_expires_at"]\n',
                "                pass\n",
            ),
        ),
    ),
    Mutant(
        "start-ignores-token",
        "sqlite",
        "a start checks the holder but not the token (stale claims start)",
        replace=(
            (
                DB + "rows.py",
                'HOLDER_SQL = "lease_token = %s AND worker_id = %s AND available = %s"',
                'HOLDER_SQL = "(lease_token = %s OR TRUE) AND worker_id = %s AND available = %s"',
            ),
        ),
    ),
    Mutant(
        "redis-start-ignores-token",
        "redis",
        "start.lua accepts any token of a leased task",
        replace=(
            (
                LUA + "start.lua",
                "local held = waiting(task[1]) and task[2] == token and",
                "local held = waiting(task[1]) and",
            ),
        ),
    ),
    Mutant(
        "redis-heartbeat-ignores-token",
        "redis",
        "a heartbeat renews a lease by worker id alone: a twin keeps a lost claim alive",
        replace=(
            (
                LUA + "heartbeat.lua",
                "  if task[1] == worker and task[3] == token and",
                "  if task[1] == worker and",
            ),
        ),
    ),
    Mutant(
        "fail-ignores-cancel-request",
        "sqlite",
        "a failed attempt of a task whose cancel was requested retries instead of ending CANCELLED",
        replace=(
            (
                "django_reliable_executor/core/retries.py",
                "    if cancel_requested:\n",
                "    if False:\n",
            ),
        ),
    ),
    Mutant(
        "fail-past-deadline-retries",
        "redis",
        "a failure past max duration retries (PENDING) instead of ending TIMEOUT",
        replace=(
            (
                "django_reliable_executor/core/retries.py",
                "    if deadline_at is not None and now >= deadline_at:\n",
                "    if False:\n",
            ),
        ),
    ),
    Mutant(
        "claim-ignores-pause",
        "sqlite",
        "the claim takes tasks of paused queues",
        replace=(
            (
                DB + "claiming.py",
                '        return f"AND queue NOT IN (SELECT queue FROM {paused}) "',
                '        return ""',
            ),
        ),
    ),
    Mutant(
        "existing-id-takes-unique-key",
        "postgres",
        "found by the model test: a unique submit naming an existing task_id takes the key, "
        "or answers with the key's holder",
        replace=(
            (
                DB + "submitting.py",
                "        stored = self.get(task.task_id)\n        if stored is not None:",
                "        stored = None\n        if stored is not None:",
            ),
        ),
    ),
    Mutant(
        "redis-partial-chain",
        "redis",
        "issue 30 defect 1: submit.lua counts a task of the call that it does not store (its "
        "unique key held) as coming for a dependent",
        replace=(
            (
                LUA + "submit.lua",
                "  elseif holder then\n    fate[i] = holder\n",
                "  elseif holder then\n    fate[i] = holder\n    storing[id] = true\n",
            ),
        ),
    ),
    Mutant(
        "timeout-ended-for-dependencies",
        "sqlite",
        "issue 30 defect 4: a dependent submitted while a timed-out handler runs counts that "
        "TIMEOUT as ended",
        replace=(
            (
                DB + "dependencies.py",
                "            found[pk] = status if lease is None else TaskStatus.RUNNING.value\n",
                "            found[pk] = status\n",
            ),
        ),
    ),
    Mutant(
        "dependent-retried-before-dependency",
        "sqlite",
        "issue 30 defect 13: a retried dependent runs at once, before its dependency ended",
        replace=(
            (
                DB + "transitions.py",
                "        awaited = self._awaited_on_retry(row, depends_on) if depends_on else ()\n",
                "        awaited = ()\n",
            ),
        ),
    ),
]


def copy_tree(into: Path) -> None:
    shutil.copytree(
        ROOT,
        into,
        ignore=shutil.ignore_patterns(
            ".git", "__pycache__", ".hypothesis", "*.sqlite3", "node_modules"
        ),
    )


def apply(mutant: Mutant, tree: Path) -> None:
    for path, old, new in mutant.replace:
        target = tree / path
        text = target.read_text()
        if text.count(old) != 1:
            raise RuntimeError(f"{mutant.name}: {path} holds the text {text.count(old)} times")
        target.write_text(text.replace(old, new))


def run_model_test(tree: Path, storage: str, strict: str = "") -> tuple[int, str]:
    env = {
        **os.environ,
        "RE_MODEL_PROFILE": "ci",
        "RE_MODEL_SHRINK": "0",  # the first failure is enough here
        "RE_MODEL_STRICT": strict,
    }
    done = subprocess.run(
        [
            PYTEST,
            "tests/model/test_protocol.py",
            "-k",
            IDS[storage],
            "-x",
            "-q",
            "-p",
            "no:cacheprovider",
        ],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
    )
    return done.returncode, done.stdout[-3000:] + done.stderr[-2000:]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="mutants to run (default: all)")
    parser.add_argument("--list", action="store_true")
    parser.add_argument("--no-baseline", action="store_true", help="skip the unpatched run")
    args = parser.parse_args()
    chosen = [m for m in MUTANTS if not args.names or m.name in args.names]
    if args.list:
        for mutant in MUTANTS:
            print(f"{mutant.name:38} {mutant.storage:8} {mutant.what}")
        return 0
    with tempfile.TemporaryDirectory(prefix="mutants-") as scratch:
        if not args.no_baseline:
            for storage in sorted({m.storage for m in chosen}):
                tree = Path(scratch) / f"baseline-{storage}"
                copy_tree(tree)
                code, output = run_model_test(tree, storage)
                if code != 0:
                    print(f"baseline fails on {storage}: fix the model or the code first\n{output}")
                    return 2
                print(f"baseline passes on {storage}")
        caught = 0
        for mutant in chosen:
            tree = Path(scratch) / mutant.name
            copy_tree(tree)
            began = time.monotonic()
            try:
                apply(mutant, tree)
            except (RuntimeError, subprocess.CalledProcessError) as exc:
                print(f"BROKEN   {mutant.name}: the patch does not apply ({exc})")
                continue
            code, output = run_model_test(tree, mutant.storage, mutant.strict)
            seconds = time.monotonic() - began
            if code == 1:
                caught += 1
                verdict = "caught"
            elif code == 0:
                verdict = "SURVIVED"
            else:
                verdict = f"BROKEN (pytest exit {code})"
                print(output)
            print(
                f"{verdict:9} {mutant.name:38} {mutant.storage:8} {seconds:5.0f} s  {mutant.what}"
            )
            shutil.rmtree(tree, ignore_errors=True)
        print(f"caught {caught}/{len(chosen)}")
    return 0 if caught == len(chosen) else 1


if __name__ == "__main__":
    sys.exit(main())
