"""Progress: the ETA comes from measured launched-trial times (median x launches left per
slot, the confirmation's launches included); every confirmation launch prints a line."""

from __future__ import annotations

import pytest

from sweeps.app.inprocess import InProcessDriver
from sweeps.config.spec import load_spec
from sweeps.run.progress import Progress, eta_s
from sweeps.store.records import TrialRecord
from tests.conftest import compose_cfg


def test_eta_is_median_trial_time_times_launches_left_per_slot():
    assert eta_s([10.0, 20.0, 300.0], left=4, running=0, slots=2) == pytest.approx(20.0 * 2)
    assert eta_s([10.0, 20.0, 300.0], left=4, running=1, slots=2) == pytest.approx(20.0 * 2.5)


def test_status_line_eta_counts_skips_as_free_and_names_what_runs_after_the_trials():
    recs = [TrialRecord(number=i, state="COMPLETE", params={}, status="ok", metrics={"decode_tok_s": 80.0 + i},
                        timings={"wall_s": w}) for i, w in enumerate((100.0, 120.0, 140.0))]
    recs += [TrialRecord(number=9, state="PRUNED", params={}, status="skipped", skipped_by_rule="1")]
    p = Progress("s", budget_trials=10)
    p.slots, p.confirm_launches = 1, 4
    line = p.status_line(recs, running=0, t_start=0.0)
    # 7 launches left, 120 s each (the median; the skip costs nothing); the confirmation's 4
    # launches after them are named apart, as at least that many (a race adds repeats)
    assert line.endswith(f"ETA {120 * 7:.0f} s for the trials; then at least 4 confirmation launches "
                         f"(~{120 * 4:.0f} s at this pace)"), line
    p.serving_checks = 2
    assert p.status_line(recs, running=0, t_start=0.0).endswith(" and 2 serving-check load searches")
    p.confirm_launches = p.serving_checks = 0
    assert p.status_line(recs, running=0, t_start=0.0).endswith(f"ETA {120 * 7:.0f} s for the trials")


def test_every_confirmation_launch_prints_a_line(tmp_path):
    store = tmp_path / "store"
    spec = load_spec(compose_cfg(["backend=instant", "sweep=smoke", "sweep.budget.trials=4", "sweep.confirm.top_k=2",
                                  "sweep.confirm.repeats=2", f"tracking.store_dir={store}",
                                  f"tracking.findings_dir={store / 'findings'}"]))
    drv = InProcessDriver(spec)
    lines: list[str] = []
    drv.progress.event = lines.append  # type: ignore[method-assign]
    drv.setup()
    drv.loop()
    drv.finish()
    conf = drv.study.user_attrs["confirmation"]
    confirm = [x for x in lines if x.startswith("confirm ")]
    total = conf["repeats"] * len(conf["entries"])
    assert len(confirm) == total >= 4
    assert confirm[-1].startswith(f"confirm {total}/{total} t")
    assert all("tok/s" in x or "failed" in x for x in confirm), confirm


