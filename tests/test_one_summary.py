"""One set of numbers: the console summary, the findings document, the MLflow parent run and
the recheck report of one sweep quote the same baseline, winner, confirmed value and counts
(:mod:`sweeps.publish.summary`), and the serving check of the winner is reported in each.

One smoke sweep through the driver (in-process executor, ``backend=instant``, MLflow in a local
SQLite store, the findings document on), confirmation on and the serving check on.
"""

from __future__ import annotations

import math

import pytest
from mlflow.tracking import MlflowClient

from sweeps.app.recheck import collect_dead_ends
from sweeps.config.objective import metric_text
from sweeps.config.spec import load_spec
from sweeps.publish.parent_run import skipped
from sweeps.publish.recheck_report import NOT_RERUN, Outcome, report_markdown
from sweeps.publish.summary import build_summary, confirm_launches, count_proposals, summary_of_study
from sweeps.rules.store import RuleStore
from sweeps.search import serving_check as serving_checks
from sweeps.store import records
from tasks.types import TrialResult
from tests.conftest import compose_cfg

OVERRIDES = ["backend=instant", "sweep=smoke", "sweep.budget.trials=5", "sweep.confirm.top_k=2",
             "sweep.confirm.repeats=2", "+sweep.serving_check=true"]


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    import io

    from rich.console import Console

    store = tmp_path_factory.mktemp("one_summary")
    spec = load_spec(compose_cfg([*OVERRIDES, f"tracking.store_dir={store}",
                                  f"tracking.findings_dir={store / 'findings'}"]))
    out = io.StringIO()
    from sweeps.app import inprocess

    class Captured(inprocess.InProcessDriver):
        def make_publisher(self):  # the console of the real driver, into a buffer
            pub = super().make_publisher()
            pub.progress.console = Console(file=out, highlight=False, width=300)
            return pub

    drv = Captured(spec, track=True, findings=True)
    from sweeps.app.lifecycle import execute

    execute(drv)
    console = out.getvalue()
    client = MlflowClient(tracking_uri=spec.mlflow_uri)
    exp = client.get_experiment_by_name(spec.sweep.name)
    parent = next(r for r in client.search_runs([exp.experiment_id], max_results=500)
                  if r.data.tags.get("servesweep.role") == "study")
    return drv, spec, console, parent


def test_console_findings_mlflow_and_recheck_agree(swept):
    drv, spec, console, parent = swept
    s = summary_of_study(spec, drv.study)
    obj = spec.objective_set.primary
    assert s.confirmed and s.winner is not None and s.baseline.confirmed
    doc = spec.findings_path.read_text()
    # the console: the same baseline, winner, confirmed value and counts
    for line in (s.baseline_text(), s.winner_text(), s.counts_text()):
        assert line in console, (line, console)
    # ... and the winner's config by name, the params its trial ran (the deploy command's)
    params = drv.study.trials[s.winner].params if s.winner < len(drv.study.trials) else s.winner_config
    assert s.winner_config == params and s.winner_config_text() in console, (s.winner_config_text(), console)
    assert all(f"{k}={v}" in s.winner_config_text() for k, v in params.items())
    # the console's table: the winner marked, each speedup against the summary's baseline (the findings')
    rows = {int(c[0]): c for c in (line.strip("│┃ ").split("│") for line in console.splitlines())
            if len(c) >= 7 and c[0].strip().isdigit()}
    rows = {k: [x.strip() for x in v] for k, v in rows.items()}
    assert rows and all(v[2] == f"{float(v[1]) / s.baseline.value:.2f}x" for v in rows.values()), rows
    assert "[winner]" in rows[s.winner][6] and sum("[winner]" in v[6] for v in rows.values()) == 1
    # the findings: the same numbers
    assert s.counts_text() in doc
    assert f"**{metric_text(obj.name, s.baseline.value).replace(' tok/s', '')}" in doc or \
        f"**{s.baseline.value:.1f} tok/s**" in doc
    assert f"**t{s.winner}: {s.winner_value.value:.1f} tok/s**" in doc
    # the MLflow parent: headline metric confirmed_<objective>, the same values, counts and description
    m, tags = parent.data.metrics, parent.data.tags
    assert m[f"confirmed_{obj.name}"] == pytest.approx(s.winner_value.value)
    assert m[f"best_{obj.name}"] == pytest.approx(s.winner_value.value)
    assert m[f"baseline_{obj.name}"] == pytest.approx(s.baseline.value)
    assert m["trials_launched"] == s.counts.launched and m["proposals"] == s.counts.proposals
    assert tags["confirmed_trial"] == str(s.winner) == tags["winner_trial"]
    assert tags["mlflow.note.content"] == s.markdown()
    assert s.deploy_command and s.deploy_command in tags["mlflow.note.content"]
    # the recheck: its canaries are the baseline and the confirmed winner at their confirmed means
    ends = collect_dead_ends(drv.study, RuleStore(spec.rules_db), obj)
    canary = {d.source_trial: d for d in ends if d.kind == "canary"}  # one per config (the winner may be the baseline)
    assert canary[s.winner].source_value == pytest.approx(s.winner_value.value)
    assert canary[s.baseline.trial].source_value == pytest.approx(s.baseline.value)
    report = report_markdown("r", drv.study_name, {}, [Outcome(d, NOT_RERUN) for d in ends])
    assert f"ok {s.winner_value.value:.1f} tok/s | {s.winner} |" in report
    assert f"ok {s.baseline.value:.1f} tok/s" in report


