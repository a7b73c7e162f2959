"""``list_tasks(parameter=...)`` on Redis: a bounded scan, and the record of where it stopped.

Redis indexes only the values of the keys SEARCHABLE_PARAMETERS names (parameter_index.py: a
search naming one reads that index, Listing._indexed_rows, and is never cut short); an index
of every key and value would cost more memory than the tasks. Any other parameter search reads
the parameter of each task that the other filters'
indexes list, newest first, in pipelined chunks (Listing._matching), and reads at most
SCAN_LIMIT index entries in all, shared by the indexes it walks in turn: the unfinished tasks'
(of a large backlog, the newest of each ready list and schedule), then each finished status's
index, a tag's set, a batch's member groups. A search that stopped so, with indexes left
unread and the page not full, answers a TaskPage (``cut_short``), and the admin and the HTTP
API say so. A narrower filter (a tag, a status, a task name) makes the scan complete.
"""

from __future__ import annotations

from dataclasses import dataclass

# Index entries one parameter search reads at most (about 0.3 s of reads, docs/benchmarks.md).
SCAN_LIMIT = 10_000
# Index entries a count reads at most where the server checks them (lua/index_match.lua: a
# finished status's index filtered by name or queue): a few microseconds of Redis time each.
SERVER_SCAN_LIMIT = 1_000_000


@dataclass
class Scan:
    """One listing's parameter scan: the index entries it may still read, and whether it left
    some unread while its page lacked matches."""

    left: int = SCAN_LIMIT
    cut_short: bool = False
    # Every read counts against ``left``, not only a parameter search's: a count's (Listing.
    # _count_tasks), which reads each task's fields wherever no index answers its filter.
    bounded: bool = False
    # A bounded scan's entries checked by the server instead (Listing._newest_on_server).
    server_left: int = SERVER_SCAN_LIMIT
