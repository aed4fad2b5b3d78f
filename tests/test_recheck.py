"""Recheck sweep: rules learned under fingerprint A, the emulated node switched to a stack where
SM120 gains FlashInfer allreduce fusion (fingerprint B); the recheck reports that dead end
fixed and the others still failing.

The fast tests run the driver's loop in process (``sweeps.app.inprocess.InProcessDriver``: the
real Driver code with Ray replaced by an inline executor, instant backend); the slow one
runs ``python run_sweep.py sweep=recheck source=...`` end to end (Ray, MLflow)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import optuna
import pytest

from sweeps.app.inprocess import InProcessDriver, run_in_process
from sweeps.app.recheck import (
    FIXED,
    NEWLY_FAILING,
    NOT_RERUN,
    STILL_DEGRADED,
    STILL_FAILING,
    STILL_OK,
    RecheckDriver,
    collect_dead_ends,
    recheck,
    recheck_study_name,
)
from sweeps.config.spec import load_spec
from sweeps.rules.store import RuleStore, fingerprint_hash
from tests.conftest import REPO, compose_cfg

# The campaign sweep's seeds cover every allreduce level, NCCL algo and MoE A2A backend:
# 12 launches find the four deterministic dead ends and the degraded custom-AR level.
SOURCE = ["backend=instant", "sweep=eagle3_allreduce", "sweep.budget.trials=12", "sweep.budget.wall_time_s=null"]
# Fingerprint B: FlashInfer 0.6 with an SM120 JIT target for the allreduce fusion kernel.
FP_B = ["+backend.emulator.capabilities.flashinfer_fusion_supported_majors=[9,10,12]",
        "+backend.emulator.fingerprint.flashinfer=0.6.0"]
DEAD_CLASSES = {"flashinfer_allreduce_fusion_unsupported_arch", "torch_symm_mem_unsupported",
                "nccl_env_algo_proto_invalid", "moe_ep_a2a_config_error"}


class _InProcessRecheck(RecheckDriver, InProcessDriver):
    """The recheck driver with the in-process executor (no Ray)."""


def _spec(store: Path, extra: list[str]):
    return load_spec(compose_cfg([*extra, f"tracking.store_dir={store}", f"tracking.findings_dir={store / 'findings'}"]))


def fast_dir(tmp_path_factory, name: str):
    """A scratch dir on tmpfs when there is one (SQLite commits there cost no fsync: ~10x faster)."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        return Path(tempfile.mkdtemp(prefix=f"servesweep-{name}-", dir=shm))
    return tmp_path_factory.mktemp(name)


@pytest.fixture(scope="module")
def source_store(tmp_path_factory):
    root = fast_dir(tmp_path_factory, "recheck")
    store = root / "store"
    drv = run_in_process(_spec(store, SOURCE))
    yield store, drv
    shutil.rmtree(root, ignore_errors=True)


def test_source_sweep_learned_one_rule_per_dead_end(source_store):
    store, drv = source_store
    rules = RuleStore(f"sqlite:///{store / 'servesweep.db'}").list()
    assert {r.failure_class for r in rules} == DEAD_CLASSES
    assert len({fingerprint_hash(r.fingerprint) for r in rules}) == 1
    ends = collect_dead_ends(drv.study, RuleStore(f"sqlite:///{store / 'servesweep.db'}"))
    kinds = [(d.kind, d.failure_class) for d in ends]
    assert sorted(c for k, c in kinds if k == "rule") == sorted(DEAD_CLASSES)
    assert ("degraded", "allreduce_path_degraded") in kinds
    assert [d.label for d in ends if d.kind == "canary"][:1] == ["baseline"]