def test_counts_add_up_and_book_every_launch(swept):
    drv, spec, console, parent = swept
    s = summary_of_study(spec, drv.study)
    c = s.counts
    recs = records.load_records(drv.study)
    assert c.proposals == c.launched + c.probes + c.answered == sum(r.launched for r in recs) + len(skipped(recs))
    # a re-question probe (one probe-only launch of a known dead end) is not a launch of the
    # trial budget: the console, the findings and the MLflow parent count it apart
    probes = [r for r in recs if r.launched and r.requestion]
    assert c.probes == len(probes) >= 1 and c.launched == sum(r.budgeted for r in recs)
    import re

    status = drv.progress.status_line(recs, 0, 0.0)  # the console's periodic status line
    assert f"launched {c.launched}/{spec.sweep.budget.trials} (+{c.probes} re-question probe" in status, status
    assert c.probes_text() in s.counts_text()
    assert parent.data.metrics["requestion_probes"] == c.probes
    assert parent.data.metrics["trials_launched"] == c.launched
    dead = spec.findings_path.read_text().split("### Dead ends", 1)[1].split("\n### ", 1)[0]
    for r in probes:
        assert f"re-questioned by a probe (t{r.number}" in dead, dead
    assert c.answered == sum(c.by_reason.values())
    assert c.launched == c.ok + c.degraded + c.failed + c.infra + c.interrupted
    # a launch whose server fell back to another allreduce path is not counted ok: it measured no level
    fell_back = [r for r in recs if r.budgeted and r.status == "ok" and not records.counts_for_level(r)]
    assert c.degraded == len(fell_back)
    assert (f"{c.degraded} on a degraded allreduce path" in s.counts_text()) == bool(fell_back)
    conf = drv.study.user_attrs["confirmation"]
    assert c.confirm_launches == 2 * len(conf["entries"]) == confirm_launches(conf)
    # GPU-hours: the confirmations and the serving check add to the trials' own, one clock
    assert s.gpu.confirmations > 0 and s.gpu.serving > 0
    assert s.gpu.total == pytest.approx(s.gpu.trials + s.gpu.confirmations + s.gpu.serving)
    assert s.gpu.basis == "modelled" and "modelled" in console
    assert parent.data.metrics["gpu_hours"] == pytest.approx(s.gpu.total)
    # the findings' space counts are a partition of the feasible configs

    doc = spec.findings_path.read_text()
    total, launched, excluded, left = map(int, re.search(
        r"configs: (\d+) feasible in the space = (\d+) launched \(with (?:\d+) re-question probes?\) \+ (\d+) "
        r"excluded by known dead ends \+ \*\*(\d+) not yet tried", doc).groups())
    assert total == launched + excluded + left and launched <= c.launched + c.probes
    # allreduce_path_degraded: the console's launched count is the findings' list of trials
    degraded = next(line for line in doc.splitlines() if "is not what runs** (allreduce_path_degraded)" in line)
    n_deg = len(re.findall(r"\bt\d+\b", degraded.split("fell back to NCCL (", 1)[1].split(";", 1)[0]))
    assert c.by_class["allreduce_path_degraded"][0] == n_deg >= 1
    # "What ran and lost" lists no tie as a loss
    lost = doc.split("### What ran and lost", 1)[1].split("\n### ", 1)[0]
    assert "× the best (+0.0" not in lost


