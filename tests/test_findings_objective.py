"""The findings document and the plots rank, compare and label by the sweep's objective:
a latency to minimise (``ttft_ms_p50``) names the lowest-latency config as best, its ratio
to the baseline is baseline / value, and the plot axes carry the metric and its unit."""

from __future__ import annotations

from types import SimpleNamespace

import optuna
import pytest

from sweeps.config.objective import MetricConstraint, Objective, ObjectiveSet
from sweeps.config.spec import load_spec
from sweeps.publish.findings import objective_of, read_data_block, update_findings
from sweeps.publish.findings.measure import axis, column, unit
from sweeps.publish.plots import by_allreduce_figure, eagle_figure, history_figure, study_objective, write_plots
from sweeps.store import records
from tests.conftest import compose_cfg
from tests.test_findings import FP, _read, _spec

TTFT = Objective("ttft_ms_p50", "minimize")


def lat(n: int, status: str, ttft: float | None, tok: float | None, baseline: bool = False,
        cls: str | None = None, **params) -> records.TrialRecord:
    """A trial with a TTFT (ms) and a decode rate (tok/s): the two objectives disagree."""
    p = {"speculative": "none", "allreduce": "nccl", "cuda_graph_max_bs": 128, **params}
    m = {"ttft_ms_p50": ttft, "decode_tok_s": tok, "accept_length": 1.0} if ttft is not None else {}
    return records.TrialRecord(number=n, state="COMPLETE" if status == "ok" else "PRUNED", params=p, status=status, metrics=m,
                         failure_class=cls, failure_kind="deterministic" if cls else None, is_baseline=baseline,
                         launch_command=f"python -m x --trial {n}", fingerprint=FP, timings={"gpu_s": 60.0})


def latency_sweep() -> list[records.TrialRecord]:
    # t1 has the lowest TTFT; t2 the highest decode rate (the decode_tok_s winner) but the worst TTFT
    return [lat(0, "ok", 400.0, 82.0, baseline=True), lat(1, "ok", 300.0, 80.0, cuda_graph_max_bs=64),
            lat(2, "ok", 500.0, 95.0, allreduce="custom", cuda_graph_max_bs=512),
            lat(3, "ok", 450.0, 70.0, speculative="eagle3"),
            lat(4, "failed", None, None, cls="flashinfer_allreduce_fusion_unsupported_arch", allreduce="flashinfer_fusion")]


def _rows(text: str) -> dict[tuple[str, str], str]:
    out = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if line.startswith("| ") and len(cells) == 7:
            out[(cells[0], cells[1])] = line
    return out


def test_latency_objective_names_the_lowest_latency_config_best(tmp_path):
    spec = _spec(tmp_path)
    doc = update_findings(spec, "lat", latency_sweep(), FP, None, path=tmp_path / "doc.md", objective=TTFT)
    text = _read(doc)
    assert "Objective: `ttft_ms_p50` (minimize, ms)." in text
    assert "**400.0 ms** — " in text  # the baseline, in the objective's unit
    # best = lowest TTFT (t1), not the fastest decode (t2); the ratio is baseline / value
    assert "**t1: 300.0 ms**, **1.33x** better than the baseline" in text and "python -m x --trial 1" in text
    assert "**t2: " not in text
    assert "(decode 80.0 tok/s, TTFT p50" in text  # throughput still shown beside a latency objective
    rows = _rows(text)
    assert "| allreduce | speculative | best ttft_ms_p50 (ms) | speedup |" in text
    assert "300.0 (t1)" in rows[("nccl", "none")] and "1.33x" in rows[("nccl", "none")]
    assert "slower than baseline (0.80x)" in rows[("custom", "none")]  # 500 ms vs 400 ms
    assert "450.0 (t3)" in rows[("nccl", "eagle3")]
    assert "speculative decoding never beat the baseline** (spec_decode_no_speedup): best 450.0 ms = 0.89x in t3" in text
    data = read_data_block(text)
    assert data["baselines"][-1]["objective"] == "ttft_ms_p50" and data["baselines"][-1]["value"] == 400.0
    assert "tok_s" not in data["baselines"][-1]  # a latency is never filed as a throughput
    assert data["sweeps"][-1]["best_trial"] == 1 and data["sweeps"][-1]["best_value"] == 300.0


def test_maximized_objective_still_picks_the_fastest(tmp_path):
    spec = _spec(tmp_path)
    text = _read(update_findings(spec, "thr", latency_sweep(), FP, None, path=tmp_path / "doc.md"))
    assert "Objective: `decode_tok_s` (maximize, tok/s)." in text
    assert "**t2: 95.0 tok/s**, **1.16x** the baseline" in text


def test_drift_compares_only_baselines_of_the_same_objective(tmp_path):
    spec, doc = _spec(tmp_path), tmp_path / "doc.md"
    update_findings(spec, "thr", latency_sweep(), FP, None, path=doc)  # decode_tok_s baseline 82.0
    update_findings(spec, "lat", latency_sweep(), FP, None, path=doc, objective=TTFT)
    text = _read(doc)
    assert "Baseline moved" not in text and "Baseline unchanged" not in text  # 82 tok/s vs 400 ms: not comparable
    assert "| thr |" in text and "95.0 (decode_tok_s)" in text  # the earlier sweep's best, with its own metric
    again = latency_sweep()
    again[0].metrics["ttft_ms_p50"] = 480.0
    update_findings(spec, "lat2", again, FP, None, path=doc, objective=TTFT)
    assert "**Baseline moved: 400.0 -> 480.0 ms (+20.0 %) since sweep `lat`" in _read(doc)


