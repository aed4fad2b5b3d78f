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

from sweeps.config.spec import load_spec
from sweeps.run.executor import RayExecutor
from sweeps.search import confirm
from sweeps.store import records
from tasks.types import TrialResult
from tests.conftest import REPO, compose_cfg


def test_t_interval_matches_scipy():
    vals = [88.0, 89.5, 90.1, 87.9, 89.0]
    mean, lo, hi = confirm.t_interval(vals, 0.95)
    ref = stats.t.interval(0.95, len(vals) - 1, loc=stats.tmean(vals), scale=stats.sem(vals))
    assert mean == pytest.approx(sum(vals) / 5)
    assert (lo, hi) == pytest.approx(ref)
    assert confirm.t_interval([1.0], 0.95)[1] != confirm.t_interval([1.0], 0.95)[1]  # NaN bound for one value


def test_compare_tokens():
    base = [[[1, 2, 3], [4, 5, 6]]]
    assert confirm.compare_tokens(base, [[[1, 2, 3], [4, 5, 6]]]) == (True, "")
    ok, detail = confirm.compare_tokens(base, [[[1, 2, 3], [4, 9, 6]]])
    assert ok is False and "prompt 1" in detail and "token 1" in detail
    assert confirm.compare_tokens([[[]]], [[[1]]])[0] is None


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
        mu = self.true[records.config_key(spec.params)]
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
        # the sweep's executor: Ray tasks over the stand-ins, two in flight
        self.executor = RayExecutor(_FakeRay(), self._trial_task, None, str(tmp_path / "work"), 2)
        self.interrupted = False


#: the three configs most of these races are run on: the baseline, a graph-size change, an all-reduce change
BASE = {"speculative": "none", "allreduce": "nccl", "cuda_graph_max_bs": 512}
G64 = {"speculative": "none", "allreduce": "nccl", "cuda_graph_max_bs": 64}
CUSTOM128 = {"speculative": "none", "allreduce": "custom", "cuda_graph_max_bs": 128}


def _with_task(drv, task, tmp_path):
    """``drv`` launching through ``task`` (a stand-in Ray task) with the executor it uses."""
    drv._trial_task = task
    drv.executor = RayExecutor(_FakeRay(), task, None, str(tmp_path / "work"), 2)
    return drv


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
    base = BASE
    lucky = {"speculative": "none", "allreduce": "nccl", "cuda_graph_max_bs": 64}   # measured 91, truly 84
    steady = {"speculative": "none", "allreduce": "nccl", "cuda_graph_max_bs": 128}  # measured 89.5, truly 89.5
    fast_wrong = {"speculative": "none", "allreduce": "custom", "cuda_graph_max_bs": 128}  # fastest, bad tokens
    study = _study([(base, 82.0, True), (lucky, 91.0, False), (steady, 89.5, False), (fast_wrong, 95.0, False)])
    truth = {records.config_key(base): 82.0, records.config_key(lucky): 84.0, records.config_key(steady): 89.5,
             records.config_key(fast_wrong): 95.0}
    drv = _Driver(tmp_path, study, truth)
    out = confirm.confirm_top(drv, k=3, repeats=5,
                        extra_env={records.config_key(fast_wrong): {"SERVESWEEP_EMULATOR_FAULT": "corrupt_tokens"}})
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
    assert study.user_attrs[confirm.ATTR]["winner"] == 2
    assert confirm.mismatched_trials(study.user_attrs[confirm.ATTR]) == {3}
    # a second call with the same candidates reuses the stored confirmation
    drv._trial_task.calls.clear()
    assert confirm.confirm_top(drv, k=3, repeats=5)["winner"] == 2 and not drv._trial_task.calls


def test_findings_show_the_confirmation(tmp_path):
    from sweeps.publish.findings import update_findings

    base = BASE
    other = CUSTOM128
    study = _study([(base, 82.0, True), (other, 95.0, False)])
    drv = _Driver(tmp_path, study, {records.config_key(base): 82.0, records.config_key(other): 95.0})
    out = confirm.confirm_top(drv, k=1, repeats=3,
                              extra_env={records.config_key(other): {"SERVESWEEP_EMULATOR_FAULT": "corrupt_tokens"}})
    assert out["winner"] == 0  # only the baseline is left
    doc = update_findings(drv.spec, "s", records.load_records(study), {}, None, confirmation=out, path=tmp_path / "f.md")
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
        from sweeps.config.spec import load_spec
        from sweeps.app.driver import Driver
        from sweeps.store import records
        from sweeps.search.confirm import confirm_top, candidates
        spec = load_spec(compose_cfg({fast!r}))
        d = Driver(spec); d.setup()
        top, base = candidates(records.load_records(d.study), 2)
        victim = next(r for r in top if not r.is_baseline)
        out = confirm_top(d, k=2, repeats=2, force=True,
                          extra_env={{records.config_key(victim.params): {{"SERVESWEEP_EMULATOR_FAULT": "corrupt_tokens"}}}})
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