def test_the_console_line_of_a_re_question_probe_says_it_is_one(tmp_path):
    """A re-question probe (one probe-only launch of a known dead end) prints as such: a pass
    says the dead end no longer reproduces (not a blank 'not benchmarked'), a failure that it
    still does."""
    from sweeps.config.spec import load_spec
    from sweeps.publish.outputs import Publisher
    from tasks.types import TrialResult
    from tests.conftest import compose_cfg

    spec = load_spec(compose_cfg(["backend=instant", "sweep=eagle3_allreduce", f"tracking.store_dir={tmp_path}"]))
    pub = Publisher(spec, "s", track=False, findings=False)
    lines: list[str] = []
    pub.progress.event = lines.append
    cfg = {**dict(spec.sweep.baseline), "nccl_algo": "Tree"}
    pub.trial_done(3, cfg, TrialResult(trial_number=3, status="ok"), {}, requestion=True)
    pub.trial_done(4, cfg, TrialResult(trial_number=4, status="failed", failure_class="nccl_env_algo_proto_invalid"),
                   {}, requestion=True)
    pub.trial_done(5, cfg, TrialResult(trial_number=5, status="ok"), {})  # a trial that ended at its probe
    assert lines[0].startswith("t003 ") and "re-question probe passed: the dead end no longer reproduces" in lines[0]
    assert "re-question probe failed nccl_env_algo_proto_invalid: the dead end still reproduces" in lines[1]
    assert "not benchmarked" in lines[2] and "re-question" not in lines[2]
    pub.trial_done(6, cfg, TrialResult(trial_number=6, status="interrupted"), {}, requestion=True)
    pub.trial_done(7, cfg, TrialResult(trial_number=7, status="failed", failure_class="server_crash",
                                       failure_kind="transient"), {}, requestion=True)
    assert "re-question probe interrupted: no answer, the rule stands" in lines[3] and "reproduces" not in lines[3]
    assert "re-question probe failed server_crash: no answer, the rule stands" in lines[4]
    pub.trial_done(8, cfg, TrialResult(trial_number=8, status="interrupted", phase="load"), {})
    assert lines[5].startswith("t008 ") and "interrupted in load; its config is re-queued" in lines[5], lines[5]
    assert "None" not in lines[5]


def test_the_closing_table_lists_a_winner_the_race_added_at_its_confirmed_mean(tmp_path):
    def rec(n, v, **kw):
        return TrialRecord(number=n, state="COMPLETE", params={"cuda_graph_max_bs": kw.pop("g", 512)}, status="ok",
                           metrics={"decode_tok_s": v}, **kw)

    recs = [rec(0, 82.0, is_baseline=True), rec(33, 91.9, g=64)]
    added = rec(90002, 0.0, g=128)  # no sweep trial measured it: the race added it
    conf = {"entries": [{"trial": 0, "mean": 82.0}, {"trial": 33, "mean": 88.9},
                        {"trial": 90002, "mean": 89.1, "ci_low": 88.2, "ci_high": 90.0, "n": 7}]}
    text = Progress("s", 30).summary_text(recs, added, 82.0, None, tmp_path / "f.md", confirmation=conf, reference=82.0,
                                      winner=90002)
    row = next(line for line in text.splitlines() if "90002" in line and "winner" in line)
    assert "89.1" in row and "1.09x" in row and "the race added it, no single run" in row, text


def test_a_failed_trial_prints_its_decisive_log_line_as_the_log_has_it(tmp_path):
    """The console shows the decisive line itself (its numbers, not the normalized signature's
    <N>, which is what rules match); without one, the signature stands in."""
    from sweeps.config.spec import load_spec
    from sweeps.publish.outputs import Publisher
    from tasks.backends.lifecycle import _failure
    from tasks.types import TrialResult
    from tests.conftest import compose_cfg

    log = ("[2026-12-06 10:00:01] Load weight end. mem usage=61.20 GB\n"
           "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a total "
           "capacity of 94.97 GiB of which 1.10 GiB is free.\n")
    res = _failure(TrialResult(trial_number=9, status="ok"), log, 1, "startup", None)
    assert res.failure_class == "cuda_oom_runtime", res.failure_class
    assert "<N>" in (res.failure_signature or "") and "<N>" not in res.failure_line
    assert res.failure_line.startswith("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")

    spec = load_spec(compose_cfg(["backend=instant", "sweep=eagle3_allreduce", f"tracking.store_dir={tmp_path}"]))
    pub = Publisher(spec, "s", track=False, findings=False)
    lines: list[str] = []
    pub.progress.event = lines.append
    pub.trial_done(9, dict(spec.sweep.baseline), res, {})
    assert "Tried to allocate 2.00 GiB" in lines[0] and "<N>" not in lines[0], lines[0]
    pub.trial_done(10, dict(spec.sweep.baseline), TrialResult(trial_number=10, status="failed", failure_class="unknown",
                                                               failure_signature="<no log line>"), {})
    assert lines[1].endswith("<no log line>"), lines[1]
