"""What a failure rule matches on: canonical values, the environment fingerprint, the
implicated knobs of a failure class (``conf/failure_knobs.yaml``), and the ``Rule`` itself.

The store (``RuleStore``) and the CLI are in ``sweeps.rules.store``, which re-exports these names.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tasks.backends import engine_fingerprint_keys
from tasks.failures import KIND

REPO = Path(__file__).resolve().parents[2]
#: Class -> implicated knobs (see the file's header for the item syntax).
DEFAULT_KNOBS_PATH = REPO / "conf" / "failure_knobs.yaml"
#: Fingerprint keys that identify the software/hardware stack: the node's, and each backend's
#: engine version (``Backend.fingerprint_key``); other keys (hostname, node id, errors) do not
#: change the hash (its canonical JSON sorts the keys, so their order does not either).
STACK_KEYS = ("gpu_arch", "compute_capability", "gpu_name", "driver", "cuda", "nccl", "torch", "flashinfer")
FINGERPRINT_KEYS = (*STACK_KEYS, *engine_fingerprint_keys())  # the backends importable at import time


def fingerprint_keys() -> tuple[str, ...]:
    """:data:`STACK_KEYS` plus the engine-version field of every backend available now (one
    added to the search path after import counts too)."""
    return (*STACK_KEYS, *engine_fingerprint_keys())
_FULL = "*"
_MODEL = "model"
_DEFAULTS = ("default", "none", "null", "")


# ----------------------------------------------------------------------------- canonical forms
def canon_value(v: Any) -> Any:
    """JSON-able canonical form: numpy scalars -> Python, floats to 12 significant digits."""
    if hasattr(v, "item") and callable(v.item) and not isinstance(v, (list, tuple, dict, str, bytes)):
        try:
            v = v.item()
        except (TypeError, ValueError):
            pass
    if isinstance(v, bool) or v is None or isinstance(v, (int, str)):
        return v
    if isinstance(v, float):
        if not math.isfinite(v):
            return str(v)
        return float(f"{v:.12g}")
    if isinstance(v, Mapping):
        return {str(k): canon_value(x) for k, x in sorted(v.items(), key=lambda kv: str(kv[0]))}
    if isinstance(v, (list, tuple)):
        return [canon_value(x) for x in v]
    return str(v)


def canonical_json(obj: Any) -> str:
    """Canonical JSON (sorted keys, no spaces, canonical values); equal inputs give equal text."""
    return json.dumps(canon_value(obj), sort_keys=True, separators=(",", ":"))


def fingerprint_subset(fingerprint: Mapping[str, Any]) -> dict[str, str]:
    """The :func:`fingerprint_keys` present (non-empty) in ``fingerprint``, values as str."""
    return {k: str(fingerprint[k]) for k in fingerprint_keys() if fingerprint.get(k) not in (None, "")}


def fingerprint_hash(fingerprint: Mapping[str, Any]) -> str:
    """sha256 hex of the canonical JSON of :func:`fingerprint_subset`.

    Raises:
        ValueError: none of :data:`FINGERPRINT_KEYS` is present (a rule must not apply to
            every environment).
    """
    fp = fingerprint_subset(fingerprint)
    if not fp:
        raise ValueError(f"fingerprint has none of {fingerprint_keys()}: {dict(fingerprint)!r}")
    return hashlib.sha256(canonical_json(fp).encode()).hexdigest()


# ----------------------------------------------------------------------------- implicated knobs
def load_implicated_knobs(path: str | Path = DEFAULT_KNOBS_PATH) -> dict[str, list[str]]:
    """Read ``conf/failure_knobs.yaml``: failure class -> implicated knob items.

    Items: ``knob``, ``knob?`` (only when set to a non-default value), ``model`` (key by
    model), ``*`` (full config).

    Raises:
        ValueError: the file is not a mapping of class -> list of strings, or names a class
            that is not canonical (``tasks.failures.KIND``).
        OSError: the file cannot be read.
    """
    data = yaml.safe_load(Path(path).read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of failure class -> list of knob names")
    out: dict[str, list[str]] = {}
    for cls, items in data.items():
        if cls not in KIND:
            raise ValueError(f"{path}: {cls}: not a canonical failure class (kinds in tasks/failure_signatures.yaml)")
        if not isinstance(items, list) or not all(isinstance(i, str) and i for i in items):
            raise ValueError(f"{path}: {cls}: expected a list of knob names, got {items!r}")
        out[str(cls)] = list(items)
    return out


def _is_default(v: Any) -> bool:
    return v is None or v is False or (isinstance(v, str) and v.strip().lower() in _DEFAULTS)


def uses_model(failure_class: str, mapping: Mapping[str, list[str]]) -> bool:
    """True when rules of this class are keyed by model (its mapping lists ``model``)."""
    return _MODEL in mapping.get(failure_class, ())


def implicated_params(failure_class: str, params: Mapping[str, Any], mapping: Mapping[str, list[str]],
                      signature: str | None = None) -> dict[str, Any]:
    """The knob values a failure of ``failure_class`` implicates in a trial's params.

    Args:
        failure_class: canonical class id.
        params: the trial's knob values, e.g. ``{"allreduce": "nccl", "nccl_algo": "Tree"}``.
        mapping: :func:`load_implicated_knobs` output.
        signature: the failure signature; when it names the value of one of the set
            optional (``knob?``) knobs as a word (``NCCL_ALGO was set to Tree.``), only
            those optional knobs are implicated.
    Returns:
        A dict sorted by knob name; the full ``params`` when the class is not in the mapping,
        lists ``*``, or no listed knob is present/set.
    """
    items = [i for i in mapping.get(failure_class, [_FULL]) if i != _MODEL]
    full = {k: params[k] for k in sorted(params)}
    if _FULL in items:
        return full
    out: dict[str, Any] = {}
    optional: list[str] = []
    for item in items:
        name, opt = (item[:-1], True) if item.endswith("?") else (item, False)
        if name not in params or (opt and _is_default(params[name])):
            continue
        out[name] = params[name]
        if opt:
            optional.append(name)
    if signature and len(optional) > 1:
        named = [k for k in optional if re.search(rf"(?<![\w.-]){re.escape(str(params[k]))}(?![\w-])", signature)]
        if named:
            for k in optional:
                if k not in named:
                    out.pop(k)
    if not out:
        return full
    return {k: out[k] for k in sorted(out)}


# ----------------------------------------------------------------------------- rule
@dataclass(frozen=True)
class Rule:
    """One failure rule (a row of ``servesweep_failure_rules``).

    Attributes:
        id: row id.
        fingerprint_hash: :func:`fingerprint_hash` of the environment it was learned on.
        fingerprint: the :data:`FINGERPRINT_KEYS` values of that environment.
        model: the model it applies to (memory classes), or None for any model.
        knobs: implicated knob values; a trial matches when it has all of them.
        failure_class: canonical class id.  kind: its kind (``deterministic``, or
            ``transient`` for a forced rule).
        signature: normalized decisive log line of the first failure.
        evidence: ``[{"sweep": ..., "trial_number": ...}, ...]`` trials that failed this way.
        scope_sweep: for forced (transient) rules, the only sweep they apply to; else None.
        created_at / updated_at: ISO-8601 UTC.
        hits: trials skipped by this rule.
        origin: how it was first learned: ``shipped`` (a probe a shipped entry sent),
            ``probe`` (a probe of a risky level or a re-question), ``launch`` (a failed full launch).
        studies: the studies that learned, confirmed or were skipped by it; ``len`` = its age in studies.
        last_confirmed: ISO-8601 UTC of the last failure that matched it.
        retired_at / retired_evidence: set when a probe of its knobs passed (it no longer matches).
    """

    id: int
    fingerprint_hash: str
    fingerprint: dict[str, str]
    model: str | None
    knobs: dict[str, Any]
    failure_class: str
    kind: str
    signature: str
    evidence: list[dict[str, Any]] = field(default_factory=list)
    scope_sweep: str | None = None
    created_at: str = ""
    updated_at: str = ""
    hits: int = 0
    origin: str = "launch"
    studies: list[str] = field(default_factory=list)
    last_confirmed: str = ""
    retired_at: str | None = None
    retired_evidence: dict[str, Any] | None = None

    @property
    def learned_how(self) -> str:
        """``repeated (N)`` once N >= 2 trials failed this way, else how it was first learned
        (``shipped``, ``one failed launch``, ``probe``)."""
        if len(self.evidence) >= 2:
            return f"repeated ({len(self.evidence)})"
        return {"launch": "one failed launch"}.get(self.origin, self.origin)

    def applies_to(self, fp_hash: str, model: str | None, params: Mapping[str, Any], sweep: str | None = None) -> bool:
        """True when this rule matches a trial (not retired; same fingerprint, model, scope and knob values)."""
        if self.retired_at is not None or fp_hash != self.fingerprint_hash:
            return False
        if self.model is not None and self.model != model:
            return False
        if self.scope_sweep is not None and self.scope_sweep != sweep:
            return False
        return all(k in params and canon_value(params[k]) == canon_value(v) for k, v in self.knobs.items())

    def explain(self) -> str:
        """Multi-line human description (the CLI's ``explain``)."""
        knobs = ", ".join(f"{k}={v}" for k, v in self.knobs.items()) or "(any config)"
        ev = "; ".join(f"{e.get('sweep')}#{e.get('trial_number')}" for e in self.evidence) or "(none)"
        fp = ", ".join(f"{k}={v}" for k, v in self.fingerprint.items())
        return "\n".join([
            f"rule {self.id}: {self.failure_class} ({self.kind})",
            f"  when:        {knobs}",
            f"  model:       {self.model or '(any)'}",
            f"  scope:       {('sweep ' + self.scope_sweep) if self.scope_sweep else '(every sweep on this environment)'}",
            f"  environment: {fp}",
            f"  fingerprint: {self.fingerprint_hash}",
            f"  signature:   {self.signature}",
            f"  evidence:    {ev}",
            f"  skipped:     {self.hits} trial(s)",
            f"  learned:     {self.created_at} (updated {self.updated_at}), {self.learned_how}",
            f"  age:         {len(self.studies)} stud{'y' if len(self.studies) == 1 else 'ies'}"
            f" ({', '.join(self.studies) or '-'})",
            f"  confirmed:   {self.last_confirmed or '-'}",
            *([f"  retired:     {self.retired_at}: {canonical_json(self.retired_evidence or {})}"]
              if self.retired_at else []),
        ])
