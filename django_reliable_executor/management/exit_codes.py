"""The exit codes of ``manage.py executor``, documented in docs/command.md for scripts."""

EXIT_OK = 0
EXIT_INCOMPLETE = 1  # an id not found or skipped, or a purge not confirmed
EXIT_USAGE = 2  # bad arguments (argparse exits 2 too)
EXIT_UNAVAILABLE = 3  # the task store cannot be reached or used
EXIT_INTERRUPTED = 130  # Ctrl-C during a purge (128 + SIGINT, as shells report it)