def test_the_summary_reports_the_serving_check(swept):
    drv, spec, console, parent = swept
    check = drv.study.user_attrs[serving_checks.ATTR]
    assert not check.get("error"), check
    assert check["launches"] in (1, 2) and check["rate_req_s"] and check["rate_req_s"] > 0
    assert check["verdict"] in ("holds", "trades_away")
    b = check["baseline"]
    assert b["met"] is True and b["ttft_ms_p99"] is not None and b["tpot_ms_p99"] is not None
    s = summary_of_study(spec, drv.study)
    text = s.serving_text()
    assert text and f"{check['rate_req_s']:.2f} req/s" in text and "p99 TPOT" in text
    assert text in console and text in parent.data.tags["mlflow.note.content"]
    assert text[len("serving check: "):] in spec.findings_path.read_text()
    assert parent.data.tags["serving_check"] == check["verdict"]
    assert serving_checks.passes(check, check["winner_trial"]) is (check["verdict"] == "holds")


class _NoLaunch:
    """The driver's study and spec as a serving-check host whose executor must not be used."""

    interrupted = False

    def __init__(self, drv):
        self.spec, self.study, self.study_name = drv.spec, drv.study, drv.study_name

    @property
    def executor(self):
        raise AssertionError("a stored serving check is reused: nothing is launched")


def test_a_rerun_of_the_finished_study_reuses_the_serving_check(swept):
    drv, spec, _, _ = swept
    check = dict(drv.study.user_attrs[serving_checks.ATTR])
    recs = {r.number: r for r in records.load_records(drv.study)}
    again = serving_checks.run_serving_check(_NoLaunch(drv), recs[check["winner_trial"]], recs[check["baseline_trial"]])
    assert again == check


# ---- pure parts ----------------------------------------------------------------------------

def _rec(n, status="ok", value=None, **kw):
    return records.TrialRecord(number=n, state="COMPLETE", params={"x": n}, status=status,
                         metrics={"decode_tok_s": value} if value is not None else {}, **kw)


def test_an_unconfirmed_winner_is_labelled_a_single_measurement():
    from sweeps.config.objective import Objective

    recs = [_rec(0, value=80.0, is_baseline=True), _rec(1, value=90.0)]
    s = build_summary("s", Objective(), recs)
    assert not s.confirmed and "confirmed_decode_tok_s" not in s.parent_metrics()
    assert "(one measurement)" in s.winner_text() and s.best_single == (1, 90.0)


def test_a_best_single_measurement_in_the_tie_group_is_not_said_to_have_failed_its_repeats():
    from sweeps.config.objective import Objective

    recs = [_rec(0, value=88.0, is_baseline=True), _rec(6, value=89.8), _rec(7, value=95.0)]
    entries = [{"trial": 0, "mean": 91.6, "n": 2}, {"trial": 6, "mean": 91.0, "n": 2}]
    tie = build_summary("s", Objective(), recs[:2], {"winner": 0, "tie_group": [0, 6], "entries": entries})
    assert tie.best_single_text() == "best single measurement: trial 6, 89.8 tok/s (in the tie group; the tie-break picked t0)"
    lost = build_summary("s", Objective(), recs, {"winner": 0, "tie_group": [0, 6], "entries": entries})
    assert lost.best_single_text() == "best single measurement: trial 7, 95.0 tok/s (did not hold up under repeats)"