def _two_close_configs(tmp_path, slow_measured: float) -> _Driver:
    """A race of the baseline (82), two configs close under 1.5 % noise (t1 G64 truly 88.6, t2
    CUSTOM128 truly 91.0; the simpler t1 measured ahead) and a truly slow one (t3, 80.0)."""
    slow = {"speculative": "none", "allreduce": "nccl", "cuda_graph_max_bs": 128}
    study = _study([(BASE, 82.0, True), (G64, 91.0, False), (CUSTOM128, 90.5, False), (slow, slow_measured, False)])
    truth = {records.config_key(BASE): 82.0, records.config_key(G64): 88.6, records.config_key(CUSTOM128): 91.0,
             records.config_key(slow): 80.0}
    return _Driver(tmp_path, study, truth)


def test_the_race_repeats_only_the_undecided_and_repeats_accumulate(tmp_path):
    """Two configs close under 1.5 % noise, the simpler one (the pick by the tie-break) not the
    leader: the race gives the leader and the pick more repeats (not the clearly slower config
    or the baseline), up to the budget, and reports them as a tie group; a rerun launches
    nothing, a larger budget only adds launches. (Futility off: at 6 repeats this race is not
    decidable, and the default stops it at once: the next test.)"""
    drv = _two_close_configs(tmp_path, slow_measured=90.0)
    out = confirm.confirm_top(drv, k=3, repeats=3, max_repeats=6, margin=0.01, futility=False)
    by = {e["trial"]: e for e in out["entries"]}
    assert by[0]["launched"] == 3 and by[3]["launched"] == 3  # separated after the first 3: no race
    assert by[1]["launched"] == by[2]["launched"] == 6  # undecided: raced to the budget
    assert out["decision"]["status"] == "budget_spent" and set(out["tie_group"]) == {1, 2}, out["decision_reason"]
    assert out["winner"] == out["tie_group"][0] and "tie-break" in out["winner_note"]
    assert by[out["tie_group"][1]]["verdict"] == "tie group: not picked"
    assert by[1]["vs_leader"] in ("leader", "undecided") and by[3]["vs_leader"] == "separated"
    # the tie-break: fewer non-default settings (t1 changes the CUDA-graph size; t2 also the allreduce)
    assert by[1]["non_default"] < by[2]["non_default"] and out["winner"] == 1
    for e in by.values():  # Fieller: speedup intervals are never below 0 and hold their ratio
        lo, hi = e["ratio_interval"]
        assert 0 <= lo <= e["speedup_mean"] <= (hi if hi is not None else float("inf"))
    launches = len(drv._trial_task.calls)
    assert launches == 3 + 3 + 6 + 6 and len(out["launches"]) == launches
    # each batch of launches is a round of its own: the first 3 repeats each, then one per round
    rounds = {t: [x["round"] for x in out["launches"] if x["trial"] == t] for t in by}
    assert rounds[0] == rounds[3] == [0, 0, 0] and rounds[1] == rounds[2] == [0, 0, 0, 1, 2, 3]
    assert out["round"] == 3
    # rerun at the same settings: the stored evidence answers it, nothing is launched
    drv._trial_task.calls.clear()
    again = confirm.confirm_top(drv, k=3, repeats=3, max_repeats=6, margin=0.01, futility=False)
    assert not drv._trial_task.calls and again["winner"] == out["winner"]
    assert again["round"] == 3 and [x["round"] for x in again["launches"]] == [x["round"] for x in out["launches"]]
    # a larger budget adds evidence: the first values stay, only the racing configs get more
    more = confirm.confirm_top(drv, k=3, repeats=3, max_repeats=8, margin=0.01, futility=False)
    by2 = {e["trial"]: e for e in more["entries"]}
    assert by2[1]["values"][:6] == by[1]["values"] and by2[0]["values"] == by[0]["values"]
    assert len(drv._trial_task.calls) == 4 and by2[1]["launched"] == by2[2]["launched"] == 8
    assert more["round"] == out["round"] + 2  # 6 -> 7 -> 8 repeats: two more rounds
    assert sorted({x["round"] for x in more["launches"]} - {x["round"] for x in out["launches"]}) == [4, 5]
    # every launch had its own noise seed, across both rounds
    nums = [x["repeat"] for x in more["launches"] if x["trial"] == 1]
    assert nums == list(range(8))
    # a larger initial repeats count asks for the missing repeats only
    drv._trial_task.calls.clear()
    confirm.confirm_top(drv, k=3, repeats=4, max_repeats=8, margin=0.01, futility=False)
    assert sorted(c[0] % 100 for c in drv._trial_task.calls) == [3, 3]  # t0 and t3: their 4th repeat



