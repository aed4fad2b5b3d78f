"""The findings document: notes outside the section survive, malformed sections are
recreated once, baseline drift across sweeps is called out, a killed driver leaves a
current, well-formed document."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from sweeps.config.spec import load_spec
from sweeps.publish.findings import BEGIN, END, find_sections, read_data_block, splice_section, update_findings
from sweeps.store import records
from tests.conftest import REPO, compose_cfg

FP = {"gpu_arch": "sm_120", "driver": "580.95.05", "cuda": "12.9", "nccl": "2.27.7", "torch": "2.9.1",
      "sglang": "0.5.23", "flashinfer": "0.5.3"}
NOTES_ABOVE = "# Kimi on the PCIe box\n\nOur notes: *do not* touch NCCL_P2P_LEVEL.\r\n\n"
NOTES_BELOW = "\n## Next steps (hand-written)\n\n- ask vendor about SM120 FlashInfer\n- trailing spaces   \n"


def _spec(tmp_path: Path, study: str = "smoke"):
    return load_spec(compose_cfg(["sweep=smoke", f"tracking.store_dir={tmp_path / 'store'}",
                                  f"tracking.findings_dir={tmp_path / 'findings'}", f"study_name={study}"]))


def rec(n: int, status: str, tok: float | None = None, baseline: bool = False, cls: str | None = None,
        tags: list[str] | None = None, **params) -> records.TrialRecord:
    p = {"speculative": "none", "allreduce": "nccl", "cuda_graph_max_bs": 128, **params}
    return records.TrialRecord(number=n, state="COMPLETE" if status == "ok" else "PRUNED", params=p, status=status,
                         metrics={"decode_tok_s": tok, "accept_length": 1.0} if tok is not None else {},
                         failure_class=cls, failure_kind="deterministic" if cls else None,
                         failure_signature=f"signature of {cls}" if cls else None, phase="startup" if cls else None,
                         perf_tags=tags or [], is_baseline=baseline, launch_command=f"python -m x --trial {n}",
                         fingerprint=FP, timings={"gpu_s": 80.0})


def sweep_a() -> list[records.TrialRecord]:
    return [rec(0, "ok", 82.0, baseline=True, cuda_graph_max_bs=512), rec(1, "ok", 80.5, allreduce="custom",
            tags=[records.DEGRADED], cuda_graph_max_bs=512),
            rec(2, "failed", cls="flashinfer_allreduce_fusion_unsupported_arch", allreduce="flashinfer_fusion",
                cuda_graph_max_bs=512),
            rec(3, "ok", 88.0, cuda_graph_max_bs=64)]


def sweep_b() -> list[records.TrialRecord]:
    return [rec(0, "ok", 89.5, baseline=True, cuda_graph_max_bs=128), rec(1, "ok", 91.0, cuda_graph_max_bs=64),
            rec(2, "failed", cls="flashinfer_allreduce_fusion_unsupported_arch", allreduce="flashinfer_fusion")]


def _read(p: Path) -> str:
    return p.read_bytes().decode()


def _write(p: Path, text: str) -> None:
    p.write_bytes(text.encode())


def _section(text: str) -> str:
    spans = find_sections(text)
    assert len(spans) == 1, spans
    return text[spans[0][0]:spans[0][1]]


def test_notes_around_the_section_survive_two_sweeps_byte_for_byte(tmp_path):
    spec_a, spec_b = _spec(tmp_path, "smoke"), _spec(tmp_path, "smoke")
    doc = spec_a.findings_path
    doc.parent.mkdir(parents=True)
    doc.write_bytes((NOTES_ABOVE + BEGIN + "\nold generated text\n" + END + "\n" + NOTES_BELOW).encode())
    update_findings(spec_a, "smoke-a", sweep_a(), FP, None, path=doc)
    first = doc.read_bytes().decode()
    assert first.startswith(NOTES_ABOVE) and first.endswith(NOTES_BELOW)
    assert "old generated text" not in first
    update_findings(spec_b, "smoke-b", sweep_b(), FP, None, path=doc)
    second = doc.read_bytes().decode()
    assert second.startswith(NOTES_ABOVE) and second.endswith(NOTES_BELOW)
    assert second.count(BEGIN) == 1 and second.count(END) == 1
    sec = _section(second)
    assert second == NOTES_ABOVE + sec + NOTES_BELOW
    assert "smoke-b" in sec and "| smoke-a |" in sec  # the earlier sweep is remembered


def test_baseline_drift_between_sweeps_is_called_out(tmp_path):
    spec = _spec(tmp_path)
    doc = tmp_path / "doc.md"
    update_findings(spec, "campaign-1", sweep_a(), FP, None, path=doc)
    assert "Baseline moved" not in _read(doc)
    update_findings(spec, "campaign-2", sweep_b(), FP, None, path=doc)
    text = _read(doc)
    assert "**Baseline moved: 82.0 -> 89.5 tok/s (+9.1 %) since sweep `campaign-1`" in text
    assert "cuda_graph_max_bs 512 -> 128" in text
    hist = read_data_block(text)["baselines"]
    assert [(e["study"], e["tok_s"]) for e in hist] == [("campaign-1", 82.0), ("campaign-2", 89.5)]
    # speedups are against the baseline measured in the same sweep (89.5), not the old one
    assert "**t1: 91.0 tok/s**, **1.02x** the baseline" in text


def test_unchanged_baseline_and_environment_change(tmp_path):
    spec = _spec(tmp_path)
    doc = tmp_path / "doc.md"
    update_findings(spec, "s1", sweep_b(), FP, None, path=doc)
    again = sweep_b()
    again[0].metrics["decode_tok_s"] = 90.0  # +0.6 %: noise
    update_findings(spec, "s2", again, FP, None, path=doc)
    assert "Baseline unchanged within ±3 % since sweep `s1` (89.5 -> 90.0 tok/s)" in _read(doc)
    upgraded = {**FP, "sglang": "0.5.24"}
    update_findings(spec, "s3", sweep_b(), upgraded, None, path=doc)
    assert "environment changed: sglang 0.5.23 -> 0.5.24" in _read(doc)


def test_file_without_markers_gets_the_section_appended(tmp_path):
    spec = _spec(tmp_path)
    doc = tmp_path / "doc.md"
    _write(doc, "just notes, no newline at end")
    update_findings(spec, "s", sweep_a(), FP, None, path=doc)
    text = _read(doc)
    assert text.startswith("just notes, no newline at end\n\n" + BEGIN)
    assert text.endswith(END + "\n")


@pytest.mark.parametrize("broken", [
    NOTES_ABOVE + BEGIN + "\nhalf a section, end marker deleted\n",                 # lone begin, no data line
    NOTES_ABOVE + END + "\n" + NOTES_BELOW,                                          # lone end
    NOTES_ABOVE + BEGIN + "\nA\n" + END + "\nmiddle\n" + BEGIN + "\nB\n" + END + "\n" + NOTES_BELOW,  # two sections
])
def test_malformed_sections_are_recreated_once(tmp_path, broken):
    spec = _spec(tmp_path)
    doc = tmp_path / "doc.md"
    _write(doc, broken)
    update_findings(spec, "s", sweep_a(), FP, None, path=doc)
    text = _read(doc)
    assert text.count(BEGIN) == 1 and text.count(END) == 1
    assert text.startswith(NOTES_ABOVE)
    assert "half a section" not in text and "\nA\n" not in text and "\nB\n" not in text
    if NOTES_BELOW in broken:
        assert text.endswith(NOTES_BELOW)
    update_findings(spec, "s", sweep_a(), FP, None, path=doc)
    assert _read(doc).count(BEGIN) == 1


def test_lone_begin_keeps_the_notes_after_its_generated_data_line(tmp_path):
    spec = _spec(tmp_path)
    doc = tmp_path / "doc.md"
    update_findings(spec, "s", sweep_a(), FP, None, path=doc)
    good = _read(doc)
    _write(doc, NOTES_ABOVE + good.replace(END + "\n", "") + NOTES_BELOW)  # someone deleted the end marker
    update_findings(spec, "s", sweep_a(), FP, None, path=doc)
    text = _read(doc)
    assert text.startswith(NOTES_ABOVE) and text.endswith(NOTES_BELOW) and text.count(BEGIN) == 1


def test_section_contents(tmp_path):
    spec = _spec(tmp_path)
    doc = tmp_path / "doc.md"
    update_findings(spec, "s", sweep_a(), FP, None, path=doc)
    text = _read(doc)
    # environment
    assert "rtx_pro_6000x8" in text and "kimi_k25_eagle3" in text and "sglang 0.5.23" in text
    # best: the degraded custom trial never wins as "custom"; best is t3
    assert "**t3: 88.0 tok/s**, **1.07x** the baseline" in text and "python -m x --trial 3" in text
    rows = {line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("| ") and "| none |" in line}
    assert set(rows) == {"nccl", "custom", "flashinfer_fusion"}  # every allreduce level of the space
    assert "works" in rows["nccl"] and "88.0 (t3)" in rows["nccl"]
    assert "silently falls back to NCCL" in rows["custom"]
    assert "fails: flashinfer_allreduce_fusion_unsupported_arch (t2)" in rows["flashinfer_fusion"]
    assert "signature of flashinfer_allreduce_fusion_unsupported_arch" in text  # dead-end evidence
    assert "`cuda_graph_max_bs`: never launched: 128" in text  # untried


def test_splice_is_identity_outside_the_section():
    text = "a\n" + BEGIN + "\nx\n" + END + "\nb"
    assert splice_section(text, BEGIN + "\ny\n" + END + "\n") == "a\n" + BEGIN + "\ny\n" + END + "\nb"


@pytest.mark.slow
def test_document_is_current_after_a_driver_kill(tmp_path):
    """SIGKILL the driver mid-sweep: the document is whole, has one section, keeps the
    notes, and counts what storage says was finished at its last write."""
    store, findings = tmp_path / "store", tmp_path / "findings"
    doc = findings / "eagle3_allreduce.md"
    findings.mkdir()
    _write(doc, NOTES_ABOVE + NOTES_BELOW)
    cmd = [sys.executable, str(REPO / "run_sweep.py"), "backend=instant", "sweep.budget.trials=200",
           "sweep.budget.max_asks=2000", "sweep.budget.wall_time_s=600", f"tracking.store_dir={store}",
           f"tracking.findings_dir={findings}"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    p = subprocess.Popen(cmd, cwd=str(tmp_path), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                         start_new_session=True)
    try:
        t0 = time.monotonic()
        deadline = t0 + 150
        launched = 0
        while time.monotonic() < deadline and p.poll() is None:
            text = _read(doc)
            sweeps = read_data_block(text).get("sweeps") or [{}]
            launched = sweeps[-1].get("launched", 0)
            if launched >= 4:
                break
            time.sleep(0.2)
        assert p.poll() is None, "the sweep ended before it could be killed"
        assert launched >= 4, "the findings document was not updated during the sweep"
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        p.wait(30)
    text = _read(doc)
    assert text.startswith(NOTES_ABOVE + NOTES_BELOW + "\n" + BEGIN)  # appended, nothing lost
    sec = _section(text)
    assert sec.startswith(BEGIN) and sec.rstrip().endswith(END)
    data = read_data_block(text)
    study = optuna.load_study(study_name="eagle3_allreduce", storage=f"sqlite:///{store / 'optuna.db'}")
    recs = records.load_records(study)
    finished = sum(r.budgeted for r in recs if r.state != "RUNNING")  # the counts line's launches
    doc_launched = data["sweeps"][-1]["launched"]
    # the last write happened after the last finished trial, or one trial was told but not yet written
    assert finished - 1 <= doc_launched <= finished
    base = records.baseline_value(recs)
    assert data["baselines"][-1]["tok_s"] == pytest.approx(base, abs=1e-3)
    assert json.dumps(data)  # parseable, complete
