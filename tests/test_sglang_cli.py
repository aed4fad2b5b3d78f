"""tasks.backends.sglang.cli without SGLang: version table, FlagSet, argv checks on a stand-in parser."""

from __future__ import annotations

import argparse

import pytest

from tasks.backends.sglang import cli as sc
from tasks.backends.sglang.knobs import KnobError, render_launch


def fake_sglang_parser() -> argparse.ArgumentParser:
    """A parser shaped like SGLang 0.5.23's for the flags these tests touch."""
    p = sc._RaisingParser(prog="sglang serve")
    p.add_argument("--model-path", "--model", required=True)
    p.add_argument("--tp-size", "--tensor-parallel-size", type=int, default=1)
    p.add_argument("--cuda-graph-max-bs-decode", type=int)
    p.add_argument("--cuda-graph-max-bs-prefill", type=int)
    p.add_argument("--cuda-graph-bs-decode", type=int, nargs="+")
    p.add_argument("--disable-custom-all-reduce", action="store_true")
    p.add_argument("--moe-a2a-backend", choices=["none", "flashinfer"], default="none")
    p.add_argument("--json-model-override-args")
    return p


def test_table_versions():
    new, old = sc.flags_from_table("0.5.23"), sc.flags_from_table("0.5.10")
    assert new["cuda_graph_max_bs"] == "--cuda-graph-max-bs-decode"
    assert old["cuda_graph_max_bs"] == "--cuda-graph-max-bs"
    assert sc.flags_from_table("0.5.14")["cuda_graph_max_bs"] == "--cuda-graph-max-bs-decode"
    assert sc.flags_from_table("0.5.15.post1").version == "0.5.15.post1"
    assert "flashinfer_allreduce_fusion_backend" in old.missing and old.get("flashinfer_allreduce_fusion_backend") is None
    with pytest.raises(sc.FlagUnavailable, match="0.5.6 has no flag for 'enforce_disable"):
        sc.flags_from_table("0.5.6")["enforce_disable_flashinfer_allreduce_fusion"]
    with pytest.raises(sc.FlagUnavailable, match="unknown logical flag id"):
        new["no_such_flag"]
    with pytest.raises(ValueError):
        sc.flags_from_table("latest")
    assert sc.FlagSet.from_dict(new.to_dict()) == new


def test_resolve_prefers_the_parser_and_exact_names_only():
    p = fake_sglang_parser()
    fs = sc.resolve_flags(parser=p, version="x")
    assert fs.source == "parser" and fs["cuda_graph_max_bs"] == "--cuda-graph-max-bs-decode"
    assert "enable_torch_symm_mem" in fs.missing  # not in the stand-in: never guessed by prefix
    legacy = sc._RaisingParser()
    legacy.add_argument("--cuda-graph-max-bs", type=int)
    assert sc.resolve_flags(parser=legacy)["cuda_graph_max_bs"] == "--cuda-graph-max-bs"
    if not sc.sglang_importable():  # the usual test venv: table fallback
        assert sc.resolve_flags("0.5.10").source == "table"


def test_server_args_of_strips_launchers():
    tail = ["--model-path", "m"]
    assert sc.server_args_of(["python", "-m", "sglang.launch_server", *tail]) == tail
    assert sc.server_args_of(["/v/bin/sglang", "serve", *tail]) == tail
    assert sc.server_args_of(["docker", "run", "img", "python3", "/sgl/launch_server.py", *tail]) == tail
    assert sc.server_args_of(tail) == tail


@pytest.mark.parametrize(
    "extra, flag, fix",
    [
        (["--cuda-graph-max-bs", "8"], "--cuda-graph-max-bs", "--cuda-graph-max-bs-decode"),
        (["--cuda-graph-max-bs-dec", "8"], "--cuda-graph-max-bs-dec", "--cuda-graph-max-bs-decode"),
        (["--tp", "8"], "--tp", "--tp-size"),
        (["--disable-custom-allreduce"], "--disable-custom-allreduce", "--disable-custom-all-reduce"),
        (["--moe-a2a-backend", "deepep"], "--moe-a2a-backend", "flashinfer"),
        (["--tp-size", "eight"], "--tp-size", "invalid int"),
    ],
)
def test_strict_check_names_flag_and_fix(extra, flag, fix):
    with pytest.raises(sc.PreflightError) as ei:
        sc.check_server_args(["--model-path", "m", *extra], parser=fake_sglang_parser())
    assert ei.value.flag == flag and fix in str(ei.value)


def test_values_are_not_mistaken_for_flags_and_lenient_matches_argparse():
    p = fake_sglang_parser()
    ns = sc.check_server_args(
        ["--model-path", "m", "--cuda-graph-bs-decode", "1", "2", "4", "--json-model-override-args=--x",
         "--tp-size=8", "--disable-custom-all-reduce"], parser=p)
    assert ns.cuda_graph_bs_decode == [1, 2, 4] and ns.tp_size == 8
    ns = sc.check_server_args(["--model-path", "m", "--cuda-graph-max-bs-dec", "8"], parser=p, strict=False)
    assert ns.cuda_graph_max_bs_decode == 8  # what SGLang itself would do
    with pytest.raises(sc.PreflightError, match="ambiguous"):
        sc.check_server_args(["--model-path", "m", "--cuda-graph-max-bs", "8"], parser=p, strict=False)
    with pytest.raises(sc.PreflightError, match="--config"):
        sc.check_server_args(["--model-path", "m", "--config", "x.yaml"], parser=p)


def test_preflight_without_sglang_or_interpreter_is_loud(monkeypatch):
    monkeypatch.setattr(sc, "sglang_importable", lambda: False)
    with pytest.raises(sc.SGLangUnavailable, match="pass python="):
        sc.preflight_argv(["--model-path", "m"])
    with pytest.raises(sc.SGLangUnavailable):
        sc.preflight_argv(["--model-path", "m"], python="/nonexistent/python")


def test_knobs_render_version_specific_names():
    node, model = {"gpus": 8}, {"path": "m", "draft_path": "d"}
    new, _, _ = render_launch({"allreduce": "nccl", "cuda_graph_max_bs": 64}, node, model, {"sglang_version": "0.5.23"})
    old, _, _ = render_launch({"allreduce": "custom", "cuda_graph_max_bs": 64}, node, model, {"sglang_version": "0.5.10"})
    assert new[-2:] == ["--cuda-graph-max-bs-decode", "64"] and old[-2:] == ["--cuda-graph-max-bs", "64"]
    with pytest.raises(KnobError, match="0.5.6 has no flag"):
        render_launch({"allreduce": "nccl"}, node, model, {"sglang_version": "0.5.6"})