def test_recheck_on_new_fingerprint_reports_fusion_fixed(source_store):
    store, _ = source_store
    spec = load_spec(compose_cfg([*SOURCE[:2], *FP_B, "sweep=recheck", "source=eagle3_allreduce",
                                  f"tracking.store_dir={store}", f"tracking.findings_dir={store / 'findings'}"]))
    drv = recheck(spec, _InProcessRecheck)
    fp_b = drv.fingerprint
    assert fp_b["flashinfer"] == "0.6.0"
    assert drv.study_name == recheck_study_name("eagle3_allreduce", fp_b)
    assert drv.study_name.startswith("eagle3_allreduce-recheck-") and len(drv.study_name.split("-")[-1]) == 8
    by_class = {o.dead_end.failure_class: o for o in drv.outcomes() if o.dead_end.kind != "canary"}
    assert by_class["flashinfer_allreduce_fusion_unsupported_arch"].outcome == FIXED
    assert by_class["flashinfer_allreduce_fusion_unsupported_arch"].value > 0
    for cls in DEAD_CLASSES - {"flashinfer_allreduce_fusion_unsupported_arch"}:
        assert by_class[cls].outcome == STILL_FAILING, (cls, by_class[cls])
    assert by_class["allreduce_path_degraded"].outcome == STILL_DEGRADED  # custom AR is still off on PCIe
    canaries = [o for o in drv.outcomes() if o.dead_end.kind == "canary"]
    assert canaries and all(o.outcome == STILL_OK for o in canaries)
    # each dead end re-run exactly once, every launch a new trial of the recheck study
    launched = [t for t in drv.study.trials if t.user_attrs.get("status") in ("ok", "failed")]
    assert len(launched) == len(drv.outcomes())
    # the still-failing ones are now rules of fingerprint B too; old rules untouched
    rules = RuleStore(f"sqlite:///{store / 'servesweep.db'}")
    b_rules = rules.rules_for_fingerprint(fp_b)
    assert {r.failure_class for r in b_rules} == DEAD_CLASSES - {"flashinfer_allreduce_fusion_unsupported_arch"}
    report = (store / "findings" / f"{drv.study_name}.md").read_text()
    assert "| fixed |" in report and "flashinfer_allreduce_fusion_unsupported_arch" in report
    # the baseline canary's new run is the recheck's baseline: the summary the console and the
    # MLflow parent print measures against it, as the report does
    from sweeps.publish.summary import summary_of_study

    canary = next(o for o in canaries if o.dead_end.label == "baseline")
    summ = summary_of_study(spec, drv.study)
    assert canary.value and summ.baseline.value == pytest.approx(canary.value)
    assert summ.baseline.trial == canary.trial
    assert summ.parent_metrics()[f"baseline_{spec.objective_set.primary.name}"] == pytest.approx(canary.value)
    console = (store / "reports" / drv.study_name / "summary.txt").read_text()
    assert "baseline: not measured" not in console and summ.baseline_text() in console
    assert summ.baseline_text() in summ.markdown()
    # resuming the same recheck launches nothing new
    again = recheck(spec, _InProcessRecheck)
    assert again.launched == drv.launched
    assert len(again.study.trials) == len(drv.study.trials)


def test_recheck_on_same_fingerprint_reruns_nothing(source_store):
    store, _ = source_store
    spec = load_spec(compose_cfg([*SOURCE[:2], "sweep=recheck", "source=eagle3_allreduce",
                                  f"tracking.store_dir={store}", f"tracking.findings_dir={store / 'findings'}"]))
    drv = recheck(spec, _InProcessRecheck)
    assert drv.launched == 0
    assert {o.outcome for o in drv.outcomes()} == {NOT_RERUN}


def test_recheck_reports_a_regression_as_newly_failing(tmp_path_factory):
    store = fast_dir(tmp_path_factory, "regress") / "store"
    run_in_process(_spec(store, [*SOURCE[:2], "sweep.budget.trials=3", "sweep.budget.wall_time_s=null"]))
    # the "new node" has 40 GiB per GPU: the baseline (which ran before) no longer fits
    spec = load_spec(compose_cfg([*SOURCE[:2], "sweep=recheck", "source=eagle3_allreduce",
                                  "+backend.emulator.fingerprint.cuda=13.1",
                                  "node.memory_gib=40",
                                  f"tracking.store_dir={store}", f"tracking.findings_dir={store / 'findings'}"]))
    drv = recheck(spec, _InProcessRecheck)
    base = [o for o in drv.outcomes() if o.dead_end.kind == "canary" and o.dead_end.label == "baseline"]
    assert base and base[0].outcome == NEWLY_FAILING, drv.outcomes()


def test_unknown_source_is_a_clear_error(tmp_path):
    spec = load_spec(compose_cfg(["backend=instant", "sweep=recheck", "source=nope",
                                  f"tracking.store_dir={tmp_path}", f"tracking.findings_dir={tmp_path / 'f'}"]))
    from sweeps.app.driver import SweepError

    with pytest.raises(SweepError, match="source='nope': no such study"):
        recheck(spec, _InProcessRecheck)


@pytest.mark.slow
def test_cli_recheck_end_to_end(source_store):
    """``run_sweep.py sweep=recheck source=...`` through Ray and MLflow on fingerprint B."""
    store, _ = source_store
    cmd = [sys.executable, str(REPO / "run_sweep.py"), "backend=instant", "sweep=recheck", "source=eagle3_allreduce",
           *FP_B, f"tracking.store_dir={store}", f"tracking.findings_dir={store / 'findings'}",
           "study_name=cli-recheck"]
    r = subprocess.run(cmd, cwd=str(store.parent), capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "| fixed |" in r.stdout and "still failing" in r.stdout
    study = optuna.load_study(study_name="cli-recheck", storage=f"sqlite:///{store / 'optuna.db'}")
    assert study.user_attrs["recheck_source"] == "eagle3_allreduce"
    from mlflow.tracking import MlflowClient

    c = MlflowClient(tracking_uri=f"sqlite:///{store / 'mlflow.db'}")
    exp = c.get_experiment_by_name("recheck")
    runs = c.search_runs([exp.experiment_id], max_results=100)
    parent = [x for x in runs if x.data.tags.get("servesweep.role") == "study"]
    assert parent and parent[0].data.tags.get("recheck.fixed") == "1"
    assert any(x.data.tags.get("failure_class") == "torch_symm_mem_unsupported" for x in runs)
    arts = {a.path for a in c.list_artifacts(parent[0].info.run_id)}
    assert "cli-recheck.md" in arts
