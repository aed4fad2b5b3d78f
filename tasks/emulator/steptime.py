"""Step time of the batching scheduler from the emulator's performance model (pure).

``StepModel(profile, launch, pred).step_time_s(decode_batch, prefill_tokens)`` is the
duration (s) of one forward pass that serves ``decode_batch`` decoding requests and
``prefill_tokens`` prompt tokens (chunked prefill), the ``StepTime`` that
:class:`tasks.emulator.scheduler.BatchScheduler` calls:

* decode only (``prefill_tokens == 0``): :func:`tasks.emulator.physics.step_ms` at batch B,
  exactly as :func:`tasks.emulator.model.evaluate` prices batch B (memory-bandwidth time,
  one all-reduce per layer half, launch overhead, Δ_cg of the captured graphs; eager above
  ``cuda_graph_max_bs`` or with graphs disabled). With EAGLE a step is one cycle: the draft
  steps plus a verify forward of B × num_draft_tokens tokens. At B = 1 this is the
  calibrated single-stream ITL (``python -m tasks.emulator.calibration check``).
* with prefill: one eager forward of the decode tokens plus the P prompt tokens (the
  weights stream once; compute-bound when 2·active_params·tokens / (TP·peak·mfu) exceeds
  the memory time; all-reduces of 2·tokens·hidden bytes), plus attention's quadratic term
  ``L · 2·heads·(d_qk + d_v) · P²/2 / (TP · peak · attn_efficiency)`` (causal pairs inside
  the chunk; earlier chunks of the same prompt are not counted), plus one draft extend
  step with EAGLE. Constants: ``mfu``, ``attn_efficiency``, ``tensor_tflops`` (conf/node),
  ``active_params_b``, ``attn_heads``, ``attn_qk_head_dim``, ``attn_v_head_dim`` (conf/model),
  each with its provenance tag there.

Times are divided by the seeded run-to-run factor (``physics.run_factor``), as the server's
token rate is. Results are cached per (B, P).
"""

from __future__ import annotations

from tasks.emulator.launch import LaunchConfig
from tasks.emulator.model import DEFAULT_MAX_BS_LARGE_GPU
from tasks.emulator.physics import collectives, model_params, node_params, run_factor, step_ms
from tasks.emulator.prediction import Prediction

DEFAULT_CTX_TOKENS = 128 + 128 // 2  # evaluate()'s default KV context (input 128 + output 128 / 2)


class StepModel:
    """Step times of one healthy launch.

    Args:
        profile: from ``build_profile``.
        launch: from ``parse_launch``.
        pred: ``evaluate(profile, launch)`` (its resolved EAGLE shape is read).
        ctx_tokens: KV context per decoding request (tokens) for the memory term.
        noise: apply the seeded run factor (False: the noise-free model).
    """

    def __init__(self, profile: dict, launch: LaunchConfig, pred: Prediction, *,
                 ctx_tokens: int = DEFAULT_CTX_TOKENS, noise: bool = True):
        self.profile, self.launch = profile, launch
        self.cm, _ = collectives(profile, launch)
        self.max_bs = launch.cuda_graph_max_bs or DEFAULT_MAX_BS_LARGE_GPU
        self.graphs = not launch.disable_cuda_graph
        self.spec = dict(pred.spec) if launch.speculative else {}
        self.ctx = int(ctx_tokens)
        self.factor = run_factor(profile, launch) if noise else 1.0
        self._cache: dict[tuple[int, int], float] = {}

    def decode_ms(self, batch: int) -> float:
        """One decode step (EAGLE: one draft + verify cycle) at ``batch`` >= 1, ms, noise-free."""
        ne, me = node_params(self.profile), model_params(self.profile)
        graphs = self.graphs and batch <= self.max_bs
        if self.spec:
            t = step_ms(self.profile, self.launch, self.cm, tokens=batch * self.spec["num_draft_tokens"], batch=batch,
                        ctx=self.ctx, graphs=graphs, max_bs=self.max_bs,
                        alpha_extra_us=ne["alpha_verify_us"] - ne["nccl"]["alpha_us"])
            return t["total"] + self.spec["num_steps"] * me["t_draft_ms"]
        return step_ms(self.profile, self.launch, self.cm, tokens=batch, batch=batch, ctx=self.ctx, graphs=graphs,
                       max_bs=self.max_bs)["total"]

    def attention_ms(self, prefill_tokens: int) -> float:
        """Causal attention FLOPs of a prefill chunk of ``prefill_tokens``, as time (ms)."""
        ne, me = node_params(self.profile), model_params(self.profile)
        per_pair = 2.0 * me["attn_heads"] * (me["attn_qk_head_dim"] + me["attn_v_head_dim"])
        flops = me["num_layers"] * per_pair * prefill_tokens * prefill_tokens / 2.0 / max(1, self.launch.tp)
        return flops / (ne["attn_efficiency"] * ne["tensor_tflops"] * 1e12) * 1e3

    def mixed_ms(self, decode_batch: int, prefill_tokens: int) -> float:
        """A step with ``prefill_tokens`` > 0 (and ``decode_batch`` decoding requests), ms, noise-free."""
        me = model_params(self.profile)
        dtok = decode_batch * (self.spec["num_draft_tokens"] if self.spec else 1)
        t = step_ms(self.profile, self.launch, self.cm, tokens=dtok + prefill_tokens, batch=decode_batch,
                    ctx=self.ctx, graphs=False, max_bs=self.max_bs, prefill=True)["total"]
        t += self.attention_ms(prefill_tokens)
        if self.spec:
            t += me["t_draft_ms"] * (1 + (self.spec["num_steps"] if decode_batch else 0))
        return t

    def step_time_s(self, decode_batch: int, prefill_tokens: int) -> float:
        """Duration (s) of a step serving ``decode_batch`` decodes and ``prefill_tokens`` prompt tokens.

        Raises:
            ValueError: negative arguments, or both 0 (an empty step).
        """
        key = (int(decode_batch), int(prefill_tokens))
        t = self._cache.get(key)
        if t is None:
            b, p = key
            if b < 0 or p < 0 or b + p == 0:
                raise ValueError(f"a step needs decode_batch >= 0, prefill_tokens >= 0, not both 0; got {b}, {p}")
            ms = self.decode_ms(b) if p == 0 else self.mixed_ms(b, p)
            t = self._cache[key] = ms / 1e3 / self.factor
        return t

    __call__ = step_time_s
