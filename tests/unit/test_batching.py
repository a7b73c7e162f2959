"""batching: the group committer isolates an item the store refuses."""

from __future__ import annotations


def test_group_committer_writes_an_item_the_store_refuses_alone():
    """A batch the store refuses is flushed again item by item: only the caller whose own item
    is refused gets the error; an error that is not a refusal still reaches every caller."""
    import threading
    import time

    from django_reliable_executor.worker.group_commit import GroupCommitter

    held = threading.Event()
    flushed: list[list[str]] = []

    def flush(items: list[str]) -> list[str]:
        flushed.append(list(items))
        if items == ["first"]:
            held.wait(10)  # the others gather into one batch meanwhile
        if "down" in items:
            raise ConnectionError("store down")
        if "bad" in items:
            raise ValueError("refused")
        return [f"ok {item}" for item in items]

    committer: GroupCommitter[str, str] = GroupCommitter(
        flush, isolate=lambda exc: isinstance(exc, ValueError)
    )
    outcomes: dict[str, object] = {}

    def submit(item: str) -> None:
        try:
            outcomes[item] = committer.submit(item)
        except Exception as exc:  # noqa: BLE001 - the outcome under test
            outcomes[item] = exc

    def gather(items: list[str]) -> None:
        threads = [threading.Thread(target=submit, args=("first",))]
        threads[0].start()
        while not flushed or flushed[-1] != ["first"]:
            time.sleep(0.001)
        for item in items:
            threads.append(threading.Thread(target=submit, args=(item,)))
            threads[-1].start()
        while len(committer._waiting) < len(items):
            time.sleep(0.001)
        held.set()
        for thread in threads:
            thread.join(10)
        held.clear()

    gather(["a", "bad", "b"])
    assert outcomes["a"] == "ok a" and outcomes["b"] == "ok b"
    assert isinstance(outcomes["bad"], ValueError)
    assert ["a", "bad", "b"] in flushed and ["a"] in flushed

    flushed.clear()
    outcomes.clear()
    gather(["c", "down"])
    assert isinstance(outcomes["c"], ConnectionError) and isinstance(
        outcomes["down"], ConnectionError
    )
    assert flushed == [["first"], ["c", "down"]]


def test_submit_many_writes_one_callers_items_in_batches_and_returns_each_outcome():
    """One caller's items share round trips (max_batch each), every item gets its own outcome
    or its own error, and a lone submit meanwhile still gets its outcome."""
    import threading

    from django_reliable_executor.worker.group_commit import GroupCommitter

    flushed: list[list[int]] = []

    def flush(items: list[int]) -> list[int]:
        if len(items) > 1 and 13 in items:
            raise ValueError("refused")
        if items == [13]:
            raise ValueError("thirteen refused")
        flushed.append(list(items))
        return [item * 10 for item in items]

    committer: GroupCommitter[int, int] = GroupCommitter(
        flush, max_batch=4, isolate=lambda exc: isinstance(exc, ValueError)
    )
    assert committer.submit_many([]) == []
    outcomes = committer.submit_many(list(range(10)))
    assert outcomes == [item * 10 for item in range(10)]
    assert flushed == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]

    lone: list[int] = []
    thread = threading.Thread(target=lambda: lone.append(committer.submit(99)))
    thread.start()
    outcomes = committer.submit_many([11, 12, 13, 14])
    thread.join(10)
    assert lone == [990]
    assert outcomes[:2] == [110, 120] and outcomes[3] == 140
    assert isinstance(outcomes[2], ValueError) and str(outcomes[2]) == "thirteen refused"
