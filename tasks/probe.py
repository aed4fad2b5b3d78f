"""Probe launches: a trial's own launch with dummy weights and a model cut to few layers.

A config whose failure would show at startup is first launched as a probe: same engine,
parallelism, allreduce / NCCL / EP / speculative / CUDA-graph flags, but

* SGLang: ``--load-format dummy`` (the EAGLE-3 draft follows: ``--speculative-draft-load-format``
  defaults to ``--load-format``) + ``--json-model-override-args '{"text_config":
  {"num_hidden_layers": N}}'`` (or a top-level key for flat configs);
* vLLM: ``--load-format dummy`` + ``--hf-overrides '{...}'`` (same JSON shape).

:func:`probe_layers` picks N (the reasoning and its sources are in its docstring),
:func:`probe_argv` renders the probe argv, :func:`parse_probe` reads one back (for the
emulator's pricing), :func:`probe_classes` says which failure classes a probe can reveal
(``conf/probe_classes.yaml``): only those make a failed probe a dead end.

What differs between engines (the override flag, how the speculative method reads from an
argv, whether an EAGLE-3 target can be cut) is the backend's
:class:`tasks.backends.base.ProbeSupport` (``Backend.probe``); ``engine`` arguments take it,
or a backend kind whose backend has one.
"""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

import yaml

if TYPE_CHECKING:
    from tasks.backends.base import ProbeSupport

REPO_ROOT = Path(__file__).resolve().parent.parent
PROBE_CLASSES_YAML = REPO_ROOT / "conf" / "probe_classes.yaml"
#: the load-format value of a probe (both engines' parsers accept it: tests)
DUMMY = "dummy"
#: a backend kind whose backend can probe, or its :class:`tasks.backends.base.ProbeSupport`
Engine = Union[str, "ProbeSupport"]


def probing_backends() -> dict[str, ProbeSupport]:
    """Backend kind -> its :class:`tasks.backends.base.ProbeSupport`, for every backend that can probe."""
    from tasks.backends import available_backends, get_backend

    out = {}
    for kind in available_backends():
        support = get_backend(kind).probe
        if support is not None:
            out[kind] = support
    return out


def probe_support(engine: Engine) -> ProbeSupport:
    """``engine`` as a :class:`tasks.backends.base.ProbeSupport` (a kind names its backend's).

    Raises:
        ValueError: ``engine`` is a kind whose backend cannot probe, or no backend kind
            (names the kinds that can).
    """
    if not isinstance(engine, str):
        return engine
    supported = probing_backends()
    if engine not in supported:
        raise ValueError(f"engine: {engine!r} is not one of {sorted(supported)} (the backends that can probe)")
    return supported[engine]
#: Fewest target layers at which EAGLE-3's default captures [2, L//2, L-3] are in range and in
#: the increasing order a real model has: L = 4..6 repeat a layer ([2, 3, 3] at 6), L = 7 gives
#: [2, 3, 4]. (L = 3 gives [2, 1, 0]: three captures, but reversed; not relied on.)
EAGLE3_MIN_LAYERS = 7


# ---------------------------------------------------------------------------------------
# Which classes a probe reveals
# ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ProbeClasses:
    """``conf/probe_classes.yaml``: canonical class -> reason, in two disjoint groups."""

    revealable: Mapping[str, str]
    not_revealable: Mapping[str, str]

    def reveals(self, failure_class: str) -> bool:
        """True when a probe failing with ``failure_class`` is a dead end for the full config.

        Raises:
            KeyError: ``failure_class`` is not canonical.
        """
        if failure_class in self.revealable:
            return True
        if failure_class in self.not_revealable:
            return False
        raise KeyError(f"{failure_class!r} is not a canonical failure class (conf/probe_classes.yaml)")


def probe_classes(path: str | Path | None = None) -> ProbeClasses:
    """Load and validate ``conf/probe_classes.yaml`` (cached).

    Raises:
        ValueError: naming the file and field: a class listed twice, missing, or not canonical
            (``tasks.failures.KIND``), or a reason that is not text.
    """
    return _probe_classes_cached(str(Path(path or PROBE_CLASSES_YAML).resolve()))


