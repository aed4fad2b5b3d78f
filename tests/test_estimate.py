"""Pre-launch GPU-hour estimate (sweeps.app.estimate, tasks.emulator.instant.estimate_sweep)."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import optuna
import pytest

from sweeps.app.estimate import estimate_gpu_hours, sample_feasible
from sweeps.config.spec import load_spec
from tasks.emulator.instant import estimate_sweep, simulate
from tasks.emulator.profile import default_profile
from tasks.emulator.testing import EAGLE_FLAGS, baseline_flags
from tasks.types import BenchSpec
from tests.conftest import REPO, compose_cfg

PROFILE = default_profile({"noise": 0.0})
FUSION = ["--model-path", "m", "--tp-size", "8", "--disable-custom-all-reduce", "--enable-flashinfer-allreduce-fusion"]


def _spec(*overrides: str):
    return load_spec(compose_cfg(list(overrides)))


def test_estimate_sweep_prices_each_config():
    configs = [(baseline_flags(128), {}), (baseline_flags(128, *EAGLE_FLAGS), {}), (FUSION, {})]
    est = estimate_sweep(PROFILE, configs, BenchSpec(), seed=3)
    assert est["n"] == 3
    for i, (a, e) in enumerate(configs):
        assert est["gpu_s"][i] == pytest.approx(simulate(PROFILE, a, e, BenchSpec(), 3 + i)["gpu_s"])
    assert est["failure_class"] == [None, None, "flashinfer_allreduce_fusion_unsupported_arch"]
    assert est["failed_fraction"] == pytest.approx(1 / 3)
    assert est["gpu_s"][2] < est["gpu_s"][0]  # a startup failure costs less than a served trial
    # 8 GPUs x (~183-197 s startup + bench + 3 s teardown)
    assert 8 * 150 < est["mean_gpu_s_ok"] < 8 * 300
    assert est["total_gpu_hours"] == pytest.approx(sum(est["gpu_s"]) / 3600)
    assert estimate_sweep(PROFILE, [], BenchSpec())["mean_gpu_s"] == 0.0


def test_estimate_is_linear_in_the_trial_budget_and_names_itself():
    h = {t: estimate_gpu_hours(_spec(f"sweep.budget.trials={t}"))[0] for t in (30, 60, 90)}
    per_trial = (h[60] - h[30]) / 30
    assert per_trial == pytest.approx((h[90] - h[60]) / 30, rel=1e-9)
    assert 8 * 150 / 3600 < per_trial < 8 * 300 / 3600  # one launched trial: 8 GPUs x 2.5-5 min
    hours, msg = estimate_gpu_hours(_spec())
    assert hours == pytest.approx(h[30]) and "\n" not in msg
    assert f"{hours:.1f} GPU-hours" in msg and "rtx_pro_6000x8" in msg and "30 trials" in msg


def test_estimate_parts_add_up_to_the_total_as_printed():
    import re

    hours, msg = estimate_gpu_hours(_spec())
    m = re.search(r"~ ([\d.]+) GPU-hours.*: \d+ seed trials ([\d.]+) GPU-h \+ \d+ x [\d.]+ = ([\d.]+) GPU-h", msg)
    assert m, msg
    total, seeds, rest = (float(x) for x in m.groups())
    assert abs(seeds + rest - total) <= 0.1 + 1e-9  # each part rounded to 0.1 once


def test_estimate_prices_the_confirmation_and_serving_check_after_the_trials():
    import re

    hours, msg = estimate_gpu_hours(_spec("sweep.confirm.top_k=3", "sweep.confirm.repeats=3",
                                          "sweep.confirm.max_repeats=8", "sweep.confirm.descend=0"))
    m = re.search(r"the confirmation (\d+)-(\d+) launches .* and the serving check 2, each ~([\d.]+) GPU-h: "
                  r"~([\d.]+)-([\d.]+) GPU-hours in all", msg)
    assert m, msg
    lo, hi, per, t_lo, t_hi = (float(x) for x in m.groups())
    assert (lo, hi) == (4 * 3, (3 + 1 + 2) * 8)  # top_k and the baseline x repeats; + 2 simplifications, to the cap
    assert t_lo == pytest.approx(hours + (lo + 2) * per, abs=0.2) and t_hi > t_lo
    _, off = estimate_gpu_hours(_spec("sweep.confirm.top_k=0", "sweep.serving_check=false"))
    assert "after the trials" not in off


def test_estimate_is_real_node_cost_whatever_the_backend():
    base = estimate_gpu_hours(_spec())[0]
    assert estimate_gpu_hours(_spec("backend.emulator.time_scale=0.002"))[0] == pytest.approx(base)
    assert estimate_gpu_hours(_spec("backend=sglang"))[0] == pytest.approx(base)
    assert estimate_gpu_hours(_spec("backend=instant"))[0] == pytest.approx(base)


def test_gpu_hour_budget_caps_the_estimate():
    hours, msg = estimate_gpu_hours(_spec("sweep.budget.gpu_hours=2.5"))
    assert hours == 2.5 and "capped by budget.gpu_hours" in msg


def test_rule_skips_are_not_priced():
    """Known dead ends after the seeds cost nothing: a sweep whose seeds hit every failure
    class costs about trials x a served trial, not trials x the space's mean."""
    hours, _ = estimate_gpu_hours(_spec("sweep.budget.trials=60"))
    space_mean = estimate_sweep(PROFILE, [(FUSION, {})] * 2 + [(baseline_flags(128), {})], BenchSpec())
    served = space_mean["mean_gpu_s_ok"] / 3600
    assert hours > 0.8 * 60 * served  # the space mean (90 % cheap failures) would give ~0.6x


