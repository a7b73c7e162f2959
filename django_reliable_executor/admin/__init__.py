"""The task and schedule pages of Django's admin, registered on import (admin autodiscovery).

One scheme for each thing shown: ``<thing>.py`` holds its ``ModelAdmin`` (URLs, permissions,
views) and ``<thing>_pages.py`` what its pages show: ``tasks`` with ``task_pages`` and
``task_summary``, ``batches`` with ``batch_pages``, ``schedules`` with ``schedule_pages``.
``base`` is what the admins share, ``operations`` the retry, cancel, pause and resume they run,
``health`` the summary's chart and due-age colours.

The names below are the ones docs/admin.md imports to subclass the admins.
"""

from .base import MAX_SELECTION as MAX_SELECTION
from .health import DueThresholds as DueThresholds
from .schedules import ReliableScheduleAdmin as ReliableScheduleAdmin
from .task_summary import SlowCounts as SlowCounts
from .tasks import OPERATE_PERMISSION as OPERATE_PERMISSION
from .tasks import ReliableTaskAdmin as ReliableTaskAdmin
