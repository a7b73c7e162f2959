"""One racing submitter (started by tests/support/racers.py): set Django up, connect, wait for the
barrier file, submit, print the task id as JSON. Imports nothing of Django's before setup."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def _race(folder: Path, number: str, submit: dict) -> None:
    import django

    django.setup()
    from django.db import transaction

    from django_reliable_executor import executor

    # {"in_transaction": seconds}: submit inside atomic() and hold the transaction open that
    # long before committing, so the others meet an uncommitted key.
    hold = submit.pop("in_transaction", None)
    # {"queues": [...]}: racer i submits to the i-th (round robin), e.g. one per shard.
    queues = submit.pop("queues", None)
    if queues:
        submit["queue"] = queues[int(number) % len(queues)]
    executor.get_task("warm-up")  # connected: the race is the submit, not the connecting
    (folder / f"ready-{number}").touch()
    go = folder / "go"
    while not go.exists():
        time.sleep(0.001)
    if hold is None:
        info = executor.submit(**submit)
    else:
        # The storage's own database (RE_DATABASE, as the settings read it): an atomic() on
        # "default" would leave a MariaDB or PostgreSQL submit outside any transaction.
        with transaction.atomic(using=os.environ.get("RE_DATABASE", "default")):
            info = executor.submit(**submit)
            time.sleep(hold)
    print(json.dumps({"task_id": info.task_id}))


if __name__ == "__main__":
    _race(Path(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3]))