def test_confirmation_launches_count_failed_repeats():
    conf = {"repeats": 3, "entries": [{"trial": 0, "n": 3}, {"trial": 1, "n": 1, "failures": ["oom"]}]}
    assert confirm_launches(conf) == 6
    assert count_proposals([], conf).confirm_launches == 6


def test_the_counts_name_the_confirmation_launches_that_failed():
    from sweeps.config.objective import Objective

    launches = [{"trial": 0, "status": "ok", "value": 82.0}, {"trial": 0, "status": "failed", "failure": "server_crash"},
                {"trial": 0, "status": "ok", "value": 81.0}, {"trial": 1, "status": "failed", "failure": "bench_stall"}]
    s = build_summary("s", Objective(), [_rec(0, value=80.0, is_baseline=True)], confirmation={"launches": launches})
    text = s.counts_text()
    assert "4 confirmation launches (2 failed: bench_stall x1, server_crash x1;" in text, text
    assert "(" not in build_summary("s", Objective(), [_rec(0, value=80.0, is_baseline=True)],
                                    confirmation={"launches": launches[:1]}).counts_text().split("confirmation launches")[1]


def _load_result(levels):
    lv = [{"rate_req_s": r, "met": met, "metrics": {"ttft_ms_p99": t, "tpot_ms_p99": p}} for r, met, t, p in levels]
    return TrialResult(status="ok", bench=[{"load": {"kind": "load_search", "levels": lv}}])


def test_level_at_and_the_sentence():
    res = _load_result([(2.65, True, 900.0, 40.0), (4.32, False, 3000.0, 120.0)])
    assert serving_checks.level_at(res, 2.65)["met"] is True
    assert serving_checks.level_at(res, 2.655)["ttft_ms_p99"] == 900.0  # within 1 %
    assert serving_checks.level_at(res, 3.0) is None
    check = {"bench": "chat_goodput", "slo": {"ttft_ms_p99": 2000, "tpot_ms_p99": 50}, "rate_req_s": 2.96,
             "winner_trial": 13, "baseline_trial": 0,
             "baseline": {"trial": 0, "met": True, "ttft_ms_p99": 800.0, "tpot_ms_p99": 47.0},
             "winner": {"trial": 13, "met": False, "ttft_ms_p99": 1272.0, "tpot_ms_p99": 182.7}}
    text = serving_checks.sentence(check)
    assert text.startswith("trades it away") and "1272 ms" in text and "182.7 ms" in text and "2.96 req/s" in text
    assert serving_checks.passes(check, 13) is False and serving_checks.passes(check, 0) is True
    assert serving_checks.passes(check, 5) is None
    assert not math.isnan(check["rate_req_s"])


def test_serving_check_off_by_flag_and_for_other_objectives():
    on = load_spec(compose_cfg(["backend=instant", "sweep=smoke", "+sweep.serving_check=true"]))
    off = load_spec(compose_cfg(["backend=instant"]))
    assert serving_checks.wanted(on) and serving_checks.wanted(off)  # the campaign turns it on
    assert not serving_checks.wanted(load_spec(compose_cfg(["backend=instant", "sweep.serving_check=false"])))
    assert not serving_checks.wanted(load_spec(compose_cfg(["backend=instant", "sweep=goodput_slo"])))
    bad = load_spec(compose_cfg(["backend=instant", "sweep.serving_check_bench=decode_single_stream"]))
    with pytest.raises(ValueError, match="sweep.serving_check_bench"):
        serving_checks.serving_bench(bad)