def test_the_race_does_not_spend_launches_it_cannot_decide_with(tmp_path):
    """The same two close configs with futility on (the default): projected from their first 3
    repeats, 6 could neither separate nor show them equivalent within 1 %, so neither gets more;
    the decision says so and keeps both in the tie group."""
    base = BASE
    a = G64
    b = CUSTOM128
    study = _study([(base, 82.0, True), (a, 91.0, False), (b, 90.5, False)])
    truth = {records.config_key(base): 82.0, records.config_key(a): 88.6, records.config_key(b): 91.0}
    drv = _Driver(tmp_path, study, truth)
    out = confirm.confirm_top(drv, k=3, repeats=3, max_repeats=6, margin=0.01)
    assert [e["launched"] for e in out["entries"]] == [3, 3, 3] and len(drv._trial_task.calls) == 9
    assert out["decision"]["status"] == "undecidable" and set(out["tie_group"]) == {1, 2}
    assert "would still be neither at 6 repeats" in out["decision_reason"] and out["winner"] == 1

def test_a_confirmation_stored_before_the_race_is_kept_as_evidence(tmp_path):
    base = BASE
    fast = G64
    study = _study([(base, 82.0, True), (fast, 91.0, False)])
    drv = _Driver(tmp_path, study, {records.config_key(base): 82.0, records.config_key(fast): 90.0})
    study.set_user_attr(confirm.ATTR, {"candidates": [0, 1], "repeats": 3, "round": 0, "winner": 1, "entries": [
        {"trial": 0, "is_baseline": True, "values": [82.0, 81.5, 82.4], "n": 3},
        {"trial": 1, "is_baseline": False, "values": [90.1, 89.8, 90.3], "n": 3, "tokens_match": True}]})
    out = confirm.confirm_top(drv, k=1, repeats=3, max_repeats=3)
    assert not drv._trial_task.calls and out["winner"] == 1
    assert {e["trial"]: e["values"] for e in out["entries"]} == {0: [82.0, 81.5, 82.4], 1: [90.1, 89.8, 90.3]}
    assert next(e for e in out["entries"] if e["trial"] == 1)["tokens_match"] is True
    out = confirm.confirm_top(drv, k=1, repeats=4, max_repeats=4)
    assert len(drv._trial_task.calls) == 2 and all(e["n"] == 4 for e in out["entries"])


def test_confirmation_runs_are_named_by_repeat_and_one_evidence_set_is_current(tmp_path):
    """MLflow: one run per launch named ``t001 confirm r<repeat>`` with its round; a rerun
    re-tags verdicts instead of adding runs; a superseded evidence set (force) loses its verdicts."""
    from mlflow.tracking import MlflowClient

    from sweeps.publish.parent_run import sync_confirmation
    from sweeps.store.tracking import Tracker

    tr = Tracker(f"sqlite:///{tmp_path / 'm.db'}", "exp", str(tmp_path / "art"))
    cl = MlflowClient(f"sqlite:///{tmp_path / 'm.db'}")
    tr.parent_run_id = cl.create_run(tr.experiment_id, run_name="parent").info.run_id
    kids = {t: cl.create_run(tr.experiment_id, run_name=f"t{t}").info.run_id for t in (0, 1)}

    def conf(epoch, rnd, launches, verdicts):
        return {"epoch": epoch, "round": rnd, "repeats": 2, "launches": launches,
                "entries": [{"trial": t, "config": {}, "verdict": v} for t, v in verdicts.items()]}

    first = [{"trial": t, "repeat": r, "round": 0, "status": "ok", "value": 90.0 + r} for t in (0, 1) for r in (0, 1)]
    assert sync_confirmation(tr, "s", conf(0, 0, first, {0: "#2", 1: "winner"}), "decode_tok_s", kids.get) == 4
    more = first + [{"trial": 1, "repeat": 2, "round": 1, "status": "ok", "value": 91.0}]
    assert sync_confirmation(tr, "s", conf(0, 1, more, {0: "winner", 1: "tie group: not picked"}),
                             "decode_tok_s", kids.get) == 1
    runs = [r for r in cl.search_runs([tr.experiment_id]) if r.data.tags.get("servesweep.role") == "confirmation"]
    names = sorted(r.info.run_name for r in runs)
    assert names == ["t000 confirm r1", "t000 confirm r2", "t001 confirm r1", "t001 confirm r2", "t001 confirm r3"]
    assert {r.data.tags["decision_round"] for r in runs} == {"1"} and {r.data.tags["current"] for r in runs} == {"true"}
    assert sorted(r.data.tags["confirm_round"] for r in runs) == ["0", "0", "0", "0", "1"]
    assert all(r.data.tags["verdict"] == ("winner" if r.data.tags["confirms_trial"] == "0" else "tie group: not picked")
               for r in runs)
    # a new evidence set: the old runs are no longer current and keep no verdict
    fresh = [{"trial": 1, "repeat": 0, "round": 2, "status": "ok", "value": 92.0}]
    assert sync_confirmation(tr, "s", conf(1, 2, fresh, {1: "winner"}), "decode_tok_s", kids.get) == 1
    runs = [r for r in cl.search_runs([tr.experiment_id]) if r.data.tags.get("servesweep.role") == "confirmation"]
    cur = [r for r in runs if r.data.tags.get("current") == "true"]
    assert len(cur) == 1 and cur[0].data.tags["verdict"] == "winner" and cur[0].data.tags["confirm_epoch"] == "1"
    assert all("verdict" not in r.data.tags for r in runs if r.data.tags.get("current") == "false")
    assert sum(r.data.tags.get("verdict") == "winner" for r in runs) == 1