def test_findings_read_the_confirmation_from_the_study_given(tmp_path):
    spec = _spec(tmp_path)
    study = optuna.create_study(study_name="given")
    study.set_user_attr("confirmation", {"winner": None, "winner_note": "t1 did not hold up", "entries": []})
    text = _read(update_findings(spec, study, latency_sweep(), FP, None, path=tmp_path / "doc.md", objective=TTFT))
    assert "## servesweep findings: given" in text and "**Not confirmed:** t1 did not hold up" in text
    # a study name alone: no storage is opened, so no confirmation is invented
    text = _read(update_findings(spec, "given", latency_sweep(), FP, None, path=tmp_path / "doc2.md", objective=TTFT))
    assert "### Confirmation" not in text and "not yet confirmed with repeats" in text


def test_objective_of_a_spec():
    sweep = SimpleNamespace(objective="ttft_ms_p50", direction="minimize", objective_constraints=["itl_ms_p99 <= 30"])
    obj = objective_of(SimpleNamespace(sweep=sweep))
    assert (obj.name, obj.direction, [str(c) for c in obj.constraints]) == ("ttft_ms_p50", "minimize", ["itl_ms_p99 <= 30"])
    given = ObjectiveSet.from_config(["output_tok_s", "decode_tok_s"], "maximize")
    assert objective_of(SimpleNamespace(sweep=sweep, objective_set=given)).name == "output_tok_s"


@pytest.mark.parametrize("name,u", [("decode_tok_s", "tok/s"), ("ttft_ms_p50", "ms"), ("itl_ms_p99", "ms"),
                                    ("accept_length", "tokens"), ("speedup_vs_baseline", "")])
def test_units(name, u):
    assert unit(name) == u


def test_constrained_trial_is_never_best(tmp_path):
    recs = latency_sweep()
    recs[1].metrics["itl_ms_p99"] = 90.0  # t1 violates the constraint
    for r in recs:
        if r.metrics:
            r.metrics.setdefault("itl_ms_p99", 20.0)
    obj = Objective("ttft_ms_p50", "minimize", (MetricConstraint.parse("itl_ms_p99 <= 50"),))
    text = _read(update_findings(_spec(tmp_path), "c", recs, FP, None, path=tmp_path / "doc.md", objective=obj))
    assert "**t0: 400.0 ms**" in text  # the baseline, the best config that meets the constraint


def test_plots_are_labelled_with_the_objective():
    recs = latency_sweep()
    fig = history_figure(recs, TTFT)
    ax = fig.axes[0]
    assert ax.get_ylabel() == axis(TTFT) == "ttft_ms_p50 (ms, lower is better)"
    best_line = next(line for line in ax.get_lines() if line.get_label() == "best so far (unconfirmed)")
    assert list(best_line.get_ydata()) == [400.0, 300.0, 300.0, 300.0]  # running minimum over t0..t3
    bar = by_allreduce_figure(recs, ["nccl", "custom", "flashinfer_fusion"], TTFT)
    assert bar.axes[0].get_ylabel().startswith("ttft_ms_p50 (ms, lower is better)")
    heights = sorted(round(p.get_height()) for p in bar.axes[0].patches if p.get_height() > 0)
    assert heights == [300, 450, 500]  # the nccl bar is its lowest TTFT (300), not its highest (400)
    assert eagle_figure(recs, TTFT).axes[1].get_ylabel() == "ttft_ms_p50 (ms, lower is better)"
    assert history_figure(recs).axes[0].get_ylabel() == "decode tok/s (batch 1)"  # the default wording is kept
    assert column(TTFT) == "ttft_ms_p50 (ms)" and column(Objective()) == "tok/s"


def test_write_plots_takes_the_objective_from_the_study(tmp_path):
    study = optuna.create_study(direction="minimize")
    study.set_metric_names(["ttft_ms_p50"])
    assert study_objective(study) == TTFT
    dist = {"allreduce": optuna.distributions.CategoricalDistribution(["nccl", "custom"])}
    for i, v in enumerate([400.0, 300.0]):
        t = study.ask(dist)
        t.set_user_attr("status", "ok")
        t.set_user_attr("metrics", {"ttft_ms_p50": v, "decode_tok_s": 80.0})
        t.set_user_attr("is_baseline", i == 0)
        study.tell(t, v)
    names = {p.name for p in write_plots(study, tmp_path / "plots")}
    assert {"optimization_history.png", "toks_by_allreduce_speculation.png", "failures_by_class.png"} <= names


def test_the_sweep_config_selects_the_objective(tmp_path):
    """``sweep.objective=ttft_ms_p50 sweep.direction=minimize`` alone (no objective passed)."""
    spec = load_spec(compose_cfg(["sweep=smoke", f"tracking.store_dir={tmp_path / 'store'}",
                                  "sweep.objective=ttft_ms_p50", "sweep.direction=minimize"]))
    assert objective_of(spec) == TTFT
    text = _read(update_findings(spec, "lat", latency_sweep(), FP, None, path=tmp_path / "doc.md"))
    assert "Objective: `ttft_ms_p50` (minimize, ms)." in text and "**t1: 300.0 ms**, **1.33x** better than the baseline" in text