def test_a_winner_that_trades_the_slo_away_hands_the_pick_to_a_tie_member_that_holds(monkeypatch):
    """The serving check is the tie-break's first key: t5 (picked) fails it, t7 (tied) holds."""
    import types

    import optuna

    from sweeps.search.confirm import ATTR

    study = optuna.create_study(direction="maximize")
    recs = [types.SimpleNamespace(number=n) for n in (0, 5, 7, 9)]
    monkeypatch.setattr(serving_checks.records, "load_records", lambda s: recs)
    checked = []

    def run(host, winner, baseline, force=False):
        checked.append(winner.number)
        return {"winner_trial": winner.number, "baseline_trial": baseline.number,
                "verdict": "holds" if winner.number == 7 else "trades_away"}

    monkeypatch.setattr(serving_checks, "check_winner", lambda host, conf: run(host, recs[1], recs[0]))
    monkeypatch.setattr(serving_checks, "run_serving_check", run)
    host = types.SimpleNamespace(study=study, interrupted=False,
                                 spec=types.SimpleNamespace(objective_set=types.SimpleNamespace(
                                     primary=types.SimpleNamespace(maximize=True))))
    entries = [{"trial": t, "values": [90.0, 90.1], "n": 2, "non_default": nd, "cost": 1.0,
                "verdict": "winner" if t == 5 else "tie group: not picked"} for t, nd in ((5, 1), (7, 2), (9, 3))]
    conf = {"winner": 5, "tie_group": [5, 7, 9], "entries": entries, "decision": {"pick": 5, "tie_group": [5, 7, 9]}}
    check, picked = serving_checks.check_tie_group(host, conf)
    assert checked == [5, 7]  # t9 (more settings) is never checked: t7 holds first
    assert picked["winner"] == 7 and picked["tie_group"][0] == 7 and picked["decision"]["pick"] == 7
    assert check["winner_trial"] == 7 and check["verdict"] == "holds"
    assert study.user_attrs[ATTR]["winner"] == 7  # the stored confirmation agrees
    assert conf["winner"] == 5  # the input is untouched

    checked.clear()  # nobody holds: the original pick stands, with its own check
    monkeypatch.setattr(serving_checks, "run_serving_check", lambda host, w, b, force=False: (
        checked.append(w.number), {"winner_trial": w.number, "baseline_trial": 0, "verdict": "trades_away"})[1])
    monkeypatch.setattr(serving_checks, "_store", lambda host, out: checked.append(("stored", out["winner_trial"])))
    check, picked = serving_checks.check_tie_group(host, conf)
    assert picked is conf and check["winner_trial"] == 5 and checked[-1] == ("stored", 5)


def test_a_rerun_of_the_tie_group_check_launches_nothing_and_counts_every_launch(swept):
    """Rerunning the serving check of a finished study's whole tie group reuses every stored
    check; the stored check's launches count every serving-check launch the study made."""
    drv, _, _, _ = swept
    conf = dict(drv.study.user_attrs["confirmation"])
    done = drv.study.user_attrs[serving_checks.ALL_ATTR]
    check = dict(drv.study.user_attrs[serving_checks.ATTR])
    assert check["launches"] == sum(int(v.get("launches") or 0) for v in done.values()) >= 1
    again, conf2 = serving_checks.check_tie_group(_NoLaunch(drv), conf)
    assert again["winner_trial"] == check["winner_trial"] and again["launches"] == check["launches"]
    assert conf2.get("winner") == conf.get("winner")


def test_a_second_member_check_reuses_the_baselines_load_search_and_is_kept(swept):
    """Checking another config against the same baseline launches its level only (the baseline's
    rate is stored); asking again launches nothing. The study's check is restored at the end."""
    drv, _, _, _ = swept
    check = dict(drv.study.user_attrs[serving_checks.ATTR])
    recs = {r.number: r for r in records.load_records(drv.study)}
    other = next(r for r in records.ranked_records(list(recs.values()))
                 if r.number not in (check["winner_trial"], check["baseline_trial"]))
    submit, calls = drv.executor.submit, []

    def counted(*a, **kw):
        calls.append(a)
        return submit(*a, **kw)
    drv.executor.submit = counted
    try:
        got = serving_checks.run_serving_check(drv, other, recs[check["baseline_trial"]])
        assert len(calls) == 1 and got["winner_trial"] == other.number and got["rate_req_s"] == check["rate_req_s"]
        assert got["launches"] == check["launches"] + 1  # every serving-check launch of the study
        again = serving_checks.run_serving_check(drv, other, recs[check["baseline_trial"]])
        assert len(calls) == 1 and again == got
    finally:
        drv.executor.submit = submit
        serving_checks.run_serving_check(drv, recs[check["winner_trial"]], recs[check["baseline_trial"]])
    assert len(calls) == 1 and dict(drv.study.user_attrs[serving_checks.ATTR])["winner_trial"] == check["winner_trial"]


