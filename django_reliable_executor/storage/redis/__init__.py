"""RedisStorage: every task in a hash, every state change one atomic Lua script.

Key layout. ``P`` is ``{KEY_PREFIX}:``; the braces make it a Cluster hash tag, so every key
lives in one hash slot and a script may touch any of them. Times are microseconds since the
epoch, written as decimal strings. With REDIS_SHARDS = N > 1 each shard has its own ``P``
(``{KEY_PREFIX:shard-<i>-of-<N>:<salt>}:``, sharding.py) holding the keys below of the tasks of
its queues (a queue's shard: sharding.shard_of) and of the task names whose own queue it holds
that have a rate_limit, a max_concurrency or fairness (their home shard, whatever queue a task of
them is submitted to: ``_store_shard`` in access.py), and ``P i:<id>`` STRING "<home shard>
<reserved at>" for a task id whose own shard (sharding.directory_of) is not its queue's
(id_reserve.lua); a schedule's keys are on its queue's shard; what belongs to no queue
(locks, workers, batches) is on shard 0.

``P t:<id>``               HASH, one per task. n name, q queue, p priority, s status, j parameter
                           (JSON), a attempts, b attempts against the current retry budget,
                           k fencing token, rl/ri/rb retry limit/interval/backoff, md max
                           duration (ms), c created, r run at, st started, f finished,
                           d deadline, e last error, o result (JSON), w worker, x cancel
                           requested ("1"), pg progress (JSON), tc the submitter's trace
                           context (JSON: traceparent, tracestate), bt/bc batch id of a
                           member/callback, bg a member's batch generation, rq nonce of
                           the last worker write (so a write redis-py resends after a lost
                           reply is recognised as done), dp its depends_on (JSON list), wf the
                           ones it
                           still awaits (JSON list; absent once none is), of "run" for
                           on_dependency_failure="run", at attempt timeout (seconds), sn
                           how many durable step checkpoints it wrote (step.lua; their
                           order; absent: it stored none), wt a PENDING task's durable wait
                           (codec.packed_wait: [kind, name, until, ids]; suspend.lua), rs its
                           resumptions, ck its concurrency key (max_concurrency_per_key),
                           rk its rate key (rate_limit),
                           jd "1" while a debounced task a submit joined when it waited due
                           already stays in its ready list or parked set with its run at
                           ahead (lua/_common.lua join_debounced; the claim that pops it
                           schedules it), fr the round of a task of a name with
                           fairness="round_robin" (numbered when stored, kept for life).
                           Fields without a value are absent.
``P steps:<id>``            HASH of the durable steps of task <id> (context.step): step name ->
                           "<order> <finished at> <result JSON>", order from the task's
                           ``sn``. On the task's shard; deleted when <id> is purged, from a
                           step on by a manual retry ``from_step`` (retry.lua).
``P events:<id>``           HASH of the events sent to task <id> (executor.send_event): name ->
                           "<sent at> <payload JSON>", the first one sent kept (event.lua). On
                           the task's shard; deleted when <id> is purged.
``P waits``                HASH task id -> the kind of its durable wait ("sleep", "event",
                           "tasks"), and ``P waits:count`` HASH kind -> how many: a task enters
                           them in suspend.lua and leaves them when it is claimed (resumed) or
                           ends (unwait in _common.lua). The waiting-tasks gauge reads the counts.
``P deps:<id>``             SET of the dependents of task <id> (depends_on naming it): every
                           script that ends <id> settles them (settle_dependents in
                           _common.lua). A waiting dependent sits in its queue's schedule at
                           9999-12-31 (a PENDING task in a durable wait_for, too: woken, not
                           cancelled, by any ending). Deleted when <id> is purged. A dependent
                           of another shard is held as "<shard> <id>" (dep_link.lua), told by
                           a message.
``P ready:<queue>:<prio>`` LIST of task ids ready to run, oldest first (FIFO within a priority).
``P prio:<queue>``         ZSET of the priorities that have a non-empty ready list (claims take
                           the highest first).
``P fready:<len>:<name>:<queue>:<prio>`` ZSET of the ready tasks of a name with
                           fairness="round_robin" (instead of the ready list), scored by round
                           (`fr`), each as "<run at, zero-padded to 20 digits>:<id>": claims take
                           them in round order, one task of each key before the second of any, the
                           oldest first within a round (codec.fair_member). <len> is the name's
                           length in bytes (names may hold ':'). ``P fnames:<queue>:<prio>`` SET of
                           the names with a non-empty one, ``P fprio:<queue>`` ZSET of the
                           priorities with some (where claims find them).
``P fparked:<len>:<name>:<queue>:<prio>`` ZSET of the tasks with a round of a name, queue and
                           priority in the name's parked set (parked at its cap, or let out
                           there by their key), scored by round (fair_park in lua/_common.lua):
                           with its fair set, where a submit finds the round the claims of the
                           name, queue and priority are at. Not a task parked by key: waiting
                           for its own key's slot, it is not being served.
``P fround:<len>:<name>:<queue>:<prio>`` ZSET of the keys of a fair name (core/fairness.fair_key)
                           scored by the round each one's next task of that queue and priority
                           gets at the earliest (lua/_common.lua fair_round): rounds are counted
                           per queue and priority, as claims serve them. A submit drops the
                           entries at or below the lowest round of their due tasks (all but the
                           highest once none is due), so it holds about the keys with work due,
                           and one entry once idle.
``P sched:<queue>``        ZSET of waiting tasks not due yet (delayed, retrying after a
                           backoff, or in a durable wait), scored by run at. Claims and
                           submits promote due ones.
``P leases``               ZSET of claimed and running tasks, scored by lease expiry; also of
                           tasks that timed out while running, as long as their holder's lease
                           lasts (the handler may still run; see expire.lua).
``P deadlines``            ZSET of unfinished tasks with a max duration, scored by deadline.
``P finished``             ZSET of terminal tasks, scored by finish time (purge).
``P done:<STATUS>``        ZSET per terminal status, scored by creation time (listing).
``P tput:<minute>``        HASH "<terminal status>" and "RETRIED" -> tasks that ended so in that
                           UTC minute (throughput.epoch_minute; RETRIED: failed attempts sent
                           back to PENDING), counted by finish and record_failure in
                           _common.lua; expires after 2 hours (the admin's chart).
``P counts``               HASH "<STATUS>:<queue>" -> number of tasks, kept exact by every script.
``P queues``               SET of every queue that holds a task in any status: purge forgets a
                           queue with its last task (its count fields and wake token too), a
                           submit adds it again (forget_if_empty in _common.lua).
``P queues:paused``        SET of the paused queues (executor.pause_queue): claim.lua takes
                           nothing from them. Kept whether or not the queue holds tasks.
                           Sharded, set on every shard (any may hold tasks of a queue).
``P wake:<queue>``         LIST holding at most one token: idle workers block on it (BLPOP).
``P held``                 HASH task name -> how many tasks of the name are in the leases (claimed
                           or running), changed only where a task enters or leaves the leases
                           (the lease and unlease helpers of _common.lua); a name at 0 is
                           removed. Claims compare it with the name's max_concurrency.
``P parked:<name>:<prio>`` ZSET of due tasks of a capped name that a claim found at its cap,
                           scored by run at (one with a round by its round; a set holding both,
                           its name having gained or lost fairness, gives the earlier due of each
                           kind's first: first_in in lua/_common.lua): waiting, out of the ready
                           lists' way. Claims take
                           them from here, in order with the ready lists, while the name has a
                           free slot; a slot freed (unlease), or the promote chore while nothing
                           of the name is held, wakes the queue of the next one.
``P parkprio:<name>``      ZSET of the priorities that have a non-empty parked set of the name.
``P parked``               SET of the task names that have parked tasks.
``P heldkey:<name>``       HASH concurrency key -> how many tasks of the name with that key are in
                           the leases, kept as ``held`` is (a key at 0 removed). Claims compare
                           it with the name's max_concurrency_per_key.
``P kparked:<bucket>:<prio>`` ZSET of due tasks whose key a claim found at its cap, scored by
                           run at (one with a round by its round, as in parked); the bucket is
                           ``<length of name in bytes>:<name>:<key>`` (codec.key_bucket). No
                           claim reads them: a slot of the key freed (unlease), a task of the
                           key taken while the key has room left, or a keyed task gone from its
                           waiting place (unqueue) moves the key's first one (highest priority,
                           then earliest, see first_in) to the name's parked set; a claim that
                           does not cap the name by key moves them all there.
``P kparkprio:<bucket>``   ZSET of the priorities that have a non-empty kparked set of the bucket.
``P kparkkeys:<name>``     SET of the keys of the name that have tasks parked by key.
``P kparked``              SET of the task names that have tasks parked by key.
``P lock:<name>``          STRING "<expiry>:<owner>" with a PX expiry: a named lease.
``P workers``, ``P workers:seen``  HASH worker id -> JSON, ZSET worker id -> last heartbeat.
``P stack:<id>``, ``P stackreq:<worker id>``  HASH a live stack request and its answer, LIST
                           the request ids a worker takes (BLPOP); both expire (stacks.py).
``P stacklast:<task id>``  STRING the id of the task's last stack request, expiring after
                           REUSE_SECONDS: an unanswered one is waited for, not stored again.
``P s:<id>``               HASH, one per schedule. n task name, j parameter, ev interval (µs) or
                           cr cron + tz time zone, sa start, m misfire policy, q/p/rl/ri/rb/md
                           the task options it fires with, o origin, pa "1" while paused,
                           nr next run, lr/lt planned time and task id of the latest fire,
                           ov overlap policy ("skip"; absent: "allow"), os runs skipped for
                           overlap, ol when last, c created, u updated. Sharded, while it moves
                           to another shard (schedule_move_out.lua): no nr, mn its next run,
                           mt that shard.
``P u:<digest>``           STRING "<window end> <task id>": the task holding a unique task's key
                           (``uniqueness.unique_digest``), expiring (PX) with its window; or a
                           debounced task's (``debouncing.debounce_digest``), its window
                           ending a day (KEY_HOLD) after the task's run at, moved on by each
                           submit that joins it. Sharded, on the key's home shard
                           (sharding.unique_home); "<window end> <task id> <shard> <taken
                           at>" for a task of another shard.
``P rate:<len>:<name>:<key>``  ZSET of the claim times of a rate-limited name and rate key
                           (rate_limit), kept for its window + margin; ``P ratenext:...``
                           STRING the slot held-back tasks of it get next; ``P ratekeys:<len>:
                           <name>`` ZSET its rate keys by latest claim; ``P ratewait:<len>:
                           <name>`` ZSET its held-back tasks by when they try again. All expire.
                           ``P ratespec`` HASH name -> the limit ("<count>/<log window µs>")
                           its held-back tasks were planned under (also at the end of each
                           ratenext): a claim under another limit plans them again.
``{KEY_PREFIX}:layout``    STRING the number of shards the prefix's tasks are stored in
                           (layout.py): the same key whatever REDIS_SHARDS is.
``P b:<id>``               HASH, one per batch (executor.submit_batch): n total, ok/ko/cx
                           completed/failed/cancelled members, sl "1" once sealed, c created,
                           f finished, cb callbacks (JSON), oc/os the callbacks' submit values
                           (see lua/_batches.lua), g its generation. A member's task hash
                           holds bt = its batch id and bg = that batch's generation (a member
                           counts only in it: an id may be used again once its batch was
                           purged), a callback's bc. ``P batches``: ZSET of batch ids by creation;
                           ``P batches:finished`` of finished ones by finish time (purge).
``P bm:<id>:<group>``      ZSET of a batch's members by creation, group LIVE until a member
                           ends, then its terminal status (listing a batch's members).
``P outbox``               LIST (REDIS_SHARDS > 1) of JSON messages to other shards, written
                           by the script that made the change (lua/_common.lua ``send``),
                           removed once applied there (outbox.py, outbox_apply.lua);
                           ``P outbox:seq`` STRING their last number. ``P xdone:<id>`` HASH
                           dependency -> outcome for a dependent not stored yet (expires);
                           ``P bx:<batch>`` HASH member -> its last applied message number.
``P schedules``            ZSET of every schedule id, all scored 0 (listing by id).
``P schedules:due``        ZSET of active schedules scored by next run (the master's due scan).
``P schedules:paused``     ZSET of paused schedule ids, scored 0.
``P sskip:<id>``           HASH epoch hour -> runs of the schedule skipped by overlap then (the
                           schedule pages' last 24 hours; control shard, expires a day after
                           the last skip, older hours deleted with the next; schedule_skips.py).

A waiting task is in exactly one of a ready list (a fair name's: its fair set), its queue's
schedule, a parked set (of its name and priority), a kparked set (of its name, key and priority)
or (claimed) the leases; a running task is in the leases; a terminal one in the finished index
and its done index (and, timed out while running, in the leases until its holder's lease ends).
``held`` equals the leased tasks of each name, ``heldkey:<name>`` those of each of its keys.
Each script in storage/redis/lua/ is a compare-and-set on the status (and the claim's token) it
expects, so a lost race changes nothing. Nothing read back is ever unpickled: parameters and
results are JSON.
"""

