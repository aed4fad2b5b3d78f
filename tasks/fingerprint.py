"""Environment fingerprint of a GPU node: what failure rules are keyed by.

A failure rule learned on one stack (GPU arch, driver, CUDA, NCCL, torch, SGLang,
FlashInfer) must not be applied after an upgrade, so every trial result carries
:func:`collect_fingerprint` and rules are keyed by :func:`fingerprint_hash`.

Collection never raises and never imports heavy modules needlessly: package versions
come from ``importlib.metadata``; GPU facts from NVML (``nvidia-ml-py``, imported lazily
and guarded); ``torch`` is consulted only when it is *already imported* in this process
(the CUDA runtime / NCCL versions it was built with), or when ``probe_torch=True``.
Missing facts are simply absent keys (never placeholder values), so a hash changes only
when a real fact changes or appears.
"""

from __future__ import annotations

import hashlib
import json
import sys
from importlib import metadata
from typing import Any

#: Distributions whose versions are fingerprinted: key -> candidate distribution names.
#: flashinfer ships as ``flashinfer-python`` (current) or ``flashinfer`` (old wheels).
PACKAGES: dict[str, tuple[str, ...]] = {
    "torch": ("torch",),
    "sglang": ("sglang",),
    "flashinfer": ("flashinfer-python", "flashinfer"),
    "sgl_kernel": ("sgl-kernel",),
    "nccl_wheel": ("nvidia-nccl-cu12", "nvidia-nccl-cu13"),
    "triton": ("triton",),
}

#: Keys that identify the stack for failure rules (pieces not listed here, e.g. GPU count,
#: are informative only): a rule learned on one stack must not apply after an upgrade.
HASH_KEYS: tuple[str, ...] = (
    "gpu_name",
    "compute_capability",
    "driver",
    "cuda",
    "nccl",
    "torch",
    "sglang",
    "vllm",
    "flashinfer",
)


def _dist_version(names: tuple[str, ...]) -> str | None:
    for n in names:
        try:
            return metadata.version(n)
        except metadata.PackageNotFoundError:
            continue
        except Exception:  # a broken dist-info must not break a trial
            continue
    return None


def _s(x: Any) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


def _nvml_facts(gpu_indices: list[int] | None) -> dict[str, str]:
    """GPU name, compute capability, driver and CUDA driver API version via NVML."""
    out: dict[str, str] = {}
    try:
        import pynvml  # nvidia-ml-py
    except Exception:
        return out
    try:
        pynvml.nvmlInit()
    except Exception:
        return out
    try:
        try:
            out["driver"] = _s(pynvml.nvmlSystemGetDriverVersion())
        except Exception:
            pass
        try:
            v = int(pynvml.nvmlSystemGetCudaDriverVersion())  # e.g. 12080 -> "12.8"
            out["cuda_driver"] = f"{v // 1000}.{(v % 1000) // 10}"
        except Exception:
            pass
        try:
            count = int(pynvml.nvmlDeviceGetCount())
        except Exception:
            count = 0
        indices = [i for i in (gpu_indices if gpu_indices is not None else range(count)) if 0 <= i < count]
        names: list[str] = []
        ccs: list[str] = []
        for i in indices:
            try:
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                names.append(_s(pynvml.nvmlDeviceGetName(h)))
                major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(h)
                ccs.append(f"{int(major)}.{int(minor)}")
            except Exception:
                continue
        if names:
            # One value when homogeneous (the usual node); sorted distinct values otherwise.
            out["gpu_name"] = ",".join(sorted(set(names)))
            out["gpu_count"] = str(len(names))
        if ccs:
            out["compute_capability"] = ",".join(sorted(set(ccs)))
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass
    return out


def _torch_facts() -> dict[str, str]:
    """CUDA runtime and NCCL versions torch was built with (torch must be importable)."""
    out: dict[str, str] = {}
    try:
        import torch  # noqa: PLC0415 - only when already imported or asked for
    except Exception:
        return out
    try:
        if getattr(torch.version, "cuda", None):
            out["cuda"] = str(torch.version.cuda)
    except Exception:
        pass
    try:
        nccl = torch.cuda.nccl.version()  # (2, 27, 3) on current torch; int on old ones
        out["nccl"] = ".".join(str(x) for x in nccl) if isinstance(nccl, tuple) else str(nccl)
    except Exception:
        pass
    return out


def collect_fingerprint(gpu_indices: list[int] | None = None, probe_torch: bool = False) -> dict[str, str]:
    """Collect the environment fingerprint on this node. Never raises.

    Args:
        gpu_indices: NVML indices of the GPUs the trial holds (None = all GPUs).
        probe_torch: import torch even if it is not imported yet, to read the CUDA runtime
            and NCCL versions it was built with (a few seconds on a cold import).

    Returns:
        ``{key: value}`` with whatever is known, from these keys: ``gpu_name``,
        ``gpu_count``, ``compute_capability`` (e.g. ``"12.0"``), ``driver``,
        ``cuda_driver`` (highest CUDA the driver supports), ``cuda`` (torch's CUDA runtime,
        else ``cuda_driver``), ``nccl`` (torch's NCCL, else the ``nvidia-nccl`` wheel),
        ``torch``, ``sglang``, ``flashinfer``, ``sgl_kernel``, ``triton``, ``python``.
    """
    fp: dict[str, str] = {"python": ".".join(str(x) for x in sys.version_info[:3])}
    try:
        fp.update(_nvml_facts(gpu_indices))
    except Exception:
        pass
    for key, names in PACKAGES.items():
        v = _dist_version(names)
        if v:
            fp[key] = v
    if probe_torch or "torch" in sys.modules:
        try:
            fp.update(_torch_facts())
        except Exception:
            pass
    if "cuda" not in fp and "cuda_driver" in fp:
        fp["cuda"] = fp["cuda_driver"]
    if "nccl" not in fp and "nccl_wheel" in fp:
        fp["nccl"] = fp["nccl_wheel"]
    fp.pop("nccl_wheel", None)
    return fp


def fingerprint_hash(fp: dict[str, str], keys: tuple[str, ...] = HASH_KEYS) -> str:
    """Stable 16-hex-digit hash of the rule-relevant part of a fingerprint.

    Only ``keys`` (default :data:`HASH_KEYS`) count; absent keys are absent from the
    hashed JSON, so the hash is independent of dict order and of informative-only keys.
    """
    core = {k: str(fp[k]) for k in keys if fp.get(k) not in (None, "")}
    blob = json.dumps(core, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:16]
