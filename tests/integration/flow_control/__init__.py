"""Flow control over real backends: max_concurrency, name limits, queue limits, rate limits."""
