"""The emulated node (``backend=emulated``): a server process that takes SGLang's flags and
speaks SGLang's HTTP API (:mod:`tasks.emulator.server`), so everything but the GPUs is SGLang's."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tasks.backends.sglang.backend import SGLangBackend
from tasks.emulator.profile import build_profile


def emulated_fingerprint(profile: Mapping[str, Any]) -> dict[str, str]:
    """The emulated node's declared fingerprint (``profile["emulator"]["fingerprint"]``: GPU
    arch, driver, CUDA, NCCL, torch, SGLang, FlashInfer) as strings."""
    fp = (profile.get("emulator") or {}).get("fingerprint") or {}
    return {str(k): str(v) for k, v in sorted(fp.items())}


class EmulatedBackend(SGLangBackend):
    """SGLang's launch and API against the emulated server; no NVML checks (no GPUs)."""

    kind = "emulated"
    emulated = True
    checks_gpus = False

    def profile(self, node: Mapping[str, Any], model: Mapping[str, Any],
                backend_cfg: Mapping[str, Any]) -> dict[str, Any] | None:
        """``{"node", "model", "emulator"}`` from the node/model configs and ``backend.emulator``;
        the emulator accepts the flags of ``backend.sglang_version``."""
        emu = dict(backend_cfg.get("emulator") or {})
        emu.setdefault("sglang_version", self.engine_version(backend_cfg))
        return build_profile(dict(node), dict(model), emu)

    def fingerprint(self, profile: Mapping[str, Any] | None, gpu_indices: list[int] | None) -> dict[str, str]:
        """The profile's declared stack; the real node's when no profile is given."""
        if profile is not None:
            return emulated_fingerprint(profile)
        return super().fingerprint(profile, gpu_indices)


BACKEND = EmulatedBackend()
