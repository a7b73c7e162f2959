"""The journal reader the process tests share: half-written and cut lines."""

from tests.support.processes import read_journal


def test_a_half_written_last_line_waits_for_the_next_read(tmp_path):
    path = tmp_path / "journal.jsonl"
    path.write_text('{"task": "a", "event": "start"}\n{"task": "b", "event": "st')
    assert read_journal(path) == [{"task": "a", "event": "start"}]
    with path.open("a") as journal:
        journal.write('art"}\n')
    assert [r["task"] for r in read_journal(path)] == ["a", "b"]


def test_a_write_cut_by_a_kill_loses_only_itself(tmp_path):
    path = tmp_path / "journal.jsonl"
    path.write_text('{"task": "a", "ev{"task": "b", "event": "start"}\n')
    assert read_journal(path) == [{"task": "b", "event": "start"}]


def test_no_journal_yet_is_no_records(tmp_path):
    assert read_journal(tmp_path / "missing.jsonl") == []
