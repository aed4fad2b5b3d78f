"""Result types of the emulator model: ``Prediction``, ``FailureScenario``, ``LogEvent``."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

LOG_DATE = "2026-11-29"


@dataclass
class LogEvent:
    """One startup event. ``t_s``: seconds since launch at time_scale 1; ``kind``:
    ``log`` | ``bind`` (HTTP port opens) | ``ready``; ``tag``: ``TP0`` etc. or None (launcher);
    ``raw``: printed without the ``[date time TPn]`` prefix (tracebacks)."""

    t_s: float
    text: str
    kind: str = "log"
    tag: str | None = None
    raw: bool = False


@dataclass
class FailureScenario:
    """How a launch fails. ``exit_code`` as Popen sees it (-9 = SGLang's sigquit self-kill,
    1 = main-process exception, 2 = argparse); ``time_to_failure_s`` at time_scale 1."""

    failure_class: str
    phase: str
    exit_code: int
    time_to_failure_s: float
    signature: str


@dataclass
class Prediction:
    """Result of ``evaluate``. Times in ms unless suffixed; memory in GiB per GPU.

    Attributes:
        outcome: ``ok`` | ``failed``.
        failure: the scenario when failed, else None.
        decode_tok_s: per-request decode rate (tok/s), 0 when failed.
        itl_ms: mean inter-token latency = 1000 / decode_tok_s.
        ttft_ms: prefill + HTTP overhead for ``input_len`` tokens.
        accept_length: τ (1.0 without speculation).
        t_step_ms: one target forward at the decode batch (verify forward with EAGLE).
        t_cycle_ms, t_verify_ms, t_draft_total_ms, verify_share: EAGLE cycle (verify_share
            = t_verify / t_cycle; 1.0 without speculation).
        breakdown_ms: t_mem, t_comm, t_ovh, delta_cg, eager of the decode/verify step.
        startup_s: phase -> seconds (time_scale 1), ``total`` included.
        memory_gib: weights, pool, kv, graph, avail_for_graph, kv_tokens (count).
        allreduce_path: e.g. ``nccl:Ring/LL``, ``custom:pcie``.
        perf_tags: e.g. ``allreduce_path_degraded``.
        events: startup log events up to ready/failure.
        warnings: free-form notes (e.g. forced LL128).
        spec: resolved EAGLE shape and its per-position acceptance (``position_probs``).
    """

    outcome: str
    failure: FailureScenario | None = None
    decode_tok_s: float = 0.0
    itl_ms: float = 0.0
    ttft_ms: float = 0.0
    accept_length: float = 1.0
    t_step_ms: float = 0.0
    t_cycle_ms: float = 0.0
    t_verify_ms: float = 0.0
    t_draft_total_ms: float = 0.0
    verify_share: float = 1.0
    breakdown_ms: dict[str, float] = field(default_factory=dict)
    startup_s: dict[str, float] = field(default_factory=dict)
    memory_gib: dict[str, float] = field(default_factory=dict)
    allreduce_path: str = ""
    perf_tags: list[str] = field(default_factory=list)
    events: list[LogEvent] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    spec: dict[str, Any] = field(default_factory=dict)

    @property
    def log_lines(self) -> list[str]:
        """Events rendered with a synthetic clock starting at 15:00:00 (stable for tests)."""
        return [format_event(e, 54000.0 + e.t_s) for e in self.events if e.kind == "log"]

    def to_dict(self) -> dict[str, Any]:
        """All fields as plain data, plus the rendered ``log_lines``."""
        d = asdict(self)
        d["log_lines"] = self.log_lines
        return d


def format_event(e: LogEvent, epoch_like_s: float, date: str = LOG_DATE) -> str:
    """``[2026-11-29 15:00:01 TP0] text`` (or raw text for traceback lines)."""
    if e.raw:
        return e.text
    s = int(epoch_like_s) % 86400
    stamp = f"{date} {s // 3600:02d}:{s % 3600 // 60:02d}:{s % 60:02d}"
    return f"[{stamp}{' ' + e.tag if e.tag else ''}] {e.text}"