def test_a_winner_only_the_race_measured_is_the_winner_everywhere(tmp_path):
    """The race's descent (``sweep.confirm.descend``) can pick a config no sweep trial measured:
    the console, the findings, the MLflow parent (best trial, deploy command) and its
    confirmation runs (nested under the parent run) all name it, and its launches are booked."""
    from sweeps.app import inprocess
    from sweeps.app.lifecycle import execute
    from sweeps.search.confirm import DERIVED_BASE

    for seed in (1, 0, 2, 3):  # the smoke space is small: not every seed's winner needs the descent
        store = tmp_path / f"s{seed}"
        spec = load_spec(compose_cfg([
            "backend=instant", "sweep=smoke", "sweep.budget.trials=5", "sweep.confirm.top_k=1", "sweep.confirm.repeats=2",
            "sweep.confirm.race=true", "sweep.confirm.max_repeats=4", "sweep.confirm.descend=6",
            "sweep.baseline.cuda_graph_max_bs=512", "sweep.params.cuda_graph_max_bs.choices=[16,64,128,256,512]",
            f"sweep.sampler.seed={seed}", f"backend.emulator.seed={seed}", f"tracking.store_dir={store}",
            f"tracking.findings_dir={store / 'findings'}"]))
        drv = inprocess.InProcessDriver(spec, track=True, findings=True)
        execute(drv)
        conf = drv.study.user_attrs["confirmation"]
        if conf["winner"] >= DERIVED_BASE:
            break
    else:
        pytest.fail("no seed's race picked a config only it measured")
    win = conf["winner"]
    entry = next(e for e in conf["entries"] if e["trial"] == win)
    assert entry["in_study"] is False and win not in {t.number for t in drv.study.trials}
    s = summary_of_study(spec, drv.study)
    assert s.winner == win and s.winner_value.value == pytest.approx(entry["mean"])
    assert f"**t{win}: {entry['mean']:.1f} tok/s**" in spec.findings_path.read_text()
    assert f"(added: t{entry['derived_from']}, {entry['step']})" in spec.findings_path.read_text()
    # every confirmation launch booked, the race's own configs too
    assert s.gpu.confirmations == pytest.approx(sum(x["gpu_s"] for x in conf["launches"]) / 3600)
    assert sum(x["trial"] == win for x in conf["launches"]) == entry["launched"] > 0
    client = MlflowClient(tracking_uri=spec.mlflow_uri)
    exp = client.get_experiment_by_name(spec.sweep.name)
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    parent = next(r for r in runs if r.data.tags.get("servesweep.role") == "study")
    assert parent.data.tags["best_trial"] == str(win) and parent.data.tags["confirmed_trial"] == str(win)
    g = entry["config"]["cuda_graph_max_bs"]
    assert f"--cuda-graph-max-bs-decode {g}" in parent.data.tags["best_launch_command"]
    mine = [r for r in runs if r.data.tags.get("servesweep.role") == "confirmation"
            and r.data.tags.get("confirms_trial") == str(win)]
    assert len(mine) == entry["launched"]
    assert all(r.data.tags["mlflow.parentRunId"] == parent.info.run_id and r.data.tags["step"] == entry["step"]
               for r in mine)