class _Plateau(dict):
    """True decode tok/s by the CUDA-graph size alone: a plateau of 90 up to 128, then 85.5 at
    256 and 82 at 512 (the campaign node's shape, tasks/emulator), whatever the allreduce."""

    def __missing__(self, key):
        g = json.loads(key)["cuda_graph_max_bs"]
        return 90.0 if g <= 128 else 85.5 if g == 256 else 82.0


#: the plateau study's trials: the baseline g512 (82 tok/s) and the sweep's measured best, g64 with a
#: custom allreduce (91, a lucky plateau member)
PLATEAU_TRIALS = (({"speculative": "none", "allreduce": "nccl", "cuda_graph_max_bs": 512}, 82.0, True),
                  ({"speculative": "none", "allreduce": "custom", "cuda_graph_max_bs": 64}, 91.0, False))


def _plateau_driver(tmp_path, trials=PLATEAU_TRIALS):
    """A stand-in driver on the smoke sweep with the campaign's CUDA-graph levels and baseline g512."""
    drv = _Driver(tmp_path, _study_wide(trials), _Plateau())
    drv.spec = load_spec(compose_cfg(["sweep=smoke", f"tracking.store_dir={tmp_path}",
                                      "sweep.params.cuda_graph_max_bs.choices=[16,32,64,128,256,512]",
                                      "sweep.baseline.cuda_graph_max_bs=512"]))
    return drv


def _study_wide(trials):
    study = optuna.create_study(direction="maximize", study_name="s")
    dist = {"speculative": optuna.distributions.CategoricalDistribution(["none"]),
            "allreduce": optuna.distributions.CategoricalDistribution(["nccl", "custom", "flashinfer_fusion"]),
            "cuda_graph_max_bs": optuna.distributions.CategoricalDistribution([16, 32, 64, 128, 256, 512])}
    for params, value, base in trials:
        study.add_trial(optuna.trial.create_trial(
            params=params, distributions=dist, value=value,
            user_attrs={"status": "ok", "metrics": {"decode_tok_s": value}, "is_baseline": base}))
    return study


def test_one_step_simplifications_revert_or_step_toward_the_baseline(tmp_path):
    from sweeps.config.space import parse_space

    space = parse_space({"speculative": {"type": "categorical", "choices": ["none", "eagle3"]},
                         "cuda_graph_max_bs": {"type": "categorical", "choices": [16, 32, 64, 128, 256, 512]},
                         "eagle_num_steps": {"type": "int", "low": 1, "high": 5, "when": {"speculative": "eagle3"}},
                         "eagle_num_draft_tokens": {"type": "int", "low": 2, "high": 8,
                                                    "when": {"speculative": "eagle3"}}},
                        [{"name": "fit", "expr": "eagle_num_draft_tokens <= eagle_num_steps + 1",
                          "when": {"speculative": "eagle3"}}])
    base = {"speculative": "none", "cuda_graph_max_bs": 512}
    pick = {"speculative": "eagle3", "cuda_graph_max_bs": 32, "eagle_num_steps": 3, "eagle_num_draft_tokens": 4}
    got = confirm.one_step_simplifications(pick, base, space)
    steps = [s for _, s in got]
    # the draft knobs follow their parent: reverting speculative drops them; no step of the
    # draft knobs themselves (the baseline has none); the CUDA-graph size: one level, or back
    assert steps == ["speculative eagle3 -> none", "cuda_graph_max_bs 32 -> 64", "cuda_graph_max_bs 32 -> 512"]
    assert got[0][0] == {"speculative": "none", "cuda_graph_max_bs": 32}
    assert got[1][0] == {**pick, "cuda_graph_max_bs": 64}
    # the baseline itself has nothing simpler; a step that breaks a constraint is left out
    assert confirm.one_step_simplifications(base, base, space) == []
    tight = {**pick, "eagle_num_steps": 3, "eagle_num_draft_tokens": 4}
    base_eagle = {**tight, "cuda_graph_max_bs": 512, "eagle_num_steps": 2}
    assert [s for _, s in confirm.one_step_simplifications(tight, base_eagle, space)] == \
        ["cuda_graph_max_bs 32 -> 64", "cuda_graph_max_bs 32 -> 512"]  # steps 3 -> 2 would break fit (4 > 3)