@functools.lru_cache(maxsize=4)
def _probe_classes_cached(path: str) -> ProbeClasses:
    from tasks.failures import KIND

    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ValueError(f"{path}: cannot read ({e})") from e
    if not isinstance(data, dict) or set(data) != {"revealable", "not_revealable"}:
        raise ValueError(f"{path}: expected exactly the keys `revealable` and `not_revealable`")
    seen: dict[str, str] = {}
    for group in ("revealable", "not_revealable"):
        table = data[group]
        if not isinstance(table, dict):
            raise ValueError(f"{path}: {group}: expected a mapping class -> reason")
        for cls, reason in table.items():
            if cls not in KIND:
                raise ValueError(f"{path}: {group}.{cls}: not a canonical failure class")
            if cls in seen:
                raise ValueError(f"{path}: {group}.{cls}: already listed under {seen[cls]}")
            if not isinstance(reason, str) or not reason.strip():
                raise ValueError(f"{path}: {group}.{cls}: the reason must be text")
            seen[cls] = group
    missing = sorted(set(KIND) - set(seen))
    if missing:
        raise ValueError(f"{path}: classes not listed: {missing} (every canonical class goes in one group)")
    return ProbeClasses(dict(data["revealable"]), dict(data["not_revealable"]))


# ---------------------------------------------------------------------------------------
# Layer count
# ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelGeometry:
    """What the probe needs to know about the model (from the conf/model dict; ``probe.*`` keys
    may sit at the top level or under ``emulator.probe``).

    Attributes:
        num_layers: target decoder layers (``emulator.num_layers``).
        first_k_dense: leading dense layers (``probe.first_k_dense``, else
            ``num_layers - num_moe_layers``); the first MoE layer has this index.
        moe: the model has MoE layers.
        layers_path: where the config keeps the layer count (``probe.layers_path``, else
            ``text_config.num_hidden_layers`` for ``*ForConditionalGeneration`` wrappers such as
            Kimi-K2.5, else ``num_hidden_layers``).
        draft_aux_layer_ids: explicit EAGLE-3 capture ids of the draft (``probe.draft_aux_layer_ids``), if any.
    """

    num_layers: int
    first_k_dense: int
    moe: bool
    layers_path: str
    draft_aux_layer_ids: tuple[int, ...] | None = None


def model_geometry(model_cfg: Mapping[str, Any]) -> ModelGeometry:
    """Read :class:`ModelGeometry` from a conf/model dict.

    Raises:
        ValueError: ``emulator.num_layers`` missing or not a positive int.
    """
    emu = model_cfg.get("emulator") or {}
    probe = model_cfg.get("probe") or emu.get("probe") or {}
    n = probe.get("num_layers", emu.get("num_layers"))
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"model.probe.num_layers or model.emulator.num_layers: a positive int is needed for a probe "
                         f"(got {n!r})")
    n_moe = int(emu.get("num_moe_layers", 0) or 0)
    moe = bool(model_cfg.get("moe", n_moe > 0))
    k_dense = int(probe.get("first_k_dense", max(0, n - n_moe) if moe else 0))
    arch = str(emu.get("architecture", ""))
    default_path = "text_config.num_hidden_layers" if arch.endswith("ForConditionalGeneration") else "num_hidden_layers"
    ids = probe.get("draft_aux_layer_ids")
    return ModelGeometry(n, k_dense, moe, str(probe.get("layers_path", default_path)),
                         tuple(int(i) for i in ids) if ids else None)


