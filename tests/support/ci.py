"""Whether the tests run under CI (CI=true): there an unreachable service fails a test, never
skips it. Its own module so code outside pytest (bench/cluster.py starts its Cluster with
tests/support/redis_servers.py) can import it without Django set up."""

import os

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
