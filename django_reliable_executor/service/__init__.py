"""The service: submit, query, operate and schedule tasks (``ReliableExecutor``), and the
module-level ``executor`` the docs use (``django_reliable_executor.service.executor``)."""

from .reliable_executor import ReliableExecutor, executor

__all__ = ["ReliableExecutor", "executor"]
