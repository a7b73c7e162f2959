"""The documented ``LOGGING`` path ``django_reliable_executor.logging.JsonFormatter``."""

from .observability.json_logs import JsonFormatter

__all__ = ["JsonFormatter"]
