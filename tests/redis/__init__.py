"""The Redis storage: connections, Cluster, outages, server settings;
Lua scripts and shards below."""
