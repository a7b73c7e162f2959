"""The admin: pages, actions and permissions (the browser tests drive Chromium)."""