def test_the_race_walks_to_the_plateau_member_nearest_the_baseline(tmp_path):
    """The sweep measured its best at g64 with a custom allreduce (a plateau member). The race
    adds configs one step simpler than its pick, unmeasured ones included, and the pick walks to
    g128 with the default allreduce, which no trial measured; g256 separates below it. The
    added configs are stored, their launches count, and a rerun launches nothing."""
    drv = _plateau_driver(tmp_path)
    out = confirm.confirm_top(drv, k=1, repeats=3, max_repeats=6, margin=0.01, simpler_max=0, descend=8)
    by = {e["trial"]: e for e in out["entries"]}
    win = by[out["winner"]]
    assert win["config"] == {"speculative": "none", "allreduce": "nccl", "cuda_graph_max_bs": 128}, out["winner_note"]
    assert out["winner"] >= confirm.DERIVED_BASE and win["in_study"] is False and win["step"] == "cuda_graph_max_bs 64 -> 128"
    added = {json.dumps(d["config"], sort_keys=True): d for d in out["derived"]}
    g256 = next(e for e in out["entries"] if e["config"].get("cuda_graph_max_bs") == 256)
    assert json.dumps(g256["config"], sort_keys=True) in added and g256["vs_leader"] == "separated"
    assert all(d["trial"] >= confirm.DERIVED_BASE and not d["in_study"] for d in out["derived"])
    # every launch is in the stored evidence, with the GPU-seconds it held
    assert len(out["launches"]) == len(drv._trial_task.calls) and all("gpu_s" in x for x in out["launches"])
    assert {x["trial"] for x in out["launches"]} == set(by)
    # the winner resolves to a record although no study trial measured it
    rec = confirm.config_record(records.load_records(drv.study), out, out["winner"])
    assert rec is not None and rec.params == win["config"] and rec.metrics["decode_tok_s"] == pytest.approx(win["mean"])
    # a rerun of the finished race: the same configs, nothing launched
    drv._trial_task.calls.clear()
    again = confirm.confirm_top(drv, k=1, repeats=3, max_repeats=6, margin=0.01, simpler_max=0, descend=8)
    assert not drv._trial_task.calls and again["winner"] == out["winner"] and again["derived"] == out["derived"]


def test_the_descent_stops_at_its_limit_and_is_off_by_default(tmp_path):
    drv = _plateau_driver(tmp_path)
    out = confirm.confirm_top(drv, k=1, repeats=3, max_repeats=6, simpler_max=0)
    assert out["derived"] == [] and {e["trial"] for e in out["entries"]} == {0, 1}
    out = confirm.confirm_top(drv, k=1, repeats=3, max_repeats=6, simpler_max=0, descend=2, force=True)
    assert len(out["derived"]) == 2 and len(out["entries"]) == 4


def test_a_config_only_the_race_measured_is_logged_under_the_parent_run(tmp_path):
    from mlflow.tracking import MlflowClient

    from sweeps.publish.parent_run import sync_confirmation
    from sweeps.store.tracking import Tracker

    tr = Tracker(f"sqlite:///{tmp_path / 'm.db'}", "exp", str(tmp_path / "art"))
    cl = MlflowClient(f"sqlite:///{tmp_path / 'm.db'}")
    tr.parent_run_id = cl.create_run(tr.experiment_id, run_name="parent").info.run_id
    kids = {1: cl.create_run(tr.experiment_id, run_name="t1").info.run_id}
    d = confirm.DERIVED_BASE
    conf = {"epoch": 0, "round": 0, "repeats": 1,
            "launches": [{"trial": t, "repeat": 0, "round": 0, "status": "ok", "value": 90.0} for t in (1, d)],
            "entries": [{"trial": 1, "config": {"g": 64}, "verdict": "tie group: not picked"},
                        {"trial": d, "config": {"g": 128}, "verdict": "winner", "derived_from": 1,
                         "step": "g 64 -> 128", "in_study": False}]}
    assert sync_confirmation(tr, "s", conf, "decode_tok_s", kids.get) == 2
    runs = {r.data.tags["confirms_trial"]: r for r in cl.search_runs([tr.experiment_id])
            if r.data.tags.get("servesweep.role") == "confirmation"}
    assert runs[str(d)].data.tags["mlflow.parentRunId"] == tr.parent_run_id
    assert runs[str(d)].data.tags["derived_from"] == "1" and runs[str(d)].data.tags["step"] == "g 64 -> 128"
    assert runs["1"].data.tags["mlflow.parentRunId"] == kids[1] and "derived_from" not in runs["1"].data.tags