def test_the_summary_answers_the_sweeps_question_per_approach():
    """A sweep comparing approaches (plain decoding vs EAGLE-3) says each one's best against the
    baseline in one line: the winner's value for its approach, the best single measurement of the
    other, and whether it beats the baseline; an approach never measured is said so."""
    from sweeps.config.objective import Objective

    def rec(n, spec, value, **kw):
        r = _rec(n, value=value, **kw)
        return r.model_copy(update={"params": {**r.params, "speculative": spec}})

    recs = [rec(0, "none", 80.0, is_baseline=True), rec(1, "none", 90.0), rec(2, "eagle3", 58.0), rec(3, "eagle3", 60.0)]
    s = build_summary("s", Objective(), recs, approaches=("speculative", ["none", "eagle3"]))
    text = s.approaches_text()
    assert text == ("approaches (speculative): none 90.0 tok/s (t1, the winner, one run), 1.12x baseline; eagle3 best "
                    "60.0 tok/s (t3, one run), 0.75x baseline: does not beat the baseline"), text
    assert text in s.lines() and text in s.markdown()
    # a confirmed winner is said to be a confirmed mean, the other approach's best still one run
    conf = {"winner": 1, "entries": [{"trial": 1, "n": 4, "mean": 89.5, "ci_low": 88.0, "ci_high": 91.0}]}
    confirmed = build_summary("s", Objective(), recs, conf, approaches=("speculative", ["none", "eagle3"]))
    assert "none 89.5 tok/s (t1, the winner, confirmed mean)" in confirmed.approaches_text()
    assert "eagle3 best 60.0 tok/s (t3, one run)" in confirmed.approaches_text()
    alone = build_summary("s", Objective(), recs[:2], approaches=("speculative", ["none", "eagle3"]))
    assert alone.approaches_text().endswith("; eagle3 never measured")
    assert build_summary("s", Objective(), recs).approaches_text() is None  # no approaches: no line


def test_the_console_table_leaves_blank_what_a_config_does_not_have():
    """A plain-decoding config has no acceptance length (not 1.00), and a metric a trial lacks (a
    winner the race added has no single run) is ``-``, never ``nan``."""
    from sweeps.run.progress import _latency_cells

    plain = records.TrialRecord(number=1, state="COMPLETE", params={"speculative": "none"}, status="ok",
                                metrics={"ttft_ms_p50": 83.0, "itl_ms_p50": 11.12, "accept_length": 1.0})
    eagle = plain.model_copy(update={"params": {"speculative": "eagle3"}, "metrics": {"accept_length": 1.666,
                                                                                      "ttft_ms_p50": float("nan")}})
    assert _latency_cells(plain) == ("83", "11.1", "-")
    assert _latency_cells(eagle) == ("-", "-", "1.67")


def test_a_trial_the_sweep_interrupted_is_counted_apart_from_infra_errors():
    from sweeps.config.objective import Objective

    recs = [_rec(0, value=80.0, is_baseline=True), _rec(1, status="infra_error"), _rec(2, status="interrupted")]
    s = build_summary("s", Objective(), recs)
    c = s.counts
    assert (c.launched, c.infra, c.interrupted) == (3, 1, 1)
    assert "3 launched (1 ok, 0 failed, 1 infra, 1 interrupted and re-queued)" in s.counts_text(), s.counts_text()
    assert "interrupted" not in build_summary("s", Objective(), recs[:2]).counts_text()


def test_a_re_question_probe_that_gave_no_answer_is_not_counted_as_reproducing_its_dead_end():
    """A hung server's probe (health_check_failed, a transient class) and a stopped one said nothing
    about their dead ends: the console said 'no answer, the rule stands' while the counts said
    'reproduced'."""
    from sweeps.config.objective import Objective

    q = {records.A_REQUESTION: {"rules": [1]}}
    recs = [_rec(0, value=80.0, is_baseline=True),
            _rec(1, status="failed", probe=q, failure_class="flashinfer_sm120_unsupported", failure_kind="deterministic"),
            _rec(2, status="failed", probe=q, failure_class="health_check_failed", failure_kind="transient"),
            _rec(3, status="interrupted", probe=q), _rec(4, status="ok", probe=q)]
    c = build_summary("s", Objective(), recs).counts
    assert (c.probes, c.probes_passed, c.probes_unanswered) == (4, 1, 2)
    assert c.probes_text() == ("4 re-question probes (1 reproduced its dead end, 1 no longer did, "
                               "2 gave no answer: their rules stand)"), c.probes_text()
    from sweeps.publish.findings.dead_ends import _trials_text

    assert _trials_text([recs[1]]).endswith("it still fails")
    assert _trials_text([recs[2]]).endswith("no answer, the rule stands")  # the findings' dead-end entry too
