"""What a reader sees: the findings in MLflow without markers, ``make ui`` returning once the
server answers, the plots (history ending at the confirmed value, load curves zoomed with
unique labels, every plot listed) and the Pareto sweep's front (several configs, on the console)."""

from __future__ import annotations

import http.server
import logging
import socket
import subprocess
import sys
import threading

import pytest

from sweeps.app.inprocess import run_in_process
from sweeps.config.objective import ObjectiveSet
from sweeps.config.spec import load_spec
from sweeps.publish.findings.context import Context
from sweeps.publish.findings.document import BEGIN, END, without_markers
from sweeps.publish.findings.load import curve, front_of
from sweeps.publish.findings.next_steps import plot_links
from sweeps.publish.outputs import front_lines
from sweeps.publish.plots import history_figure, write_plots
from sweeps.publish.plots_load import _label, curves_figure, zoom_limit
from sweeps.store import records as trial_records
from sweeps.ui import answers, wait_ready
from tests.conftest import compose_cfg


def _rec(n, params, metrics, status="ok", baseline=False):
    return trial_records.TrialRecord(n, "COMPLETE", params, status, metrics, is_baseline=baseline)


def test_the_mlflow_copy_of_the_findings_has_no_markers():
    doc = ("# my notes\n\n" + BEGIN + "\n<!-- servesweep:generated: edits inside ... -->\n## Findings\n\nbody\n"
           '<!-- servesweep:data {"a": 1} -->\n' + END + "\n\nafter\n")
    out = without_markers(doc)
    assert "servesweep" not in out and "<!--" not in out
    assert out == "# my notes\n\n## Findings\n\nbody\n\nafter\n"


class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - the stdlib's name
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
        self.wfile.write(b"OK")

    def log_message(self, *a):
        pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ui_waits_until_the_server_answers_and_reports_one_that_died():
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert not answers(url)
        srv = http.server.HTTPServer(("127.0.0.1", port), _Health)
        threading.Timer(1.0, lambda: threading.Thread(target=srv.serve_forever, daemon=True).start()).start()
        wait_ready(url, sleeper, timeout_s=20)  # returns only once /health answers (after ~1 s)
        assert answers(url)
        srv.shutdown()
        srv.server_close()
    finally:
        sleeper.kill()
        sleeper.wait()
    dead = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    dead.wait()
    with pytest.raises(RuntimeError, match="exited with code 3 before answering"):
        wait_ready(f"http://127.0.0.1:{_free_port()}", dead, timeout_s=5)


def test_history_best_so_far_ends_at_the_confirmed_value_not_a_single_measurement():
    recs = [_rec(0, {"speculative": "none"}, {"decode_tok_s": 82.0}, baseline=True),
            _rec(1, {"speculative": "none"}, {"decode_tok_s": 92.0}),  # a lucky single run
            _rec(2, {"speculative": "none"}, {"decode_tok_s": 90.0})]
    fig = history_figure(recs, confirmed=(2, 89.9, 89.5, 90.3))
    ax = fig.axes[0]
    step = next(line for line in ax.get_lines() if line.get_label() == "best single measurement so far")
    assert step.get_ydata()[-1] == pytest.approx(92.0)  # the single measurements' best so far...
    tail = next(line for line in ax.get_lines() if line.get_linestyle() == ":")
    assert tail.get_ydata()[-1] == pytest.approx(89.9)  # ...ends at the confirmed mean
    labels = ax.get_legend_handles_labels()[1]
    assert "confirmed winner t2: 89.9 [89.5, 90.3]" in labels and "best single measurement so far" in labels
    unconfirmed = history_figure(recs).axes[0].get_legend_handles_labels()[1]
    assert "best so far (unconfirmed)" in unconfirmed


def _curve(levels):
    m = {}
    for i, (rate, met) in enumerate(levels):
        m |= {f"load_rate_req_s_L{i}": rate, f"load_ttft_ms_p99_L{i}": 500.0 * rate, f"load_tpot_ms_p99_L{i}": 40.0 * rate,
              f"load_met_L{i}": float(met)}
    return m


