"""Real worker processes raced against each other and the clock (run once,
on one Django version)."""
