"""Instant mode (``backend=instant``): the emulator's model evaluated in-process, no server.

What a trial on the emulated node would measure and cost (:func:`tasks.emulator.instant.simulate`),
in microseconds of CPU: for driver benchmarks and for pricing a sweep.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from tasks.backends.emulated import EmulatedBackend
from tasks.backends.lifecycle import launch_command, new_result, tail
from tasks.emulator.instant import simulate
from tasks.failures import KIND, classify
from tasks.redact import redact_text
from tasks.types import TrialResult, TrialSpec


class InstantBackend(EmulatedBackend):
    """The emulated node's flags and profile; trials are evaluated, not launched."""

    kind = "instant"
    launches_server = False
    ports = ()
    #: :func:`tasks.emulator.instant.simulate`'s metrics (no per-request records: no quality metrics)
    bench_metrics = frozenset({"decode_tok_s", "output_tok_s", "ttft_ms_p50", "itl_ms_p50", "itl_ms_p99",
                               "accept_length", "e2e_s_p50"})

    def validate(self, argvs: list[list[str]], backend_cfg: Mapping[str, Any]) -> list[dict[str, Any]] | None:
        """Not validated with SGLang's parser: nothing is launched (the model parses the flags)."""
        return None

    def run_trial(self, spec: TrialSpec, profile: dict[str, Any] | None, workdir: str | None) -> TrialResult:
        """Evaluate the trial with the emulator's model; times are the modelled ones (time_scale 1)."""
        t0 = time.monotonic()
        res, argv, _ = new_result(self, spec, profile)
        # the launch's own noise seed (the driver draws one per launch) with the trial number
        seed = int(((profile or {}).get("emulator") or {}).get("seed") or 0) * 1_000_003 + spec.trial_number
        out = simulate(profile or {}, argv, dict(spec.env), spec.bench, seed=seed % 2**31)
        res.launch_command = launch_command(argv, spec.env)
        res.server_log = redact_text(out.get("log", ""))
        res.log_tail = tail(res.server_log)
        res.startup_s = float(out.get("startup_s", 0.0))
        res.bench_s = float(out.get("bench_s", 0.0))
        res.gpu_s = float(out.get("gpu_s", 0.0))
        res.wall_s = time.monotonic() - t0
        if out.get("status") == "ok" and spec.probe:  # a probe is torn down once ready: no benchmark
            res.gpu_s -= spec.gpus * res.bench_s
            res.bench_s = 0.0
            res.perf_tags = self.paths_taken(res.server_log, spec.expected_paths)
            return res
        if out.get("status") == "ok":
            res.metrics = dict(out.get("metrics") or {})
            res.bench = [{"load": a} for a in out.get("load_artifacts") or []]  # a live trial's load records
            res.perf_tags = self.paths_taken(res.server_log, spec.expected_paths)
            return res
        # The model names its failure class; the classifier reads the scripted log for the rest.
        c = classify(res.server_log, out.get("exit_code"), out.get("phase") or "startup")
        res.status = "infra_error" if c.kind == "infra" else "failed"
        res.failure_class = out.get("failure_class") or c.failure_class
        res.failure_kind = KIND.get(res.failure_class, c.kind)
        res.failure_signature = out.get("failure_signature") or c.signature
        res.failure_line = c.decisive_line if res.failure_class == c.failure_class else ""
        res.phase = out.get("phase") or "startup"
        return res


BACKEND = InstantBackend()
