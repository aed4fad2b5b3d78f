"""The blind record of the held-out parts (tasks/failure_corpus/blind.yaml) and the engineer's
reading beside it (tasks/failure_corpus/engineer/): the data is whole, and the comparison counts
what it says (benchmarks/failure_blind.py)."""

from __future__ import annotations

import pytest
import yaml

from benchmarks.failure_blind import BLIND_FILE, ENGINEER_DIR, compare, engineer_reads, kind_of
from tasks.failure_corpus import PARTS, load_corpus


def test_every_blind_part_exists_and_the_engineer_read_each_of_its_logs_quoting_its_own_lines():
    blind = yaml.safe_load(BLIND_FILE.read_text())
    assert blind and set(blind) <= set(PARTS)
    for part in blind:
        rows = yaml.safe_load((ENGINEER_DIR / f"{part}.yaml").read_text())
        entries = {e.id: e for e in load_corpus([part])}
        assert [r["id"] for r in rows] == list(entries), part  # every log, once, in the corpus's order
        for r in rows:
            assert r["line"] == "" or r["line"].strip() in entries[r["id"]].log, (part, r["id"])
            assert r["sure"] in ("high", "medium", "low"), (part, r["id"])


def test_compare_counts_the_classifier_beside_the_engineer():
    entries = load_corpus(["test25"])[:4]
    labels = [e.expected_class for e in entries]
    blind = {e.id: {"class": e.expected_class, "kind": e.expected_kind} for e in entries}
    blind[entries[0].id] = {"class": "unknown", "kind": kind_of("unknown")}  # the classifier misses the first
    eng = {e.id: e.expected_class for e in entries[:3]}  # the engineer reads three, misses the third
    eng[entries[2].id] = "not_a_class" if labels[2] != "unknown" else "healthy"
    r = compare(entries, blind, eng)
    assert (r["n"], r["classifier_class"], r["engineer_read"], r["engineer_class"]) == (4, 3, 3, 2)
    assert r["log_shows_it"] == 2 and r["classifier_class_where_log_shows_it"] == 1
    assert [x["id"] for x in r["engineer_right_classifier_wrong"]] == [entries[0].id]
    assert [x["id"] for x in r["classifier_right_engineer_wrong"]] == [entries[2].id]


def test_an_engineer_class_outside_the_table_reads_unknown(tmp_path):
    (tmp_path / "test25.yaml").write_text("- {id: a, class: not_a_class, line: '', sure: low}\n"
                                          "- {id: b, class: healthy, line: '', sure: high}\n")
    assert engineer_reads("test25", tmp_path) == {"a": "unknown", "b": "healthy"}
    (tmp_path / "test24.yaml").write_text("a: 1\n")
    with pytest.raises(ValueError, match="test24.yaml"):
        engineer_reads("test24", tmp_path)
