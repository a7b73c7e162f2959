"""The storage contract: every transition's rules, on SQLite, MariaDB, PostgreSQL and Redis."""
