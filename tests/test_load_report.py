"""Serving-under-load reporting: the shipped goodput / Pareto sweep configs validate, the curves,
Pareto front and speculative break-even (plots with their axis labels, findings section,
parent-run metrics), the incumbent passed to a trial's bench."""

from __future__ import annotations

import optuna
import pytest

from sweeps.config.objective import ObjectiveSet
from sweeps.config.spec import load_spec
from sweeps.publish.findings.load import break_even, break_even_metrics, concurrency_levels, curve, front_of, load_section
from sweeps.publish.plots_load import curves_figure, pareto_figure, speedup_figure, write_load_plots
from sweeps.search.load_objective import incumbent_rate, with_incumbent
from sweeps.store import records as trial_records
from tasks.types import BenchSpec, LoadSearchSpec
from tests.conftest import compose_cfg


def _rec(n, params, metrics, baseline=False, status="ok"):
    return trial_records.TrialRecord(number=n, state="COMPLETE", params=params, status=status, metrics=metrics,
                                     is_baseline=baseline)


def _curve(levels):
    m = {}
    for i, (rate, ttft, tpot, met) in enumerate(levels):
        m |= {f"load_rate_req_s_L{i}": rate, f"load_ttft_ms_p99_L{i}": ttft, f"load_tpot_ms_p99_L{i}": tpot,
              f"load_met_L{i}": float(met), f"load_goodput_req_s_L{i}": rate * 0.9}
    return m


PLAIN = {"speculative": "none", "allreduce": "nccl", "cuda_graph_max_bs": 512}
EAGLE = {"speculative": "eagle3", "allreduce": "nccl", "cuda_graph_max_bs": 128}
CONC_BASE = {"output_tok_s_c1": 85.0, "output_tok_s_c4": 300.0, "output_tok_s_c16": 900.0, "output_tok_s_c64": 1800.0}
CONC_EAGLE = {"output_tok_s_c1": 150.0, "output_tok_s_c4": 420.0, "output_tok_s_c16": 800.0, "output_tok_s_c64": 1200.0}


def records():
    return [
        _rec(0, PLAIN, {"max_rate_at_slo_req_s": 2.6, "max_rate_at_slo_bracket_rel": 0.27,
                        **_curve([(2.0, 500, 40, True), (2.6, 560, 46, True), (3.3, 900, 60, False)]), **CONC_BASE,
                        "output_tok_s_per_gpu": 110.0, "tok_s_per_user": 40.0}, baseline=True),
        _rec(1, EAGLE, {"max_rate_at_slo_req_s_upper": 2.6, "max_rate_at_slo_req_s_censored": 1.0,
                        **_curve([(2.6, 560, 74, False)]), **CONC_EAGLE,
                        "output_tok_s_per_gpu": 70.0, "tok_s_per_user": 60.0}),
        _rec(2, {**PLAIN, "cuda_graph_max_bs": 8}, {"output_tok_s_per_gpu": 100.0, "tok_s_per_user": 35.0}),
        _rec(3, {**PLAIN, "allreduce": "custom"}, {}, status="failed"),
    ]


def test_shipped_goodput_and_pareto_sweeps_validate():
    spec = load_spec(compose_cfg(["sweep=goodput_slo"]))
    b = spec.bench_spec()
    assert spec.sweep.objective == "max_rate_at_slo_req_s" and spec.backend.kind == "emulated"
    assert (b.slo.ttft_ms_p99, b.slo.tpot_ms_p99) == (2000.0, 50.0)
    assert b.load_search.max_levels <= 7 and b.workload["dataset"]["format"] == "jsonl"
    assert "eagle_num_draft_tokens" in spec.sweep.params and spec.sweep.budget.trials >= 5
    pf = load_spec(compose_cfg(["sweep=pareto_tput_latency"]))
    assert pf.objective_set.multi and pf.backend.kind == "instant"
    assert load_spec(compose_cfg([])).bench_spec().workload is None  # decode_single_stream unchanged


