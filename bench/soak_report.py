"""The soak benchmark's figures from its samples: the summary line, the CSV and the plot."""

from __future__ import annotations

import csv
from array import array
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import throughput  # the bench directory is on sys.path: soak.py runs from it

# The samples' columns, in CSV order (the JSON lines carry the same keys).
COLUMNS = (
    "t_s",
    "submitted",
    "submit_per_s",
    "submit_behind_max",
    "started",
    "latency_p50_ms",
    "latency_p99_ms",
    "claim_ms",
    "size_bytes",
    "dead_tuples",
    "stored_tasks",
    "unfinished",
)
TARGET_P99_RATIO = 1.5
PLATEAU_TOLERANCE = 0.10  # the last third may grow by at most this share of its start size


def percentile(values: Sequence[float], q: float) -> float | None:
    """throughput.percentile (linear interpolation, numpy's default) of unsorted ``values``;
    None when empty."""
    return throughput.percentile(sorted(values), q) if values else None


def rounded(value: float | None, digits: int = 2) -> float | None:
    return None if value is None else round(value, digits)


def latency_windows(
    samples: Sequence[dict[str, Any]], latencies: Sequence[array], window: float
) -> dict[str, Any]:
    """p99 of the tasks started in the first and in the last ``window`` seconds (at most a
    third of the run, so the two never overlap; at least one sample each), and their ratio
    against the target."""
    duration = samples[-1]["t_s"]
    window = min(window, duration / 3)
    first_end = max(window, samples[0]["t_s"])
    last_start = min(duration - window, samples[-1]["t_s"] - samples[-1]["interval_s"])
    first: list[float] = []
    last: list[float] = []
    for sample, values in zip(samples, latencies, strict=True):
        if sample["t_s"] <= first_end + 1e-6:
            first.extend(values)
        if sample["t_s"] - sample["interval_s"] >= last_start - 1e-6:
            last.extend(values)
    p99_first, p99_last = percentile(first, 99), percentile(last, 99)
    ratio = p99_last / p99_first if p99_first and p99_last is not None else None
    return {
        "window_s": round(window, 1),
        "p99_first_window_ms": rounded(p99_first),
        "p99_last_window_ms": rounded(p99_last),
        "p99_ratio": rounded(ratio, 3),
        "p99_ratio_target": TARGET_P99_RATIO,
        "p99_ratio_ok": None if ratio is None else ratio <= TARGET_P99_RATIO,
    }


def size_growth(samples: Sequence[dict[str, Any]], steady_from: float) -> dict[str, Any]:
    """Whether table+index size stopped growing once retention was reached: the samples from
    ``steady_from`` on (retention plus the longest delay: from then on as many tasks are purged
    as finish) split in thirds, the growth over the first and over the last third."""
    steady = [s for s in samples if s["t_s"] >= steady_from and s["size_bytes"] is not None]
    result: dict[str, Any] = {
        "steady_from_s": round(steady_from, 1),
        "steady_samples": len(steady),
        "size_growth_first_third_bytes": None,
        "size_growth_last_third_bytes": None,
        "size_plateaued": None,
    }
    if len(steady) < 4:  # two growths need two points each
        result["size_note"] = "too few samples after retention was reached (run longer)"
        return result
    third = len(steady) // 3 or 1
    first, last = steady[: third + 1], steady[-(third + 1) :]
    growth_first = first[-1]["size_bytes"] - first[0]["size_bytes"]
    growth_last = last[-1]["size_bytes"] - last[0]["size_bytes"]
    result["size_growth_first_third_bytes"] = growth_first
    result["size_growth_last_third_bytes"] = growth_last
    result["size_plateaued"] = growth_last <= PLATEAU_TOLERANCE * last[0]["size_bytes"]
    return result


def write_csv(path: Path, samples: Sequence[dict[str, Any]]) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(samples)


def require_matplotlib() -> None:
    """Fail before the run, not after an hour of it, when --plot cannot be drawn."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        raise RuntimeError(
            "--plot needs matplotlib, which is not a dependency of the package: "
            "pip install matplotlib"
        ) from exc


def plot(path: Path, samples: Sequence[dict[str, Any]], title: str) -> None:
    """Latency, claim time, size and (PostgreSQL) dead tuples against the run's minutes, as a
    PNG."""
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    minutes = [s["t_s"] / 60 for s in samples]

    def series(key: str, scale: float = 1.0) -> list[float]:
        return [float("nan") if s[key] is None else s[key] * scale for s in samples]

    # Dead tuples only where the storage counts them (PostgreSQL): no empty panel elsewhere.
    dead = any(s["dead_tuples"] is not None for s in samples)
    panels = 4 if dead else 3
    figure, axes = plt.subplots(panels, 1, figsize=(9, 2.5 * panels), sharex=True)
    axes[0].plot(minutes, series("latency_p50_ms"), label="p50")
    axes[0].plot(minutes, series("latency_p99_ms"), label="p99")
    axes[0].set_ylabel("submit→start (ms)")
    axes[0].legend()
    axes[1].plot(minutes, series("claim_ms"))
    axes[1].set_ylabel("claim probe (ms)")
    axes[2].plot(minutes, series("size_bytes", 1 / 2**20))
    axes[2].set_ylabel("table+index / memory (MiB)")
    if dead:
        axes[3].plot(minutes, series("dead_tuples"))
        axes[3].set_ylabel("dead tuples")
    axes[-1].set_xlabel("minutes")
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
