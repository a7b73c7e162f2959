#!/usr/bin/env python
"""A throwaway PostgreSQL server with the server's stock settings, for benchmarks that must not
inherit a shared server's tuning (a CI server that runs without autovacuum, say).

    python bench/private_postgres.py start [--port 5433] [--dir /tmp/reliable_executor_pg]
    RE_POSTGRES_PORT=5433 python bench/soak.py --storage postgres ...
    python bench/private_postgres.py stop  [--dir /tmp/reliable_executor_pg]

``start`` runs ``initdb`` (trust authentication, as the postgres user when run as root) into
``--dir`` and starts the server on 127.0.0.1:``--port``, with nothing changed from the stock
``postgresql.conf`` but the address, the port and the socket directory; ``--set NAME=VALUE``
(repeatable) changes a setting. ``stop`` stops it and deletes ``--dir``. ``PG_BINDIR`` (else
the newest ``/usr/lib/postgresql/*/bin``, else ``$PATH``) names where ``initdb`` and
``pg_ctl`` are.
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path


def bindir() -> Path | None:
    """Where initdb and pg_ctl are (None: on $PATH)."""
    if os.environ.get("PG_BINDIR"):
        return Path(os.environ["PG_BINDIR"])
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[-2]))
    return Path(found[-1]) if found else None


def command(name: str, *args: str) -> list[str]:
    """``name args`` as the postgres user when we are root (initdb refuses to run as root)."""
    directory = bindir()
    program = str(directory / name) if directory else name
    prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    return [*prefix, program, *args]


def start(directory: Path, port: int, settings: Sequence[str]) -> None:
    if directory.exists():
        sys.exit(f"{directory} exists: stop the server there first (or pick another --dir)")
    directory.mkdir(parents=True)
    if os.geteuid() == 0:
        shutil.chown(directory, "postgres", "postgres")
    data = directory / "data"
    subprocess.run(
        command("initdb", "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8"),
        check=True,
        stdout=subprocess.DEVNULL,
    )
    options = [
        f"-p {port}",
        "-c listen_addresses=127.0.0.1",
        f"-c unix_socket_directories={directory}",
    ]
    options += [f"-c {setting}" for setting in settings]
    subprocess.run(
        command(
            "pg_ctl",
            "-D",
            str(data),
            "-l",
            str(directory / "server.log"),
            "-w",
            "-o",
            " ".join(options),
            "start",
        ),
        check=True,
        stdout=subprocess.DEVNULL,
    )
    print(f"PostgreSQL running on 127.0.0.1:{port} (data in {data}); use RE_POSTGRES_PORT={port}")


def stop(directory: Path) -> None:
    data = directory / "data"
    if data.exists():
        subprocess.run(command("pg_ctl", "-D", str(data), "-m", "fast", "-w", "stop"), check=False)
    shutil.rmtree(directory, ignore_errors=True)
    print(f"stopped; {directory} removed")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("start", "stop"))
    parser.add_argument("--port", type=int, default=5433)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/reliable_executor_pg"))
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE")
    args = parser.parse_args(argv)
    if args.action == "start":
        start(args.dir, args.port, args.set)
    else:
        stop(args.dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
