"""Prometheus collectors (in the default registry, which django-prometheus exports); no side
effects at import: collectors are created on first use, and only if prometheus_client exists."""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger("django_reliable_executor")


def serve(port: int) -> None:
    """Serve the default registry over HTTP on ``port`` (runexecutor --metrics-port)."""
    try:
        from prometheus_client import start_http_server
    except ImportError as exc:
        raise RuntimeError(
            "--metrics-port needs prometheus_client: "
            "pip install 'django-reliable-executor[prometheus]'"
        ) from exc
    start_http_server(port)
    logger.info("serving Prometheus metrics on port %d", port)


__all__: list[Any] = ["serve"]
