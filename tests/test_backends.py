"""The backend seam: lookup, the protocol's answers per backend, and no backend checks elsewhere."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sweeps.config.spec import ConfigError, backend_dict, load_spec
from tasks.backends import available_backends, check_kind, get_backend
from tasks.backends.base import Backend, Launch
from tasks.backends.sglang.knobs import render_launch
from tests.conftest import compose_cfg

ROOT = Path(__file__).resolve().parent.parent
PARAMS = {"allreduce": "custom", "cuda_graph_max_bs": 64, "nccl_algo": "Ring"}


def test_lookup_lists_backends_not_helpers_and_names_the_field():
    kinds = available_backends()
    assert {"sglang", "emulated", "instant"} <= set(kinds)
    assert not {"base", "lifecycle", "flagtable", "argcheck"} & set(kinds)
    for k in kinds:
        be = get_backend(k)
        assert isinstance(be, Backend) and be.kind == k
    with pytest.raises(ValueError, match=r"backend.kind='nope'.*available: .*emulated.*sglang"):
        get_backend("nope")
    assert check_kind("sglang") == "sglang"
    with pytest.raises(ValueError, match="unknown backend kind 'nope'; available: .*instant"):
        check_kind("nope")


def test_config_refuses_an_unknown_backend_kind():
    with pytest.raises(ConfigError, match="backend.kind.*'nope'"):
        load_spec(compose_cfg(["backend.kind=nope"]))


@pytest.fixture(scope="module")
def spec():
    return load_spec(compose_cfg([]))


def test_sglang_family_renders_through_the_knob_table(spec):
    node, model, cfg = spec.node.model_dump(), spec.model.model_dump(), backend_dict(spec)
    for kind in ("sglang", "emulated", "instant"):
        be = get_backend(kind)
        launch = be.render(PARAMS, node, model, cfg)
        assert isinstance(launch, Launch)
        argv, env, expected = launch
        assert (argv, env, expected) == render_launch(PARAMS, node, model, cfg)
        assert be.engine == "sglang" and be.engine_version(cfg) == spec.backend.sglang_version
    full = get_backend("sglang").server_argv(["x"], "127.0.0.1", [30011, 30012])
    assert full == ["x", "--host", "127.0.0.1", "--port", "30011", "--nccl-port", "30012"]


def test_capabilities_and_profiles(spec):
    node, model, cfg = spec.node.model_dump(), spec.model.model_dump(), backend_dict(spec)
    real, emu, inst = get_backend("sglang"), get_backend("emulated"), get_backend("instant")
    assert real.checks_gpus and real.launches_server and real.profile(node, model, cfg) is None
    assert not emu.checks_gpus and emu.launches_server and len(emu.ports) == 2
    assert not inst.launches_server and inst.validate([["x"]], cfg) is None
    assert {"allreduce", "cuda_graph_max_bs", "speculative"} <= real.known_knobs
    assert "cuda_graph_max_bs" in real.int_knobs and "mem_fraction_static" in real.float_knobs
    assert (real.int_knobs | real.float_knobs) <= real.known_knobs and not real.int_knobs & real.float_knobs
    prof = emu.profile(node, model, cfg)
    assert set(prof) == {"node", "model", "emulator"} and prof["emulator"]["sglang_version"] == cfg["sglang_version"]
    fp = emu.fingerprint(prof, [0, 1])
    assert fp and fp == {str(k): str(v) for k, v in prof["emulator"]["fingerprint"].items()}


def test_post_bench_reads_acceptance_only_when_the_streams_had_none(monkeypatch):
    import tasks.backends.sglang.backend as mod

    monkeypatch.setattr(mod, "fetch_server_info", lambda url: {"internal_states": [{"avg_spec_accept_length": 3.2}]})
    be = get_backend("sglang")
    assert be.post_bench_metrics("u", {"accept_length": 1.0})["accept_length"] == 3.2
    assert be.post_bench_metrics("u", {"accept_length": 2.5})["accept_length"] == 2.5


# Comparisons of a backend kind/name with a literal engine name.
KIND_CHECK = re.compile(r"""(backend|kind)\w*\s*(==|!=|\bin\b|\bnot in\b)\s*[(\[{]?\s*["'](sglang|emulated|instant|vllm)["']""")


def test_no_backend_checks_outside_the_backend_modules():
    hits = []
    for p in sorted((ROOT / "tasks").rglob("*.py")):
        if "backends" in p.relative_to(ROOT / "tasks").parts:
            continue
        for i, line in enumerate(p.read_text().splitlines(), 1):
            if KIND_CHECK.search(line):
                hits.append(f"{p.relative_to(ROOT)}:{i}: {line.strip()}")
    assert not hits, "\n".join(hits)
    assert KIND_CHECK.search('if spec.backend == "instant":') and KIND_CHECK.search('kind in ("emulated", "instant")')


def test_validation_checks_the_server_args_whatever_the_launcher(spec, monkeypatch):
    """The emulated server's launcher (python -m tasks.emulator.server) is not SGLang's: only the
    server args go to SGLang's parser."""
    import tasks.backends.sglang.backend as mod

    seen = []
    monkeypatch.setattr(mod, "check_many", lambda argvs, python=None: seen.extend(argvs) or [{"ok": True}] * len(argvs))
    cfg = backend_dict(spec)
    argv = [a.replace("{python}", "/venv/bin/python") for a in get_backend("emulated").render(PARAMS, {"gpus": 8},
            spec.model.model_dump(), cfg).argv]
    assert argv[:3] == ["/venv/bin/python", "-m", "tasks.emulator.server"]
    assert get_backend("emulated").validate([argv], cfg) == [{"ok": True}]
    assert seen == [argv[3:]] and seen[0][0] == "--model-path"
    assert mod.strip_launcher(["--model-path", "m"], ["{python}", "-m", "x"]) == ["--model-path", "m"]


def test_a_path_turned_off_counts_only_when_the_level_expected_it():
    log = "INFO CustomAllReduceV2 is disabled because it's not supported on more than two PCIe-only GPUs.\n"
    be = get_backend("sglang")
    assert be.paths_taken(log, {"allreduce": "custom"}) == ["allreduce_path_degraded"]
    assert be.paths_taken(log, {"allreduce": "nccl"}) == []  # the NCCL level turned it off on purpose
    assert be.paths_taken(log, {}) == ["allreduce_path_degraded"]  # no expectation: reported
    assert be.paths_taken("INFO ready\n", {"allreduce": "custom"}) == []
