"""Records and rules with no I/O: statuses, task records, options, retries, serialization,
the clock, and the pure rules of rate limits, uniqueness, dependencies and batches. Nothing
here imports anything above it (pyproject.toml's import contract)."""
