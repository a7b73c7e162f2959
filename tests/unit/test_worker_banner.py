"""runexecutor's start banner: each handler with its options, flow control included."""

from __future__ import annotations

from django_reliable_executor.management.worker_output import banner_lines


def test_the_banner_shows_each_handlers_limits_and_flow_control():
    lines = banner_lines()
    assert "  demo.rated  queue=default rate_limit=5/s" in lines, lines
    assert "  demo.fair  queue=default fairness=round_robin" in lines, lines
    keyed = "  demo.fair_keyed  queue=default max_concurrency=4 max_concurrency_per_key=2"
    assert f"{keyed} fairness=round_robin" in lines, lines
    assert "  demo.fair_rated  queue=default rate_limit=1000/s fairness=round_robin" in lines
