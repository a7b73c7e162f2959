"""The database storage's surroundings: connections, server settings, indexes,
migrations, isolation."""