from __future__ import annotations

import builtins

from .access import guarded
from .batches import Batches
from .chores import Chores
from .claiming import Claiming
from .listing import Listing
from .locks import Locks
from .parameter_reindex import ParameterReindexing
from .pausing import Pausing
from .progress import ProgressReports
from .reading import RateReading, Reading
from .schedule_fires import ScheduleFires
from .schedules import Schedules
from .server_config import config_warnings
from .stacks import Stacks
from .steps import Steps
from .submitting import Submitting
from .transitions import Transitions
from .waits import Waits
from .workers import Workers


class RedisStorage(
    Submitting,
    Claiming,
    Transitions,
    ProgressReports,
    Steps,
    Waits,
    Schedules,
    ScheduleFires,
    Chores,
    Locks,
    Workers,
    Reading,
    Listing,
    Pausing,
    RateReading,
    Batches,
    Stacks,
    ParameterReindexing,
):
    """Tasks in Redis under one key prefix (see the module docstring for the key layout): one
    part per role, each built on RedisAccess alone, never on another part.

    RedisAccess provides the client and key prefix (``client``, ``p``, ``_tkey``), running a
    Lua script (``_run``), ``get`` (every part reads a task back with it), reading tasks and
    indexes in bulk (``_read_many``, ``_due_ids``, ``_queues``, ``_fair_sets``), the server
    checks and ``guarded``, which turns a lost connection into StorageUnavailableError.
    codec.py converts hashes to records and back."""

    #: Idle workers may block in wait_for_work instead of sleeping.
    blocking_wait = True

    def location(self) -> dict[str, str]:
        return {"backend": "redis", "key_prefix": self.key_prefix}

    @guarded
    def server_warnings(self) -> builtins.list[str]:
        """What is wrong with the Redis server's configuration for holding tasks: an evicting
        maxmemory-policy, appendonly no, an appendfsync weaker than everysec."""
        return config_warnings(self.client, self.where, self._unavailable)


__all__ = ["RedisStorage"]
