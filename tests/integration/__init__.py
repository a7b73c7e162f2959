"""The front ends and the storages' surroundings over real backends:
admin, API, commands, Tasks backend, database, flow control, observability."""
