"""The app's signals. Sent with send_robust and ``sender=ReliableExecutor``: a failing receiver is
logged and never breaks submitting or executing.

Each caches its receivers per sender (``use_caching``): a worker sends two per task, and
Django's look-up of the receivers otherwise walks them under a lock on every send. The
announcer sends nothing, and builds no arguments, for a signal nobody listens to."""

from __future__ import annotations

from django.dispatch import Signal

#: A new task was stored (on database storage: once the submitting transaction commits).
#: kwargs: task_id, task_name
task_submitted = Signal(use_caching=True)

#: An attempt is about to run. kwargs: task_id, task_name, attempt (1-based, counts all runs)
task_started = Signal(use_caching=True)

#: The handler returned. kwargs: task_id, task_name, result (the stored JSON value)
task_completed = Signal(use_caching=True)

#: An attempt failed and another is scheduled.
#: kwargs: task_id, task_name, attempt, error (str with traceback), next_run_at (aware UTC)
task_retrying = Signal(use_caching=True)

#: The task ended unsuccessfully. kwargs: task_id, task_name, status (TaskStatus.FAILED, TIMEOUT
#: or ERROR), error
task_failed = Signal(use_caching=True)

#: The task ended CANCELLED. kwargs: task_id, task_name
task_cancelled = Signal(use_caching=True)

#: A durable step's checkpoint was written (``context.step`` ran its function and stored its
#: result; an atomic step's once its transaction committed). Not sent for a step whose stored
#: result was given back. kwargs: task_id, task_name, step (the step's name)
task_step_finished = Signal(use_caching=True)

#: A handler stopped to wait and its task was handed back PENDING, holding no worker: a durable
#: wait (``context.sleep``, ``wait_for_event``, ``wait_for``), or a stop at a step as its worker
#: stopped. Sent by the worker. kwargs: task (TaskInfo, as handed back), kind ("sleep",
#: "event", "tasks" or "stop"), waiting (``TaskInfo.waiting``: None for a stop)
task_waiting = Signal(use_caching=True)
