"""The storage interface's reads of flow control in use: rate limits and per-key concurrency.
TaskStorage inherits it (storage/base.py says which module of each backend holds each method)."""

from __future__ import annotations

import abc
import builtins
from collections.abc import Mapping

from ..core.queries import KeyUse, RateUse
from ..core.rate_limits import RateLimit


class FlowStorage(abc.ABC):
    """What the admin, ``executor status`` and the metrics read of the flow limits."""

    @abc.abstractmethod
    def rate_use(self, limits: Mapping[str, RateLimit]) -> builtins.list[RateUse]:
        """For each rate-limited name of ``limits``: its claims in the last window (all rate
        keys, and the busiest key's) and how many waiting tasks its limit holds back now.
        A read for the admin, the command and the metrics; not atomic across names."""

    @abc.abstractmethod
    def key_use(self, limits: Mapping[str, int]) -> builtins.list[KeyUse]:
        """For each name of ``limits`` (``{task_name: max_concurrency_per_key}``): the tasks
        held with a ``concurrency_key``, how many keys hold them, and the busiest keys. A
        read for the admin, the command and the metrics; not atomic across names."""
