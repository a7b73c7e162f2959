"""Optional JSON HTTP API over the task service: include ``django_reliable_executor.api.urls``."""
