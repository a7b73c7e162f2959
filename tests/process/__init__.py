"""Real worker processes on every Django version: shutdown, async handlers, the smoke test."""