def test_bad_workload_is_named_at_config_time():
    with pytest.raises(ValueError) as e:
        load_spec(compose_cfg(["sweep=goodput_slo", "bench.workload.num_requests=0", "bench.load_search.max_levels=11"]))
    assert "bench.workload.num_requests" in str(e.value) and "bench.load_search.max_levels" in str(e.value)


def test_curve_front_and_break_even():
    recs = records()
    assert [p["rate_req_s"] for p in curve(recs[0])] == [2.0, 2.6, 3.3]
    assert curve(recs[0])[2]["met"] is False and curve(recs[0])[1]["tpot_ms_p99"] == 46
    front = front_of(recs, ["output_tok_s_per_gpu", "tok_s_per_user"], ["maximize", "maximize"])
    assert [r.number for r in front] == [0, 1]  # t2 is dominated by t0
    be = break_even(concurrency_levels(recs[1]), concurrency_levels(recs[0]))
    assert be["below_at"] == 16 and be["last_above"] == 4
    assert 4 < be["crossing"] < 16
    assert be["speedups"][1] == pytest.approx(150 / 85)
    m = break_even_metrics(recs)
    assert m["spec_break_even_concurrency_t1"] == 16.0 and m["spec_speedup_t1_c64"] == pytest.approx(1200 / 1800)


def test_findings_section_shows_curves_break_even_and_front():
    class Ctx:
        objectives = ObjectiveSet.from_config(["output_tok_s_per_gpu", "tok_s_per_user"], ["maximize", "maximize"])

    text = "\n".join(load_section(Ctx(), records()))
    assert "### Serving under load" in text and "Throughput–latency curves" in text
    assert "2.60 ✓ → 560.0 / 46.0" in text and "3.30 ✗" in text
    assert "falls below 1 at" in text and "c16 (crosses 1 near" in text
    assert "#### Pareto front" in text and "| t2 |" not in text.split("#### Pareto front")[1]
    assert load_section(Ctx(), [_rec(0, PLAIN, {"decode_tok_s": 80.0}, baseline=True)]) == []


def test_plots_exist_with_axis_labels(tmp_path):
    recs = records()
    fig = curves_figure(recs, {"ttft_ms_p99": 2000})
    assert [ax.get_xlabel() for ax in fig.axes] == ["offered request rate (req/s)"] * 2
    assert [ax.get_ylabel() for ax in fig.axes] == ["p99 TTFT (ms)", "p99 TPOT (ms)"]
    pf = pareto_figure(recs, ["output_tok_s_per_gpu", "tok_s_per_user"], ["maximize", "maximize"])
    assert pf.axes[0].get_xlabel() == "output_tok_s_per_gpu (tok/s, maximize)"
    assert pf.axes[0].get_ylabel() == "tok_s_per_user (tok/s, maximize)"
    sf = speedup_figure(recs)
    assert sf.axes[0].get_xlabel() == "concurrency (requests in flight)"
    assert "speedup" in sf.axes[0].get_ylabel()
    study = optuna.create_study(directions=["maximize", "maximize"])
    study.set_metric_names(["output_tok_s_per_gpu", "tok_s_per_user"])
    paths = write_load_plots(study, recs, tmp_path)
    assert sorted(p.name for p in paths) == ["pareto_front.png", "speculative_speedup_by_concurrency.png",
                                             "throughput_latency_curves.png"]
    assert all(p.stat().st_size > 5000 for p in paths)
    named_by_identity = optuna.create_study(directions=["maximize", "maximize"])  # as the driver leaves it
    named_by_identity.set_user_attr("identity", {"objective": "output_tok_s_per_gpu maximize, tok_s_per_user maximize"})
    assert "pareto_front.png" in [p.name for p in write_load_plots(named_by_identity, recs, tmp_path / "id")]
    single = optuna.create_study(direction="maximize")
    assert [p.name for p in write_load_plots(single, recs[2:], tmp_path / "none")] == []


