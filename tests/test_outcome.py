"""One outcome model: what the node returns is what the study stores and what records read.

``tasks.outcome.Outcome`` is the node's result (``tasks.types.TrialResult``), the study's
``record`` attribute (``sweeps.store.record_io``) and the base of ``records.TrialRecord``.
These tests check the trip field by field (so a new field is checked the day it is
declared), that declaring a field is the only edit it needs, and that studies written in
the two earlier attribute shapes still read back as they did.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState, create_trial
from pydantic import ValidationError

from sweeps.store import records
from sweeps.store.record_io import write_outcome
from tasks.outcome import Outcome, Status, Timings
from tasks.types import TrialResult

ROOT = Path(__file__).resolve().parents[1]
OLD_STUDY = ROOT / "tests" / "data" / "outcome_v1_study.json"

#: a value unlike each field's default (a field not listed here is checked with its default)
SAMPLES: dict[str, Any] = {
    "status": Status.FAILED, "metrics": {"decode_tok_s": 91.5, "itl_ms_p99": math.nan},
    "failure_class": "server_crash", "failure_kind": "transient", "failure_signature": "Segfault at <addr>",
    "phase": "bench", "exit_code": -11, "perf_tags": ["unstable"], "log_tail": "tail\n",
    "server_log": "whole log\n", "launch_command": "python -m sglang.launch_server --tp 8",
    "bench": [{"e2e_s": 1.5}], "timings": Timings(startup_s=12.0, warmup_s=0.5, bench_s=30.0, gpu_s=340.0, wall_s=42.5),
    "fingerprint": {"gpu": "RTX PRO 6000", "cuda": "12.9"}, "node": "node-3", "gpu_ids": [4, 5, 6, 7],
    "attempts": 2, "duplicate_of": 7, "skipped_by_rule": "12", "violated_constraints": ["tp*dp <= gpus"],
}
#: the fields the study does not keep (written to the trial's files instead)
FILES_ONLY = {"server_log", "bench"}


def _one_trial_study() -> tuple[optuna.Study, optuna.Trial]:
    study = optuna.create_study()
    trial = study.ask()
    trial.suggest_categorical("allreduce", ["nccl", "custom"])
    return study, trial


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        return math.isnan(b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return bool(a == b)


def test_every_outcome_field_goes_node_to_study_to_records():
    assert set(SAMPLES) <= set(Outcome.model_fields)  # a field without a sample goes with its default
    node = Outcome(**SAMPLES)
    study, trial = _one_trial_study()
    write_outcome(trial, node, "t0")
    study.tell(trial, state=TrialState.PRUNED)
    stored = study.trials[0].user_attrs[records.A_RECORD]
    assert set(stored) == set(Outcome.model_fields) - FILES_ONLY
    json.dumps(stored)  # JSON-able as stored (an RDB study JSON-encodes it)
    rec = records.load_records(study)[0]
    for name in Outcome.model_fields:
        want = Outcome.model_fields[name].get_default(call_default_factory=True) if name in FILES_ONLY \
            else getattr(node, name)
        assert _same(getattr(rec, name), want), name
    assert isinstance(rec, Outcome) and (rec.number, rec.params) == (0, trial.params)
    assert study.trials[0].user_attrs[records.A_STATUS] == "failed"  # the derived attribute


def test_the_node_result_is_the_outcome_and_its_timings_read_both_ways():
    res = TrialResult(status="ok")
    assert type(res) is Outcome and res.timings() == {k: 0.0 for k in Timings.model_fields}
    res.startup_s = 3.0
    res.gpu_s += 8.0
    assert res.timings.startup_s == 3.0 and res.timings["gpu_s"] == 8.0 and res.gpu_s == 8.0
    rec = records.TrialRecord(1, "COMPLETE", {}, "skipped", timings={"gpu_s": 0.0})
    assert rec.timings.as_dict() == {"gpu_s": 0.0} and rec.timings.get("wall_s", -1.0) == -1.0
    with pytest.raises(KeyError):
        rec.timings["wall_s"]  # not measured


def test_status_is_one_enum_and_a_wrong_one_is_refused_by_name():
    assert {s.value for s in Status} >= {"ok", "failed", "infra_error", "skipped", "interrupted", "infeasible"}
    study, trial = _one_trial_study()
    out = write_outcome(trial, {records.A_STATUS: "infeasible", records.A_VIOLATED: ["a <= b"]}, "t0")
    assert out.status is Status.INFEASIBLE and out.timings.as_dict() == {}  # a gate measured nothing
    assert records.record_from_trial(study.trials[0]).violated_constraints == ["a <= b"]
    with pytest.raises(ValidationError, match="status"):
        Outcome(status="fine")


def test_a_trial_without_an_outcome_shows_its_optuna_state():
    study, trial = _one_trial_study()
    assert records.record_from_trial(study.trials[0]).status is Status.RUNNING
    study.enqueue_trial({"allreduce": "nccl"})
    assert records.load_records(study)[1].status == "waiting"


def _rebuild(trials: list[dict[str, Any]], per_fact: bool) -> optuna.Study:
    """An in-memory study of the stored trials; ``per_fact`` spreads each ``record`` over one
    attribute per fact and drops it (the shape studies had before the record existed)."""
    study = optuna.create_study()
    for t in trials:
        attrs = dict(t["user_attrs"])
        if per_fact:
            attrs.update(attrs.pop(records.A_RECORD, {}))
        dists = {k: optuna.distributions.json_to_distribution(d) for k, d in t["distributions"].items()}
        study.add_trial(create_trial(state=TrialState[t["state"]], params=t["params"], distributions=dists,
                                     user_attrs=attrs, values=t["values"] if t["state"] == "COMPLETE" else None))
    return study


@pytest.mark.parametrize("per_fact", [False, True], ids=["record-attribute", "one-attribute-per-fact"])
def test_studies_written_in_the_earlier_shapes_read_back_as_they_did(per_fact):
    old = json.loads(OLD_STUDY.read_text())["trials"]
    assert {t["old_record"]["status"] for t in old} >= {"ok", "skipped"}  # the fixture covers more than ok
    for t, rec in zip(old, records.load_records(_rebuild(old, per_fact)), strict=True):
        want = dict(t["old_record"])
        want["violated_constraints"] = want.pop("violated")
        got = json.loads(json.dumps(rec.model_dump(exclude={"datetime_start", "datetime_complete"}), default=str))
        got["timings"] = rec.timings.as_dict()
        assert {k: got[k] for k in want} == want, t["number"]


PATCH = '''
import importlib.util, sys
spec = importlib.util.find_spec("tasks.outcome")
src = open(spec.origin).read()
anchor = "    violated_constraints: list[str] = Field(default_factory=list)\\n"
assert src.count(anchor) == 1
src = src.replace(anchor, anchor + "    gpu_temp_c_max: float | None = None\\n")  # THE one edit
mod = importlib.util.module_from_spec(spec)
sys.modules["tasks.outcome"] = mod
exec(compile(src, spec.origin, "exec"), mod.__dict__)

import optuna
from sweeps.store import records
from sweeps.store.record_io import write_outcome
from tasks.types import TrialResult

res = TrialResult(status="ok", metrics={"decode_tok_s": 90.0}, gpu_temp_c_max=71.5)  # the node sets it
study = optuna.create_study()
t = study.ask()
write_outcome(t, res, "t0")
study.tell(t, 90.0)
rec = records.load_records(study)[0]
print(rec.gpu_temp_c_max, study.trials[0].user_attrs["record"]["gpu_temp_c_max"], res.to_dict()["gpu_temp_c_max"])
'''


def test_a_new_field_is_one_edit():
    """Adding one line to ``Outcome`` (in a subprocess, on the real module's source) is all a
    new fact needs to reach the study and come back in the records and the trial's result.json."""
    out = subprocess.run([sys.executable, "-c", PATCH], cwd=str(ROOT), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["71.5", "71.5", "71.5"]


def test_an_interrupted_trial_names_its_signal_and_a_phase_it_reached():
    from tasks.outcome import interrupted

    o = interrupted("unknown", "SIGTERM")  # a task that reported no phase of its own
    assert (o.status, o.phase, o.failure_signature) == ("interrupted", "startup", "sweep interrupted (SIGTERM)")
    assert interrupted("bench").phase == "bench" and interrupted().failure_signature == "sweep interrupted (SIGINT)"