def test_unavailable_without_emulator_constants():
    hours, msg = estimate_gpu_hours(_spec("~model.emulator"))
    assert math.isnan(hours) and msg.startswith("GPU-hour estimate unavailable") and "model.emulator" in msg


def test_sample_feasible_respects_constraints_and_conditions():
    space = _spec().space
    cfgs = sample_feasible(space, 200, seed=1)
    assert len(cfgs) == 200 and all(not space.violated(c) for c in cfgs)
    assert all(("eagle_topk" in c) == (c["speculative"] == "eagle3") for c in cfgs)
    assert cfgs == sample_feasible(space, 200, seed=1)


@pytest.mark.slow
def test_estimate_matches_an_instant_sweep(tmp_path):
    """The estimate vs what the same sweep on backend=instant actually books (real-speed GPU-s)."""
    store = tmp_path / "store"
    over = ["backend=instant", "sweep=smoke", f"tracking.store_dir={store}", f"tracking.findings_dir={tmp_path / 'f'}"]
    est, _ = estimate_gpu_hours(load_spec(compose_cfg(over)))
    # RAY_ADDRESS=local: start our own Ray even when other Ray instances run on this machine
    # (ray.init without an address joins the latest one it finds, then refuses num_gpus).
    env = {**os.environ, "RAY_ADDRESS": "local"}
    r = subprocess.run([sys.executable, str(REPO / "run_sweep.py"), *over], cwd=str(tmp_path), capture_output=True,
                       text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    from sweeps.store.records import load_records

    study = optuna.load_study(study_name="smoke", storage=f"sqlite:///{store / 'optuna.db'}")
    actual = sum(x.timings.get("gpu_s", 0.0) for x in load_records(study)) / 3600
    assert actual > 0 and est == pytest.approx(actual, rel=0.2)


def test_a_recheck_is_priced_at_its_own_launches(tmp_path):
    """A recheck launches the source's dead ends and canaries, not ``budget.max_asks`` trials
    (8 launches once read ~456 GPU-hours): its estimate is priced at the launches it will make."""
    from sweeps.app.inprocess import run_in_process
    from sweeps.app.recheck import planned_launches

    store = [f"tracking.store_dir={tmp_path}", f"tracking.findings_dir={tmp_path / 'findings'}"]
    run_in_process(_spec("backend=instant", "sweep=smoke", "sweep.budget.trials=4", *store))
    same = _spec("backend=instant", "sweep=recheck", "source=smoke", *store)
    assert planned_launches(same) == 0  # everything was learned on this very fingerprint: nothing re-runs
    re = _spec("backend=instant", "sweep=recheck", "source=smoke", "+backend.emulator.fingerprint.flashinfer=0.6.0",
               *store)
    n = planned_launches(re)
    assert n is not None and 1 <= n < 10
    hours, msg = estimate_gpu_hours(re, launches=n)
    assert f"{n} launches" in msg and "dead ends and canaries" in msg
    unbounded = estimate_gpu_hours(re)[0]  # no trial budget: max_asks, the old figure
    assert hours < unbounded / 10
    assert planned_launches(_spec("backend=instant", "sweep=recheck", "source=nosuch", *store)) is None
