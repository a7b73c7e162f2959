"""The management commands: runexecutor, the health check, paused queues."""
