"""The Django Tasks backend, in process and under a worker."""