def test_incumbent_and_mlflow_keys():
    from tasks.trial_load import load_metric_names

    recs = records()
    assert incumbent_rate(recs) == 2.6 and incumbent_rate(recs[1:]) is None
    bench = BenchSpec(workload={"num_requests": 4}, load_search=LoadSearchSpec(1.0, 8.0, max_levels=3))
    objs = ObjectiveSet.from_config("max_rate_at_slo_req_s")
    assert with_incumbent(bench, lambda: recs, objs).incumbent_rate == 2.6
    assert with_incumbent(bench, lambda: recs, ObjectiveSet.from_config("decode_tok_s")).incumbent_rate is None
    keys = load_metric_names(bench)  # what a load-search trial adds (all of it reaches MLflow)
    assert {"max_rate_at_slo_req_s", "goodput_req_s", "ttft_ms_p99", "tpot_ms_p99", "load_rate_req_s_L2"} <= keys
    assert all("@" not in k for k in keys)  # MLflow rejects '@' in metric names


def test_censored_rate_reads_as_bounds_everywhere():
    """A trial whose load search stopped at the incumbent's rate: the findings, the run name,
    the MLflow tag and Optuna see ``< 2.60 req/s`` (an upper bound, infeasible), never 0.0."""
    from sweeps.config.objective import Objective
    from sweeps.search.load_objective import derived
    from sweeps.store import study as study_store
    from sweeps.store.tracking import run_label

    recs = records()
    text = "\n".join(load_section(None, recs))
    row1 = next(line for line in text.splitlines() if line.startswith("| t1 |"))
    assert "< 2.60 req/s" in row1 and "0.00" not in row1.split("|")[3]
    assert "| 27.0 % |" in next(line for line in text.splitlines() if line.startswith("| t0 |"))
    obj = Objective("max_rate_at_slo_req_s", "maximize")
    assert run_label(recs[1], obj).endswith("· max_rate_at_slo_req_s < 2.60 req/s")
    assert trial_records.value_of(recs[1], obj) is None  # never ranked, never in the ANOVA
    objs = ObjectiveSet.from_config("max_rate_at_slo_req_s")
    v = study_store.verdict_for("ok", metrics=recs[1].metrics, objectives=objs)
    assert v.state == optuna.trial.TrialState.COMPLETE and v.values == (2.6,) and v.constraint == 1.0
    assert study_store.verdict_for("ok", metrics={"ttft_ms_p99": 1.0}, objectives=objs) is study_store.IGNORED
    spec = load_spec(compose_cfg(["sweep=goodput_slo"]))
    assert "max_rate_at_slo_req_s" not in derived(recs[1].metrics, spec)  # censored is not missing
    fig = curves_figure(recs)
    assert any("(< 2.60 req/s)" in t.get_text() for t in fig.axes[1].get_legend().get_texts())


def test_console_summary_lists_a_censored_rate_by_its_bound(tmp_path):
    import io

    from rich.console import Console

    from sweeps.config.objective import Objective
    from sweeps.run.progress import Progress

    buf = io.StringIO()
    p = Progress("goodput_slo", 12, console=Console(file=buf, width=200),
                 objective=Objective("max_rate_at_slo_req_s", "maximize"))
    recs = records()
    p.summary(recs, recs[0], 2.6, None, tmp_path / "f.md")
    out = buf.getvalue()
    row = next(line for line in out.splitlines() if "eagle3" in line)
    assert "< 2.60 req/s" in row and "0.0 " not in row


def test_the_console_line_of_a_censored_rate_names_its_bound(tmp_path):
    """A goodput trial whose load search stopped at a bound prints the bound, not a blank
    'not benchmarked' reason."""
    from sweeps.config.spec import load_spec
    from sweeps.publish.outputs import Publisher
    from tasks.types import TrialResult
    from tests.conftest import compose_cfg

    spec = load_spec(compose_cfg(["backend=instant", "sweep=goodput_slo", f"tracking.store_dir={tmp_path}"]))
    pub = Publisher(spec, "s", track=False, findings=False)
    lines: list[str] = []
    pub.progress.event = lines.append
    res = TrialResult(trial_number=1, status="ok")
    pub.trial_done(1, dict(spec.sweep.baseline), res, {"max_rate_at_slo_req_s_upper": 2.9,
                                                       "max_rate_at_slo_req_s_censored": 1.0})
    assert lines and "< 2.90 req/s (censored" in lines[0] and "not benchmarked" not in lines[0]
