"""What the executor emits: metrics and Sentry scopes."""
