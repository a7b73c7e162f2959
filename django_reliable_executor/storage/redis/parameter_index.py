"""The parameter index on Redis (setting SEARCHABLE_PARAMETERS): the sorted set of each entry.

A task's entries (core/parameter_index.py: a searchable top-level key and the canonical text of
its value) are stored as members of ``P pidx:<len>:<key>:<text>`` ZSETs on the task's own
shard, scored by its creation as the tag sets are, written by store_task in the script that
stores the task and moved by a debounced submit that joins it (lua/_common.lua), left when it
is purged (purge.lua). <len> is the key's length in UTF-8 bytes, so a key holding ':' cannot
make two entries share a set. The task hash's ``px`` holds the list of its sets' names (after
``pidx:``), which is what the scripts need to move or drop them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

# The sets' family under a shard's prefix.
FAMILY = "pidx:"


def entry_name(key: str, value_text: str) -> str:
    """The set of one entry, after ``P pidx:``: ``<len>:<key>:<text>``."""
    return f"{len(key.encode('utf-8'))}:{key}:{value_text}"


def index_arg(entries: Sequence[tuple[str, str]]) -> str:
    """The value submit.lua takes for a task's entries: a JSON list of their set names ('' for
    none), stored as the task's ``px``."""
    if not entries:
        return ""
    return json.dumps([entry_name(key, value) for key, value in entries], separators=(",", ":"))


def entry_key(prefix: str, key: str, value_text: str) -> str:
    """The set of one entry on the shard of ``prefix``."""
    return prefix + FAMILY + entry_name(key, value_text)


def searchable_keys() -> tuple[str, ...]:
    """The keys the settings make searchable (SEARCHABLE_PARAMETERS): the storage reads them
    for the tasks it makes itself, a schedule's runs, which no submit prepared."""
    from ...conf import get_settings  # (read when a schedule fires: the settings of now)

    return get_settings().SEARCHABLE_PARAMETERS