def test_findings_name_the_configs_the_race_added(tmp_path):
    from sweeps.publish.findings.sections import confirmation_lines

    drv = _plateau_driver(tmp_path)
    out = confirm.confirm_top(drv, k=1, repeats=3, max_repeats=6, simpler_max=0, descend=8)
    text = "\n".join(confirmation_lines(out))
    win = next(e for e in out["entries"] if e["trial"] == out["winner"])
    assert f"| t{out['winner']} (added: t{win['derived_from']}, cuda_graph_max_bs 64 -> 128) |" in text
    assert f"The race added {len(out['derived'])} config(s)" in text and "no sweep trial had measured" in text
    # the header counts every row of the table: the top k, the baseline and the added ones
    assert text.startswith(f"Top 1 configs and the baseline, and {len(out['derived'])} config(s) the race added")
    assert len(out["entries"]) == 1 + 1 + len(out["derived"]), [(e["trial"], e.get("is_baseline")) for e in out["entries"]]


def test_the_descent_does_not_relaunch_a_config_the_sweep_saw_fail(tmp_path):
    dead = {"speculative": "none", "allreduce": "nccl", "cuda_graph_max_bs": 64}  # its one step simpler, failed
    drv = _plateau_driver(tmp_path)
    dist = {"speculative": optuna.distributions.CategoricalDistribution(["none"]),
            "allreduce": optuna.distributions.CategoricalDistribution(["nccl", "custom", "flashinfer_fusion"]),
            "cuda_graph_max_bs": optuna.distributions.CategoricalDistribution([16, 32, 64, 128, 256, 512])}
    drv.study.add_trial(optuna.trial.create_trial(params=dead, distributions=dist, state=optuna.trial.TrialState.PRUNED,
                                                  user_attrs={"status": "failed", "failure_class": "startup_crash"}))
    out = confirm.confirm_top(drv, k=1, repeats=3, max_repeats=6, simpler_max=0, descend=8)
    raced = [json.dumps(e["config"], sort_keys=True) for e in out["entries"]]
    assert json.dumps(dead, sort_keys=True) not in raced
    assert {x["trial"] for x in out["launches"]} <= {e["trial"] for e in out["entries"]}
    assert out["derived"]  # the other one-step simplifications still joined


class _Killed(BaseException):
    """Stands in for a SIGKILL of the driver: nothing after it runs in ``confirm_top``."""


def test_a_driver_killed_mid_race_keeps_its_finished_rounds(tmp_path):
    """The driver dies (no handler runs) while the race descends; the rounds it finished are in
    the study, and the resumed race launches only what is missing: fewer launches than a race
    from scratch, none of the killed run's repeats again, the same winner as an unkilled race."""
    ref = _plateau_driver(tmp_path / "ref")
    whole = confirm.confirm_top(ref, k=1, repeats=3, max_repeats=6, margin=0.01, simpler_max=0, descend=8)
    n_whole = len(ref._trial_task.calls)
    drv = _plateau_driver(tmp_path / "kill")
    task, remote = drv._trial_task, drv._trial_task.remote

    def dies_at_the_descent(spec, profile, workdir):
        if (spec.trial_number - confirm.CONFIRM_BASE) // 100 >= confirm.DERIVED_BASE:
            raise _Killed  # the first launch of a race-added config: after the first round
        return remote(spec, profile, workdir)

    task.remote = dies_at_the_descent
    with pytest.raises(_Killed):
        confirm.confirm_top(drv, k=1, repeats=3, max_repeats=6, margin=0.01, simpler_max=0, descend=8)
    stored = drv.study.user_attrs.get(confirm.ATTR)
    assert stored and stored["in_progress"] is True and len(stored["launches"]) >= 6  # t0, t1 x3 at least
    done = {(x["trial"], x["repeat"]) for x in stored["launches"]}
    first = len(task.calls)
    task.remote = remote
    out = confirm.confirm_top(drv, k=1, repeats=3, max_repeats=6, margin=0.01, simpler_max=0, descend=8)
    again = task.calls[first:]
    relaunched = {divmod(c[0] - confirm.CONFIRM_BASE, 100) for c in again}  # (trial, repeat)
    assert again and len(again) < n_whole and not relaunched & done
    assert out["winner"] == whole["winner"] and "in_progress" not in out
    assert drv.study.user_attrs[confirm.ATTR]["winner"] == whole["winner"]


