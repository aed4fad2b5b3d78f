"""tasks.fingerprint and tasks.gpus with a fake NVML (no GPU on the test machines)."""

from __future__ import annotations

import sys
import types

import pytest

from tasks import fingerprint, gpus

MIB = 1024 * 1024


class FakeNVML(types.ModuleType):
    """A stand-in for ``pynvml`` with programmable per-GPU memory (bytes)."""

    NVMLError = RuntimeError

    def __init__(self, used_mib: list[float], name: str = "NVIDIA RTX PRO 6000 Blackwell", cc=(12, 0)):
        super().__init__("pynvml")
        self.used = [u * MIB for u in used_mib]
        self.gpu_name = name
        self.cc = cc
        self.inits = 0
        self.shutdowns = 0
        self.fail_init = False

    def nvmlInit(self):  # noqa: N802 - NVML's names
        if self.fail_init:
            raise self.NVMLError("NVML Shared Library Not Found")
        self.inits += 1

    def nvmlShutdown(self):  # noqa: N802
        self.shutdowns += 1

    def nvmlDeviceGetCount(self):  # noqa: N802
        return len(self.used)

    def nvmlDeviceGetHandleByIndex(self, i):  # noqa: N802
        if not 0 <= i < len(self.used):
            raise self.NVMLError("Invalid Argument")
        return i

    def nvmlDeviceGetMemoryInfo(self, h):  # noqa: N802
        return types.SimpleNamespace(used=self.used[h], total=96 * 1024 * MIB)

    def nvmlDeviceGetName(self, h):  # noqa: N802
        return self.gpu_name.encode()  # old bindings return bytes

    def nvmlDeviceGetCudaComputeCapability(self, h):  # noqa: N802
        return self.cc

    def nvmlSystemGetDriverVersion(self):  # noqa: N802
        return "580.95.05"

    def nvmlSystemGetCudaDriverVersion(self):  # noqa: N802
        return 13000


@pytest.fixture
def nvml(monkeypatch):
    fake = FakeNVML([3.0] * 8)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    return fake


def test_memory_used_reads_each_index_and_shuts_nvml_down(nvml):
    nvml.used[2] = 40_000 * MIB
    assert gpus.gpu_memory_used_mib([0, 2, 99]) == {0: 3.0, 2: 40_000.0}  # 99: not a GPU, left out
    assert nvml.inits == nvml.shutdowns == 1


def test_no_nvml_means_unknown_and_no_checks(monkeypatch, nvml):
    nvml.fail_init = True
    assert gpus.gpu_memory_used_mib([0]) is None
    gpus.assert_gpus_free([0], threshold_mib=0.0)  # nothing to check: must not raise
    assert gpus.wait_gpus_released([0], timeout_s=5.0) is True
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    assert gpus.gpu_memory_used_mib([0]) is None


def test_assert_gpus_free_names_busy_gpus(nvml):
    gpus.assert_gpus_free(range(8), threshold_mib=1024)
    nvml.used[5] = 70_000 * MIB
    nvml.used[6] = 1500 * MIB
    with pytest.raises(gpus.GpuBusyError) as ei:
        gpus.assert_gpus_free(range(8), threshold_mib=1024)
    assert ei.value.used_mib == {5: 70_000.0, 6: 1500.0}
    assert "GPU 5: 70000 MiB" in str(ei.value) and "GPU 6" in str(ei.value)
    gpus.assert_gpus_free([0, 1, 2], threshold_mib=1024)  # only the trial's GPUs count


def test_wait_gpus_released_polls_until_memory_drops(nvml):
    nvml.used[1] = 80_000 * MIB
    now = [0.0]
    calls = []

    def sleep(dt):
        calls.append(dt)
        now[0] += dt
        if now[0] >= 2.0:  # the dying server frees its memory after 2 s
            nvml.used[1] = 2 * MIB

    assert gpus.wait_gpus_released([0, 1], timeout_s=10.0, poll_s=0.5, sleep=sleep, clock=lambda: now[0]) is True
    assert now[0] == pytest.approx(2.0)
    assert calls == [0.5] * 4


def test_wait_gpus_released_times_out(nvml, caplog):
    nvml.used[3] = 90_000 * MIB
    now = [0.0]

    def sleep(dt):
        now[0] += dt

    assert gpus.wait_gpus_released([3], timeout_s=3.0, poll_s=1.0, sleep=sleep, clock=lambda: now[0]) is False
    assert now[0] == pytest.approx(3.0)
    assert "GPU 3: 90000 MiB" in caplog.text


def test_fingerprint_from_nvml_and_metadata(nvml, monkeypatch):
    versions = {"torch": "2.9.1", "sglang": "0.5.23", "flashinfer-python": "0.6.1", "nvidia-nccl-cu12": "2.27.7"}

    def fake_version(name):
        if name in versions:
            return versions[name]
        raise fingerprint.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(fingerprint.metadata, "version", fake_version)
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    fp = fingerprint.collect_fingerprint([0, 1, 2, 3])
    assert fp["gpu_name"] == "NVIDIA RTX PRO 6000 Blackwell"
    assert fp["gpu_count"] == "4"
    assert fp["compute_capability"] == "12.0"
    assert fp["driver"] == "580.95.05"
    assert fp["cuda_driver"] == "13.0" and fp["cuda"] == "13.0"  # no torch imported: driver's CUDA
    assert fp["nccl"] == "2.27.7"  # from the nvidia-nccl wheel
    assert (fp["torch"], fp["sglang"], fp["flashinfer"]) == ("2.9.1", "0.5.23", "0.6.1")
    assert "torch" not in sys.modules  # never imported needlessly
    assert nvml.inits == nvml.shutdowns == 1


def test_fingerprint_never_raises_without_nvml(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    fp = fingerprint.collect_fingerprint()
    assert "gpu_name" not in fp and fp["python"]
    assert all(isinstance(v, str) and v for v in fp.values())


def test_fingerprint_hash_keys_on_the_stack_only():
    base = {"gpu_name": "X", "compute_capability": "12.0", "driver": "580", "sglang": "0.5.23", "flashinfer": "0.6"}
    h = fingerprint.fingerprint_hash(base)
    assert len(h) == 16 and int(h, 16) >= 0
    assert fingerprint.fingerprint_hash(dict(reversed(list(base.items())))) == h  # order-independent
    assert fingerprint.fingerprint_hash({**base, "gpu_count": "8", "python": "3.11"}) == h  # informative keys
    assert fingerprint.fingerprint_hash({**base, "sglang": "0.5.24"}) != h  # an upgrade changes it
    assert fingerprint.fingerprint_hash({**base, "nccl": "2.27"}) != h  # a newly known fact too