def probe_layers(model_cfg: Mapping[str, Any], params: Mapping[str, Any], engine: Engine | None = None) -> int:
    """The fewest target layers a probe of ``params`` needs (== the full count when it cannot cut).

    Reasoning (sources read in the SGLang 0.5.23 and vLLM 0.32.0 wheels; GitHub paths):

    1. An MoE layer, so an all-to-all / EP / MoE-kernel failure can show. DeepSeek-V3-style
       configs (Kimi-K2.5's ``text_config``) make layer i an MoE layer iff ``n_routed_experts``
       is set, ``i >= first_k_dense_replace`` and ``i % moe_layer_freq == 0``
       (sgl-project/sglang ``python/sglang/srt/models/deepseek_v2.py`` ``_is_layer_sparse``).
       Kimi-K2.5 is 1 dense + 60 MoE (``first_k_dense_replace = 1``), so layer 1 is the first
       MoE layer: N >= first_k_dense + 1 = 2 (layer 0 keeps the dense path too).
    2. EAGLE-3 captures the target's hidden states before layers ``[2, L//2, L-3]`` by default
       (``set_eagle3_layers_to_capture`` in the same file; vLLM
       ``get_eagle3_default_aux_hidden_state_layers`` returns ``(2, L//2, L-3)``), into an
       ``AuxHiddenStatePacker`` sized for exactly 3 captures, whose ``finalize`` raises
       "captured k of 3 aux hidden states" otherwise (``python/sglang/srt/layers/aux_hidden_states.py``).
       L = 4..6 repeat a layer (only 2 captures fire). Three ids in ``range(L)`` in the real
       model's low/mid/high order need ``2 < L//2 < L-3``, so N >= 7 (:data:`EAGLE3_MIN_LAYERS`;
       L = 3 would capture [2, 1, 0], reversed, which no full launch does). A draft with explicit
       ids (``probe.draft_aux_layer_ids``) needs N > max(id) + 1 (SGLang adds 1 when the first id is 1).
    3. Where the override goes. SGLang passes ``--json-model-override-args`` to the draft's
       ModelConfig too (``ModelConfig.from_server_args(..., is_draft_model=True)`` uses the
       same ``json_model_override_args``). A nested ``text_config`` override then adds a bare
       ``text_config`` to a flat EAGLE-3 draft config and ``get_hf_text_config`` asserts
       (run here: SGLang 0.5.23's ``get_config`` + ``get_hf_text_config`` with transformers
       5.19 on a flat ``LlamaForCausalLMEagle3`` config -> AssertionError); a top-level
       ``num_hidden_layers`` would make the one-layer draft N layers ("EAGLE3 currently only
       supports 1 layer", ``kimi_k25_eagle3.py``). So an SGLang EAGLE-3 probe keeps every
       layer (it still skips the weight load). vLLM applies a dict ``--hf-overrides`` to the
       target only (``SpeculativeConfig.compose_draft_hf_overrides``: "Dict overrides are
       target-specific key patches and are not applied to the draft"), so it can cut.

    Args:
        model_cfg: conf/model dict (``emulator.num_layers``, ``num_moe_layers``, optional ``probe:``).
        params: the trial's knob values (``speculative`` = ``eagle3`` turns rule 2 on).
        engine: the backend's :class:`~tasks.backends.base.ProbeSupport` or kind (``sglang``,
            ``vllm``, ...); None: an engine not known to cut an EAGLE-3 target (rule 3 keeps
            every layer, the safe answer).

    Raises:
        ValueError: unknown engine or a model without ``emulator.num_layers``.
    """
    cuts_eagle3 = engine is not None and probe_support(engine).cuts_eagle3_target
    g = model_geometry(model_cfg)
    need = g.first_k_dense + 1 if g.moe else 1
    if str(params.get("speculative", "none")).lower() in ("eagle3", "eagle"):
        if not cuts_eagle3:
            return g.num_layers
        need = max(need, EAGLE3_MIN_LAYERS)
        if g.draft_aux_layer_ids:
            need = max(need, max(g.draft_aux_layer_ids) + 2)
    return min(need, g.num_layers)


# ---------------------------------------------------------------------------------------
# argv rendering / reading
# ---------------------------------------------------------------------------------------
def _find(argv: Sequence[str], flag: str) -> tuple[int, int, str] | None:
    """(index, tokens used, value) of ``flag VALUE`` or ``flag=VALUE`` in argv, else None."""
    for i, tok in enumerate(argv):
        if tok == flag and i + 1 < len(argv):
            return i, 2, argv[i + 1]
        if tok.startswith(flag + "="):
            return i, 1, tok[len(flag) + 1:]
    return None


def _set_flag(argv: list[str], flag: str, value: str) -> list[str]:
    hit = _find(argv, flag)
    if hit is None:
        return argv + [flag, value]
    i, used, _ = hit
    return argv[:i] + [flag, value] + argv[i + used:]