def test_a_config_only_the_race_measured_is_a_duplicate_for_the_next_proposal(tmp_path):
    """After a race that added unmeasured configs, a later proposal of one of them (a resumed
    sweep with a larger budget) is answered without a launch: a duplicate of the race entry,
    with its confirmed mean told to Optuna. A config neither measured still launches."""
    from optuna.trial import TrialState

    from sweeps.search import gates
    from sweeps.store.study import verdict_for

    drv = _plateau_driver(tmp_path)
    out = confirm.confirm_top(drv, k=1, repeats=3, max_repeats=6, margin=0.01, simpler_max=0, descend=8)
    added = [d for d in out["derived"] if not d["in_study"]]
    assert added
    for d in added:
        e = next(e for e in out["entries"] if e["trial"] == d["trial"])
        skip = gates.duplicate(drv.study, 2, records.config_key(d["config"]), [])
        assert skip is not None and skip.gate == "duplicate", d
        assert skip.attrs[records.A_DUPLICATE_OF] == d["trial"]
        assert skip.attrs[records.A_METRICS] == {"decode_tok_s": pytest.approx(e["mean"])}
        v = verdict_for(skip.status, source=skip.source)
        assert v.state == TrialState.COMPLETE and v.values == pytest.approx((e["mean"],))
    raced = {records.config_key(e["config"]) for e in out["entries"]}
    fresh = {"speculative": "none", "allreduce": "flashinfer_fusion", "cuda_graph_max_bs": 16}
    assert records.config_key(fresh) not in raced
    assert gates.duplicate(drv.study, 2, records.config_key(fresh), []) is None


def test_a_race_added_winner_is_the_parents_best_run(tmp_path):
    """The race's pick is a config no trial measured (no trial run): the parent's ``best_run``
    is the winner's first confirmation run, nested under the parent."""
    from mlflow.tracking import MlflowClient

    from sweeps.publish.parent_run import log_truth
    from sweeps.store.tracking import Tracker

    drv = _plateau_driver(tmp_path)
    out = confirm.confirm_top(drv, k=1, repeats=3, max_repeats=6, margin=0.01, simpler_max=0, descend=8)
    assert out["winner"] >= confirm.DERIVED_BASE, out["winner_note"]
    tr = Tracker(f"sqlite:///{tmp_path / 'm.db'}", "exp", str(tmp_path / "art"))
    cl = MlflowClient(f"sqlite:///{tmp_path / 'm.db'}")
    tr.parent_run_id = cl.create_run(tr.experiment_id, run_name="parent").info.run_id
    log_truth(tr, drv.spec, "s", drv.study, records.load_records(drv.study), tmp_path / "reports")
    tags = cl.get_run(tr.parent_run_id).data.tags
    assert tags["best_trial"] == str(out["winner"]) and tags.get("best_run"), sorted(tags)
    run = cl.get_run(tags["best_run"])
    assert run.data.tags["servesweep.role"] == "confirmation" and run.data.tags["confirms_trial"] == str(out["winner"])
    assert run.data.tags["mlflow.parentRunId"] == tr.parent_run_id and run.data.tags["repeat"] == "0"
    assert run.data.tags["status"] == "ok" and "decode_tok_s" in run.data.metrics


class _CrashingTask(_Task):
    """The stand-in task, whose server crashes (a transient class) on a config's first ``crashes``
    launches, or on every launch of a config in ``always``."""

    def __init__(self, true, crashes: dict[str, int], always: set[str] = frozenset()):
        super().__init__(true)
        self.crashes, self.always, self.seen = dict(crashes), set(always), {}

    def remote(self, spec, profile, workdir):
        key = records.config_key(spec.params)
        self.seen[key] = self.seen.get(key, 0) + 1
        if key in self.always or self.seen[key] <= self.crashes.get(key, 0):
            self.calls.append((spec.trial_number, dict(spec.env), None))
            return _Ref(TrialResult(status="failed", failure_class="server_crash", failure_kind="transient"))
        return super().remote(spec, profile, workdir)


def test_a_confirmation_launch_whose_server_crashed_is_launched_again_not_counted(tmp_path):
    base = BASE
    a = G64
    slow = CUSTOM128
    study = _study([(base, 82.0, True), (a, 90.0, False), (slow, 89.0, False)])
    truth = {records.config_key(base): 82.0, records.config_key(a): 90.0, records.config_key(slow): 53.0}
    drv = _Driver(tmp_path, study, truth)
    _with_task(drv, _CrashingTask(truth, {records.config_key(base): 2}), tmp_path)  # two of its first three launches
    out = confirm.confirm_top(drv, k=2, repeats=3, max_repeats=3, margin=0.01)
    by = {e["trial"]: e for e in out["entries"]}
    # the baseline's crashed launches measured nothing: it still gets its 3 measured repeats
    assert len(by[0]["values"]) == 3, by[0]
    assert sum(1 for x in out["launches"] if x["trial"] == 0 and x["status"] != "ok") >= 1
    # so a config 35 % slower is separated from it, not tied with it
    assert 2 not in (out.get("tie_group") or []) and by[2]["vs_leader"] == "separated", out["decision_reason"]


