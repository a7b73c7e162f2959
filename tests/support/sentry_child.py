"""A process with Sentry set up as a Django project sets it up (DjangoIntegration), its events
kept in memory: submits the tasks given, drains them with an in-process burst worker, prints
every event as one JSON line. Started by tests/integration/observability/test_sentry.py
(Sentry's set-up is global to a process: kept out of the test run's)."""

from __future__ import annotations

import json
import sys


def main(submits: list[dict]) -> None:
    import django

    django.setup()
    import logging

    import sentry_sdk
    from sentry_sdk.integrations.django import DjangoIntegration
    from sentry_sdk.integrations.logging import LoggingIntegration
    from sentry_sdk.transport import Transport

    class KeptEvents(Transport):
        """Keeps the events instead of sending them."""

        events: list[dict] = []

        def capture_envelope(self, envelope) -> None:
            for item in envelope.items:
                if item.type == "event":
                    self.events.append(item.payload.json)

    transport = KeptEvents()
    # As docs/logs.md tells: ERROR lines as events (sentry-sdk 2's default; 3 makes none).
    logged = LoggingIntegration(event_level=logging.ERROR)
    sentry_sdk.init(
        dsn="https://key@sentry.invalid/1",
        transport=transport,
        integrations=[DjangoIntegration(), logged],
    )
    from django_reliable_executor import executor
    from django_reliable_executor.worker.worker import Worker, WorkerOptions

    for submit in submits:
        executor.submit(**submit)
    Worker(WorkerOptions(burst=True, poll_interval=0.05, worker_id="sentry-worker")).run()
    sentry_sdk.flush()
    for event in transport.events:
        print(json.dumps(event, default=str))


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
