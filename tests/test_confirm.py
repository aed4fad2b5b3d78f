"""Winner confirmation: a lucky single measurement does not win, a config whose greedy
output differs from the baseline's is flagged and cannot win, intervals are Student-t.

The statistics and verdicts run against a stand-in driver whose "Ray task" evaluates a
known distribution; one slow test re-launches real emulated servers with the
``corrupt_tokens`` fault through a real driver (subprocess: one ray.init per process)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import textwrap

import optuna
import pytest
from scipy import stats

from sweeps import confirm as C
from sweeps import records as R
from sweeps.config import load_spec
from tasks.types import TrialResult
from tests.conftest import REPO, compose_cfg


def test_t_interval_matches_scipy():
    vals = [88.0, 89.5, 90.1, 87.9, 89.0]
    mean, lo, hi = C.t_interval(vals, 0.95)
    ref = stats.t.interval(0.95, len(vals) - 1, loc=stats.tmean(vals), scale=stats.sem(vals))
    assert mean == pytest.approx(sum(vals) / 5)
    assert (lo, hi) == pytest.approx(ref)
    assert C.t_interval([1.0], 0.95)[1] != C.t_interval([1.0], 0.95)[1]  # NaN bound for one value


def test_compare_tokens():
    base = [[[1, 2, 3], [4, 5, 6]]]
    assert C.compare_tokens(base, [[[1, 2, 3], [4, 5, 6]]]) == (True, "")
    ok, detail = C.compare_tokens(base, [[[1, 2, 3], [4, 9, 6]]])
    assert ok is False and "prompt 1" in detail and "token 1" in detail
    assert C.compare_tokens([[[]]], [[[1]]])[0] is None


class _Ref:
    def __init__(self, value):
        self.value = value


class _FakeRay:
    def wait(self, refs, num_returns=1, timeout=None):
        return refs[:num_returns], refs[num_returns:]

    def get(self, ref):
        return ref.value

    def cancel(self, ref):
        pass


class _Task:
    """Stands in for the Ray trial task: tok/s ~ N(true mean, 1.5 %), token ids from the
    prompt index, corrupted when the env asks the emulator to."""

    def __init__(self, true: dict[str, float]):
        self.true = true
        self.calls: list[tuple] = []

    def remote(self, spec, profile, workdir):
        self.calls.append((spec.trial_number, dict(spec.env), profile["emulator"]["seed"] if profile else None))
        rng = random.Random(spec.trial_number)
        mu = self.true[R.config_key(spec.params)]
        val = mu * (1 + 0.015 * rng.gauss(0, 1))
        bad = spec.env.get("SERVESWEEP_EMULATOR_FAULT") == "corrupt_tokens"
        bench = [{"output_ids": [(i * 7 + j + (1 if bad and j else 0)) % 100 for j in range(8)]} for i in range(2)]
        return _Ref(TrialResult(status="ok", metrics={"decode_tok_s": val}, bench=bench))


class _Driver:
    def __init__(self, tmp_path, study, true):
        self.spec = load_spec(compose_cfg(["sweep=smoke", f"tracking.store_dir={tmp_path}"]))
        self.study, self.study_name = study, study.study_name
        self.profile = {"emulator": {"seed": 0}}
        self.backend = self.spec.backend.model_dump()
        self._trial_task = _Task(true)
        self.ray = _FakeRay()
        self.max_inflight = 2
        self.interrupted = False


def _study(trials):
    study = optuna.create_study(direction="maximize", study_name="s")
    dist = {"speculative": optuna.distributions.CategoricalDistribution(["none"]),
            "allreduce": optuna.distributions.CategoricalDistribution(["nccl", "custom", "flashinfer_fusion"]),
            "cuda_graph_max_bs": optuna.distributions.CategoricalDistribution([64, 128, 512])}
    for params, value, base in trials:
        t = optuna.trial.create_trial(params=params, distributions=dist, value=value,
                                      user_attrs={"status": "ok", "metrics": {"decode_tok_s": value}, "is_baseline": base})
        study.add_trial(t)
    return study


def test_lucky_config_does_not_win_and_mismatch_is_flagged(tmp_path):
    base = {"speculative": "none", "allreduce": "nccl", "cuda_graph_max_bs": 512}
    lucky = {"speculative": "none", "allreduce": "nccl", "cuda_graph_max_bs": 64}   # measured 91, truly 84
    steady = {"speculative": "none", "allreduce": "nccl", "cuda_graph_max_bs": 128}  # measured 89.5, truly 89.5
    fast_wrong = {"speculative": "none", "allreduce": "custom", "cuda_graph_max_bs": 128}  # fastest, bad tokens
    study = _study([(base, 82.0, True), (lucky, 91.0, False), (steady, 89.5, False), (fast_wrong, 95.0, False)])
    truth = {R.config_key(base): 82.0, R.config_key(lucky): 84.0, R.config_key(steady): 89.5,
             R.config_key(fast_wrong): 95.0}
    drv = _Driver(tmp_path, study, truth)
    out = C.confirm_top(drv, k=3, repeats=5,
                        extra_env={R.config_key(fast_wrong): {"SERVESWEEP_EMULATOR_FAULT": "corrupt_tokens"}})
    by = {e["trial"]: e for e in out["entries"]}
    assert set(by) == {0, 1, 2, 3} and all(e["n"] == 5 for e in by.values())
    assert out["winner"] == 2, out["winner_note"]  # the steady config, not the lucky or the wrong one
    assert by[3]["tokens_match"] is False and by[3]["verdict"].startswith("output_mismatch")
    assert by[2]["tokens_match"] is True
    assert by[1]["mean"] == pytest.approx(84.0, rel=0.02) and by[1]["ci_high"] < by[2]["ci_low"]
    assert by[2]["speedup_mean"] == pytest.approx(by[2]["mean"] / by[0]["mean"])
    assert by[2]["speedup_ci"][0] < by[2]["speedup_mean"] < by[2]["speedup_ci"][1]
    assert by[2]["speedup_ci"][0] > 1.0  # distinguishable from the baseline
    assert "did not hold up" in out["winner_note"]
    # fresh launches: distinct noise seeds per repeat, the sweep's own value is not reused
    seeds = [s for _, _, s in drv._trial_task.calls]
    assert len(seeds) == 20 and len(set(seeds)) == 20
    # stored for findings/report; the flagged trial carries output_mismatch
    assert study.user_attrs[C.ATTR]["winner"] == 2
    assert C.mismatched_trials(study.user_attrs[C.ATTR]) == {3}
    # a second call with the same candidates reuses the stored confirmation
    drv._trial_task.calls.clear()
    assert C.confirm_top(drv, k=3, repeats=5)["winner"] == 2 and not drv._trial_task.calls


def test_findings_show_the_confirmation(tmp_path):
    from sweeps.findings import update_findings

    base = {"speculative": "none", "allreduce": "nccl", "cuda_graph_max_bs": 512}
    other = {"speculative": "none", "allreduce": "custom", "cuda_graph_max_bs": 128}
    study = _study([(base, 82.0, True), (other, 95.0, False)])
    drv = _Driver(tmp_path, study, {R.config_key(base): 82.0, R.config_key(other): 95.0})
    out = C.confirm_top(drv, k=1, repeats=3, extra_env={R.config_key(other): {"SERVESWEEP_EMULATOR_FAULT": "corrupt_tokens"}})
    assert out["winner"] == 0  # only the baseline is left
    doc = update_findings(drv.spec, "s", R.load_records(study), {}, None, confirmation=out, path=tmp_path / "f.md")
    text = doc.read_text()
    assert "### Confirmation" in text and "**differ**" in text and "t1 changes the output** (output_mismatch)" in text
    base_mean = next(e["mean"] for e in out["entries"] if e["trial"] == 0)
    # the mismatching faster config is not declared best; the winner is quoted at its confirmed mean
    assert f"**t0: {base_mean:.1f} tok/s**" in text and "single measurement of t0 was 82.0 tok/s" in text


@pytest.mark.slow
def test_corrupt_tokens_on_real_emulated_servers(tmp_path):
    """A real sweep on the emulated node, then confirm_top through a real Driver + Ray with
    the best config's server corrupting its output: it is flagged and cannot win."""
    store = tmp_path / "store"
    fast = ["sweep=smoke", "backend.emulator.time_scale=0.002", "bench.output_len=16", "bench.repeats=2",
            "bench.warmup_output_len=4", "sweep.budget.trials=4", "sweep.confirm.top_k=0", "ray.num_gpus=24",
            "sweep.seed_trials=[{speculative:none,allreduce:nccl,cuda_graph_max_bs:64}]",
            f"tracking.store_dir={store}", f"tracking.findings_dir={tmp_path / 'findings'}"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    r = subprocess.run([sys.executable, str(REPO / "run_sweep.py"), *fast], capture_output=True, text=True,
                       timeout=300, env=env, cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    script = textwrap.dedent(f"""
        import json, sys
        from tests.conftest import compose_cfg
        from sweeps.config import load_spec
        from sweeps.driver import Driver
        from sweeps import records as R
        from sweeps.confirm import confirm_top, candidates
        spec = load_spec(compose_cfg({fast!r}))
        d = Driver(spec); d.setup()
        top, base = candidates(R.load_records(d.study), 2)
        victim = next(r for r in top if not r.is_baseline)
        out = confirm_top(d, k=2, repeats=2, force=True,
                          extra_env={{R.config_key(victim.params): {{"SERVESWEEP_EMULATOR_FAULT": "corrupt_tokens"}}}})
        print(json.dumps({{"victim": victim.number, "out": out}}, default=str))
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env,
                       cwd=str(REPO))
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    by = {e["trial"]: e for e in res["out"]["entries"]}
    victim = by[res["victim"]]
    assert victim["tokens_match"] is False and "first difference at output token 1" in victim["mismatch_detail"]
    assert res["out"]["winner"] != res["victim"]
    others = [e for e in by.values() if e["trial"] != res["victim"] and not e["is_baseline"]]
    assert all(e["tokens_match"] is True for e in others)  # real greedy ids from the emulator matched