def test_a_config_that_crashes_on_every_launch_stops_after_its_repeats_worth(tmp_path):
    base = BASE
    a = G64
    study = _study([(base, 82.0, True), (a, 90.0, False)])
    truth = {records.config_key(base): 82.0, records.config_key(a): 90.0}
    drv = _Driver(tmp_path, study, truth)
    _with_task(drv, _CrashingTask(truth, {}, always={records.config_key(a)}), tmp_path)
    out = confirm.confirm_top(drv, k=1, repeats=3, max_repeats=3, margin=0.01)
    lost = [x for x in out["launches"] if x["trial"] == 1]
    assert len(lost) == 3 and all(x["failure"] == "server_crash" for x in lost)  # bounded, not a loop
    assert out["winner"] != 1


def test_a_driver_killed_mid_round_keeps_the_launches_that_round_finished(tmp_path):
    """The driver dies (no handler runs) in the first round, before any round is stored: the
    launches that round finished are checkpointed one by one, and the next run launches only the
    rest, with the same decision as an unkilled run."""
    base = BASE
    a = G64
    b = CUSTOM128
    truth = {records.config_key(base): 82.0, records.config_key(a): 90.0, records.config_key(b): 85.0}
    trials = [(base, 82.0, True), (a, 91.0, False), (b, 86.0, False)]
    ref = _Driver(tmp_path / "ref", _study(trials), truth)
    whole = confirm.confirm_top(ref, k=2, repeats=3, max_repeats=3, margin=0.01)
    drv = _Driver(tmp_path / "kill", _study(trials), truth)
    task, remote = drv._trial_task, drv._trial_task.remote
    calls = []

    def dies_at_the_fifth_launch(spec, profile, workdir):
        calls.append(spec.trial_number)
        if len(calls) == 5:
            raise _Killed
        return remote(spec, profile, workdir)

    task.remote = dies_at_the_fifth_launch
    with pytest.raises(_Killed):
        confirm.confirm_top(drv, k=2, repeats=3, max_repeats=3, margin=0.01)
    assert not drv.study.user_attrs.get(confirm.ATTR)  # no round was closed
    half = drv.study.user_attrs[confirm.ROUND_ATTR]
    kept = sum(len(v) for v in half["done"].values())
    assert kept >= 2
    task.remote = remote
    first = len(task.calls)
    out = confirm.confirm_top(drv, k=2, repeats=3, max_repeats=3, margin=0.01)
    assert len(task.calls) - first == 9 - kept  # only what the killed round had not finished
    assert out["winner"] == whole["winner"] and [e["launched"] for e in out["entries"]] == [3, 3, 3]
    assert not drv.study.user_attrs.get(confirm.ROUND_ATTR)  # merged and cleared


def test_a_continued_study_keeps_the_stored_tie_group_in_its_race(tmp_path):
    """A study continued with more trials ranks new configs above a tied contender by their single
    runs: the contender and its repeats stay in the race (the tie group is evidence), never
    dropped from the confirmation because a new top k left it out."""
    drv = _two_close_configs(tmp_path, slow_measured=80.0)
    study = drv.study
    out = confirm.confirm_top(drv, k=2, repeats=3, max_repeats=6, margin=0.01, futility=False)
    assert set(out["tie_group"]) == {1, 2}, out["decision_reason"]
    # the study goes on: a new config's single run ranks above both tied configs
    fast = {"speculative": "none", "allreduce": "flashinfer_fusion", "cuda_graph_max_bs": 64}
    dist = {k: v for k, v in study.trials[0].distributions.items()}
    study.add_trial(optuna.trial.create_trial(params=fast, distributions=dist, value=99.0,
                                              user_attrs={"status": "ok", "metrics": {"decode_tok_s": 99.0}}))
    drv._trial_task.true[records.config_key(fast)] = 85.0
    again = confirm.confirm_top(drv, k=2, repeats=3, max_repeats=6, margin=0.01, futility=False)
    by = {e["trial"]: e for e in again["entries"]}
    assert {1, 2, 4} <= set(by), sorted(by)  # the new top 2 is t4 and t1; t2 stays with its repeats
    assert by[2]["values"][:6] == {e["trial"]: e for e in out["entries"]}[2]["values"]
