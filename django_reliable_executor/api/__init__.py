"""Optional JSON HTTP API over the task and schedule service: include
``django_reliable_executor.api.urls``."""
