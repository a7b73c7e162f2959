"""What the executor emits: a signal, a log line and a metric per transition (announcer.py),
Prometheus metrics and collectors, tracing spans and Sentry scopes per attempt, JSON logs."""
