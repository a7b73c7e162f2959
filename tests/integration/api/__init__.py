"""The HTTP API: endpoints, signatures, permissions and input checks."""