def test_load_curves_zoom_to_the_answer_and_label_every_config_apart():
    base = {"speculative": "none", "allreduce": "nccl", "cuda_graph_max_bs": 64, "nccl_algo": "default",
            "nccl_proto": "default", "moe_a2a_backend": "none"}
    recs = [_rec(0, base, {"max_rate_at_slo_req_s": 2.65, **_curve([(2.0, True), (2.65, True), (4.32, False),
                                                                     (11.3, False), (64.0, False)])}),
            _rec(1, {**base, "nccl_proto": "LL"}, {**_curve([(2.65, False), (64.0, False)])}),
            _rec(2, {**base, "nccl_algo": "Ring", "nccl_proto": "LL"}, {**_curve([(2.0, True), (64.0, False)])})]
    rows = [(r, curve(r)) for r in recs]
    assert zoom_limit(recs, rows) == pytest.approx(5.3)
    fig = curves_figure(recs)
    assert fig.axes[0].get_xlim()[1] == pytest.approx(5.3)
    labels = [_label(r) for r in recs]
    assert labels == ["t0 none nccl g64", "t1 none nccl g64 proto=LL", "t2 none nccl g64 algo=Ring proto=LL"]
    colors = {tuple(line.get_color()) if not isinstance(line.get_color(), str) else line.get_color()
              for line in fig.axes[0].get_lines()[:3]}
    assert len(colors) == 3
    # nothing to zoom when the answer's region already spans the levels
    near = _rec(3, base, {"max_rate_at_slo_req_s": 2.0, **_curve([(2.0, True), (3.0, False)])})
    assert zoom_limit([near], [(near, curve(near))]) is None


def test_plot_list_names_the_load_and_pareto_plots_before_they_are_drawn(tmp_path):
    recs = [_rec(0, {"speculative": "none"}, {"max_rate_at_slo_req_s": 2.0, **_curve([(2.0, True)]),
                                              "a": 1.0, "b": 2.0})]
    ctx = Context(study="s", plots_dir=tmp_path / "plots", findings_path=tmp_path / "findings.md",
                  objectives=ObjectiveSet.from_config(["a", "b"], ["maximize", "minimize"]))
    text = "\n".join(plot_links(ctx, recs))
    assert "throughput_latency_curves.png" in text and "pareto_front.png" in text
    assert "optimization_history.png" in text
    # once the plots are drawn (and one more is on disk) the list keeps its order, the extra after it
    (tmp_path / "plots").mkdir()
    for name in ["zz_extra.png", "a_first_by_name.png", "pareto_front.png", "optimization_history.png"]:
        (tmp_path / "plots" / name).write_bytes(b"")
    again = "\n".join(plot_links(ctx, recs))
    assert again.split(", [a_first_by_name]")[0] == text.split(" (written by")[0], (text, again)
    assert again.index("[a_first_by_name]") < again.index("[zz_extra]")


@pytest.mark.timeout(900)  # 16 instant trials: ~1 min on 2 idle cores, 4 min on a loaded box
def test_the_shipped_pareto_sweep_has_a_front_of_several_configs_and_prints_it(tmp_path, capsys, caplog):
    store = tmp_path / "store"
    drv = run_in_process(load_spec(compose_cfg(["sweep=pareto_tput_latency", "sweep.budget.wall_time_s=null",
                                                f"tracking.store_dir={store}",
                                                f"tracking.findings_dir={store / 'findings'}"])))
    objs = drv.spec.objective_set
    recs = trial_records.load_records(drv.study)
    front = front_of(recs, objs.names, objs.directions)
    assert len(front) >= 3, [(r.number, [r.metrics.get(n) for n in objs.names]) for r in recs]
    assert len({r.params["max_running_requests"] for r in front}) >= 3  # the lever between the two
    out = capsys.readouterr().out
    assert f"Pareto front ({len(front)} configs: output_tok_s_c64 maximize, tpot_ms_p50_c64 minimize):" in out
    assert front_lines(recs, objs)[1].startswith(f"  t{front[0].number}  ")
    print("\n".join(front_lines(recs, objs)), file=sys.stderr)  # shown with -s / on failure
    with caplog.at_level(logging.INFO, logger="servesweep.report"):
        written = {p.name for p in write_plots(drv.study, tmp_path / "plots", records=recs)}
    assert {"pareto_front.png", "optimization_history.html"} <= written
    assert "unavailable" not in caplog.text  # Optuna's history of a multi-objective study needs a target
