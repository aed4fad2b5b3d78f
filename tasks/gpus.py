"""GPU occupancy checks through NVML, for trial start (GPUs free?) and teardown (released?).

NVML comes from ``nvidia-ml-py`` (module ``pynvml``); it is imported lazily and every
function degrades to "unknown" (None) when NVML is absent or fails to initialise, so the
emulated backend and GPU-less machines run the same code.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

#: A GPU using more than this is "busy". A CUDA context alone costs ~300-600 MiB on recent
#: drivers (measured by others, varies by GPU and driver); an idle GPU reports a few MiB.
DEFAULT_BUSY_THRESHOLD_MIB = 1024.0

_MIB = 1024.0 * 1024.0
log = logging.getLogger(__name__)


class GpuBusyError(RuntimeError):
    """GPUs still hold memory (another process, or a trial that has not released them).

    Attributes:
        used_mib: ``{gpu_index: used MiB}`` of the busy GPUs.
        threshold_mib: the threshold, MiB.
    """

    def __init__(self, message: str, used_mib: dict[int, float], threshold_mib: float):
        super().__init__(message)
        self.used_mib = used_mib
        self.threshold_mib = threshold_mib


def gpu_memory_used_mib(indices: Sequence[int]) -> dict[int, float] | None:
    """Used memory per GPU, MiB, via NVML; None when NVML is unavailable.

    Args:
        indices: NVML device indices (physical order, not CUDA_VISIBLE_DEVICES order).

    Returns:
        ``{index: used MiB}``; an index NVML cannot query is left out.
    """
    try:
        import pynvml  # nvidia-ml-py
    except Exception:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:
        return None
    try:
        out: dict[int, float] = {}
        for i in indices:
            try:
                h = pynvml.nvmlDeviceGetHandleByIndex(int(i))
                out[int(i)] = float(pynvml.nvmlDeviceGetMemoryInfo(h).used) / _MIB
            except Exception:
                continue
        return out
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def _busy(used: dict[int, float], threshold_mib: float) -> dict[int, float]:
    return {i: mib for i, mib in sorted(used.items()) if mib > threshold_mib}


def assert_gpus_free(indices: Sequence[int], threshold_mib: float = DEFAULT_BUSY_THRESHOLD_MIB) -> None:
    """Raise unless every GPU in ``indices`` uses at most ``threshold_mib`` MiB.

    A no-op when NVML is unavailable (nothing to check: emulated node, no GPU).

    Raises:
        GpuBusyError: lists each busy GPU with its used MiB.
    """
    used = gpu_memory_used_mib(indices)
    if used is None:
        return
    busy = _busy(used, threshold_mib)
    if busy:
        desc = ", ".join(f"GPU {i}: {mib:.0f} MiB" for i, mib in busy.items())
        raise GpuBusyError(f"GPUs busy (> {threshold_mib:.0f} MiB used): {desc}", busy, threshold_mib)


def wait_gpus_released(
    indices: Sequence[int],
    timeout_s: float,
    threshold_mib: float = DEFAULT_BUSY_THRESHOLD_MIB,
    poll_s: float = 0.5,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> bool:
    """Poll until every GPU in ``indices`` is at or under ``threshold_mib`` MiB.

    Args:
        indices: NVML device indices.
        timeout_s: give up after this long, s.
        threshold_mib: busy threshold, MiB.
        poll_s: poll interval, s.
        sleep, clock: injectable for tests.

    Returns:
        True once released (also when NVML is unavailable: nothing to wait for), False
        when still busy after ``timeout_s`` (the busy GPUs are logged at WARNING).
    """
    t0 = clock()
    while True:
        used = gpu_memory_used_mib(indices)
        if used is None:
            return True
        busy = _busy(used, threshold_mib)
        waited = clock() - t0
        if not busy:
            return True
        if waited >= timeout_s:
            desc = ", ".join(f"GPU {i}: {mib:.0f} MiB" for i, mib in busy.items())
            log.warning("GPUs not released after %.1f s (> %.0f MiB used): %s", timeout_s, threshold_mib, desc)
            return False
        sleep(min(poll_s, max(0.0, timeout_s - waited)))