def _deep_merge(base: dict, extra: Mapping) -> dict:
    out = copy.deepcopy(base)
    for k, v in extra.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), dict) else v
    return out


def _nested(path: str, value: int) -> dict:
    keys = path.split(".")
    out: dict = {keys[-1]: value}
    for k in reversed(keys[:-1]):
        out = {k: out}
    return out


def _argv_params(argv: Sequence[str], support: ProbeSupport) -> dict[str, str]:
    """The knob values probe_layers needs, read from a launch argv (speculative only)."""
    hit = _find(argv, support.speculative_flag)
    if not support.speculative_json:
        return {"speculative": hit[2].lower()} if hit else {}
    if not hit:
        return {}
    try:
        method = str(json.loads(hit[2]).get("method", ""))
    except (ValueError, AttributeError):
        method = hit[2]
    return {"speculative": "eagle3" if "eagle" in method.lower() else method}


def probe_argv(argv: Sequence[str], engine: Engine, model_cfg: Mapping[str, Any],
               params: Mapping[str, Any] | None = None) -> list[str]:
    """The probe launch for a full launch ``argv`` (launcher prefix and node flags kept).

    Sets ``--load-format dummy`` (replacing any other value) and, when :func:`probe_layers`
    cuts the model, merges the layer override into the engine's override flag (an existing
    ``--json-model-override-args`` / ``--hf-overrides`` JSON is kept and deep-merged). Every
    other token is unchanged, so the probe runs the same paths as the full launch.

    Args:
        argv: the full launch argv (list of str).
        engine: the backend's :class:`~tasks.backends.base.ProbeSupport`, or a kind whose
            backend has one (``sglang``, ``vllm``, ...).
        model_cfg: conf/model dict (see :func:`probe_layers`).
        params: knob values; default: read ``speculative`` from argv.

    Raises:
        ValueError: unknown engine, or an existing override flag whose value is not a JSON object.
    """
    support = probe_support(engine)
    out = _set_flag([str(a) for a in argv], support.load_format_flag, DUMMY)
    g = model_geometry(model_cfg)
    n = probe_layers(model_cfg, _argv_params(out, support) if params is None else params, support)
    if n >= g.num_layers:
        return out
    flag = support.override_flag
    hit = _find(out, flag)
    try:
        current = json.loads(hit[2]) if hit else {}
    except ValueError as e:
        raise ValueError(f"{flag}: existing value is not JSON ({e})") from None
    if not isinstance(current, dict):
        raise ValueError(f"{flag}: existing value must be a JSON object, got {hit[2]!r}")
    merged = _deep_merge(current, _nested(g.layers_path, n))
    return _set_flag(out, flag, json.dumps(merged, separators=(",", ":"), sort_keys=True))


@dataclass(frozen=True)
class ProbeLaunch:
    """What :func:`parse_probe` reads from a probe argv.

    Attributes:
        num_layers: the overridden target layer count, or None (all layers).
    """

    num_layers: int | None


def _layers_in(obj: Any) -> int | None:
    if not isinstance(obj, dict):
        return None
    for key in ("num_hidden_layers", "num_layers"):
        if isinstance(obj.get(key), int):
            return int(obj[key])
    for sub in ("text_config", "language_config", "llm_config"):
        found = _layers_in(obj.get(sub))
        if found is not None:
            return found
    return None


def parse_probe(argv: Sequence[str], engine: Engine | None = None) -> ProbeLaunch | None:
    """Read a probe launch back: None unless ``--load-format dummy`` is set.

    For the emulator's pricing: a probe loads no weights and captures graphs for
    ``num_layers`` layers (None = the model's full count). ``engine`` (a
    :class:`~tasks.backends.base.ProbeSupport` or kind) names the override flag to read;
    None reads the first override flag of any backend that can probe.
    """
    supports = [probe_support(engine)] if engine is not None else list(probing_backends().values())
    hit = _find(argv, supports[0].load_format_flag) if supports else None
    if not hit or hit[2] != DUMMY:
        return None
    over = next((h for h in (_find(argv, s.override_flag) for s in supports) if h is not None), None)
    try:
        layers = _layers_in(json.loads(over[2])) if over else None
    except ValueError:
        layers = None
    return ProbeLaunch(num_layers=layers)
