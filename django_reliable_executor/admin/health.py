"""The summary's health parts: the throughput chart and each queue's sparkline of completions
(inline SVG drawn here, no JavaScript), and the oldest due task's age of each queue, marked amber
or red past its thresholds."""

from __future__ import annotations

import dataclasses
import datetime as dt

from ..core.minute_counts import MinuteCounts

# The chart's drawing area, in SVG user units (the image scales to the box's width).
WIDTH, HEIGHT = 600, 140
LEFT, RIGHT, TOP, BOTTOM = 44, 8, 10, 22  # margins: the y labels left, the x labels below
# The series, drawn in this order (the last on top): field, label, colour (the status colours).
SERIES = (
    ("completed", "Completed", "#15803d"),
    ("retried", "Retried", "#b45309"),
    ("failed", "Failed", "#b91c1c"),
)


@dataclasses.dataclass(frozen=True)
class DueThresholds:
    """How long the oldest due task may wait before its age turns amber, then red (seconds)."""

    amber_seconds: float = 60.0
    red_seconds: float = 300.0

    def __post_init__(self) -> None:
        if not 0 < self.amber_seconds <= self.red_seconds:
            raise ValueError("due thresholds need 0 < amber_seconds <= red_seconds")

    def level(self, age: dt.timedelta) -> str:
        """ "ok", "amber" (past amber_seconds) or "red" (past red_seconds)."""
        seconds = age.total_seconds()
        if seconds > self.red_seconds:
            return "red"
        if seconds > self.amber_seconds:
            return "amber"
        return "ok"


@dataclasses.dataclass(frozen=True)
class Series:
    field: str
    label: str
    colour: str
    points: str  # the polyline's "x,y x,y ..."
    total: int  # over the whole window
    peak: int  # the busiest minute's


@dataclasses.dataclass(frozen=True)
class Column:
    """One minute of the chart: the invisible hover strip carrying its tooltip."""

    x: float
    width: float
    title: str


@dataclasses.dataclass(frozen=True)
class Tick:
    x: float
    label: str


@dataclasses.dataclass(frozen=True)
class Chart:
    width: int
    height: int
    series: list[Series]
    columns: list[Column]
    x_ticks: list[Tick]
    y_max: int  # the value of the top grid line
    left: float  # the plot area, inside the labels
    top: float
    right: float
    bottom: float
    description: str  # the chart in words, for screen readers

    @property
    def empty(self) -> bool:
        return all(s.total == 0 for s in self.series)

    @property
    def plot_height(self) -> float:
        return self.bottom - self.top

    @property
    def y_label_x(self) -> float:  # the y labels end just left of the plot
        return self.left - 4

    @property
    def y_max_label_y(self) -> float:
        return self.top + 4

    @property
    def x_label_y(self) -> float:
        return self.height - 6


def nice_ceiling(value: int) -> int:
    """The smallest of 1, 2, 5, 10, 20, 50, ... at least ``value`` (a round top for the axis)."""
    step = 1
    while True:
        for factor in (1, 2, 5):
            if step * factor >= value:
                return step * factor
        step *= 10


def chart(minutes: list[MinuteCounts]) -> Chart:
    """The chart of these minutes (oldest first): a line per series, a tooltip per minute."""
    left, top = float(LEFT), float(TOP)
    right, bottom = float(WIDTH - RIGHT), float(HEIGHT - BOTTOM)
    count = max(len(minutes), 1)
    step = (right - left) / count
    y_max = nice_ceiling(
        max((getattr(m, field) for m in minutes for field, _, _ in SERIES), default=0)
    )

    def x(index: int) -> float:  # the middle of the minute's column
        return round(left + step * (index + 0.5), 1)

    def y(value: int) -> float:
        return round(bottom - (bottom - top) * value / y_max, 1)

    series = [
        Series(
            field=field,
            label=label,
            colour=colour,
            points=" ".join(f"{x(i)},{y(getattr(m, field))}" for i, m in enumerate(minutes)),
            total=sum(getattr(m, field) for m in minutes),
            peak=max((getattr(m, field) for m in minutes), default=0),
        )
        for field, label, colour in SERIES
    ]
    columns = [
        Column(
            x=round(left + step * i, 1),
            width=round(step, 1),
            title=(
                f"{m.minute:%H:%M} UTC: {m.completed} completed, {m.failed} failed, "
                f"{m.retried} retried"
            ),
        )
        for i, m in enumerate(minutes)
    ]
    ticks = []
    if minutes:
        # Every quarter of the window, labelled with its minute's start (UTC).
        for index in range(0, len(minutes), max(len(minutes) // 4, 1)):
            ticks.append(
                Tick(x=round(left + step * index, 1), label=f"{minutes[index].minute:%H:%M}")
            )
        ticks.append(Tick(x=right, label="now"))
    description = ", ".join(f"{s.total} {s.label.lower()}" for s in series)
    return Chart(
        width=WIDTH,
        height=HEIGHT,
        series=series,
        columns=columns,
        x_ticks=ticks,
        y_max=y_max,
        left=left,
        top=top,
        right=right,
        bottom=bottom,
        description=f"Tasks per minute over the last {len(minutes)} minutes: {description}.",
    )


# A sparkline's drawing area (SVG user units, drawn at this size), and how many queues get one:
# the first of the summary's queue table (by name); the rows past them show none, so that a
# store with thousands of queues reads and draws a bounded amount.
SPARK_WIDTH, SPARK_HEIGHT, SPARK_PAD = 60, 18, 2
SPARKLINE_QUEUES = 50


@dataclasses.dataclass(frozen=True)
class Sparkline:
    """One queue's tasks completed per minute, drawn small: scaled to its own peak."""

    width: int
    height: int
    points: str  # the polyline's "x,y x,y ..."
    area: str  # the same line closed along the bottom, filled lightly
    total: int
    peak: int
    title: str  # the tooltip, and the image's accessible name

    @property
    def baseline(self) -> float:
        return self.height - SPARK_PAD


def sparkline(queue: str, completed: list[int]) -> Sparkline:
    """The sparkline of ``completed`` per minute (oldest first, the current minute last)."""
    count = len(completed)
    peak = max(completed, default=0)
    total = sum(completed)
    span = SPARK_WIDTH - 2 * SPARK_PAD
    bottom = SPARK_HEIGHT - SPARK_PAD

    def x(index: int) -> float:
        return round(SPARK_PAD + (span * index / (count - 1) if count > 1 else span), 1)

    def y(value: int) -> float:
        return round(bottom - (bottom - SPARK_PAD) * value / peak, 1) if peak else bottom

    points = " ".join(f"{x(i)},{y(n)}" for i, n in enumerate(completed))
    area = f"{x(0)},{bottom} {points} {x(count - 1)},{bottom}" if count else ""
    if total:
        title = f"{queue}: {total} completed in the last {count} minutes, peak {peak} a minute"
    else:
        title = f"{queue}: none completed in the last {count} minutes"
    return Sparkline(SPARK_WIDTH, SPARK_HEIGHT, points, area, total, peak, title)
