"""The one SGLang knob table: rendering and the emulated server read the same flag names for
every version, the table is validated at load, and a version with a renamed flag runs."""

from __future__ import annotations

import itertools
import json

import pytest

from tasks.backends import get_backend
from tasks.backends.flagtable import FlagTableError, load_flag_table, read_flag_table
from tasks.backends.sglang.cli import flags_from_table
from tasks.backends.sglang.knobs import ALLREDUCE_LEVELS, ENV_KNOBS, KnobError, render_launch
from tasks.emulator.flags import LaunchArgError, build_parser, parse_flags
from tasks.emulator.launch import parse_launch
from tasks.types import BenchSpec, Timeouts, TrialSpec

TABLE = load_flag_table("sglang")
NODE = {"gpus": 8}
MODEL = {"path": "moonshotai/Kimi-K2.5", "draft_path": "AQ-MedAI/Kimi-K25-eagle3", "trust_remote_code": True}
A2A_LEVELS = [c for c in next(r for r in TABLE.rows if r.logical == "moe_a2a_backend").choices if c != "none"]


def knob_levels() -> list[dict]:
    """Every level of every knob (categoricals in full, numbers at one value), one knob set each."""
    eagle = {"speculative": "eagle3", "eagle_num_steps": 3, "eagle_topk": 1, "eagle_num_draft_tokens": 4}
    out = [{"allreduce": a} for a in ALLREDUCE_LEVELS]
    out += [{"speculative": "none"}, eagle]
    out += [{"moe_a2a_backend": a} for a in A2A_LEVELS]
    out += [{"cuda_graph_max_bs": 128}, {"mem_fraction_static": 0.85}]
    out += [{k: "1" if k != "nccl_algo" else "Ring"} for k in ENV_KNOBS]
    return out


def _server_args(argv: list[str]) -> list[str]:
    return argv[argv.index("sglang.launch_server") + 1:]


@pytest.mark.parametrize("version", TABLE.versions_to_check())
def test_every_knob_renders_to_flags_the_emulated_server_accepts(version):
    """For every version of the table: a knob level renders to flags the emulated server parses,
    or rendering refuses it naming a flag the table says this version lacks."""
    names = TABLE.names_for(version)
    # Releases before --enforce-disable-flashinfer-allreduce-fusion cannot pin the NCCL path:
    # pair the other knobs with a level they can render.
    base = {"allreduce": "nccl" if "enforce_disable_flashinfer_allreduce_fusion" in names else "flashinfer_fusion"}
    rendered = 0
    for params in knob_levels():
        try:
            argv, _, _ = render_launch({**base, **params}, NODE, MODEL, {"sglang_version": version})
        except KnobError as e:
            lacking = [i for i in TABLE.logical_ids if i not in names and f"'{i}'" in str(e)]
            assert lacking and version in str(e), f"{params} refused at {version} for no table reason: {e}"
            continue
        try:
            parse_flags(_server_args(argv), version)
        except LaunchArgError as e:
            pytest.fail(f"SGLang {version}: {params} renders {argv[-4:]}, which the emulated server rejects: {e.message}")
        rendered += 1
    assert rendered >= len(knob_levels()) - 3  # only allreduce levels needing the newest flags may be refused


def test_cuda_graph_max_bs_at_0_5_20_reaches_the_model():
    """Regression: 0.5.20 renders --cuda-graph-max-bs-decode; the emulator used to reject it."""
    argv, _, _ = render_launch({"allreduce": "nccl", "cuda_graph_max_bs": 64}, NODE, MODEL, {"sglang_version": "0.5.20"})
    assert argv[-2:] == ["--cuda-graph-max-bs-decode", "64"]
    assert parse_launch(argv, {}, sglang_version="0.5.20").cuda_graph_max_bs == 64
    with pytest.raises(LaunchArgError, match="ambiguous option: --cuda-graph-max-bs could match"):
        parse_flags(["--model-path", "m", "--cuda-graph-max-bs", "8"], "0.5.20")


@pytest.mark.parametrize("version, accepted", [("0.5.10", "cuda_graph_max_bs"), ("0.5.17", "cuda_graph_max_bs_decode"),
                                               ("0.5.19", "cuda_graph_max_bs_decode")])
def test_old_cuda_graph_name_where_sglang_still_accepts_it(version, accepted):
    """Up to 0.5.13 the only name; 0.5.14-0.5.19 a deprecated alias storing into -decode."""
    assert parse_flags(["--model-path", "m", "--cuda-graph-max-bs", "8"], version)[accepted] == 8
    assert parse_launch(["--model-path", "m", "--cuda-graph-max-bs", "8"], {}, sglang_version=version).cuda_graph_max_bs == 8


def test_renderer_and_emulator_read_one_table():
    """The names rendered and the names the emulated server accepts come from the same rows."""
    for version in TABLE.versions_to_check():
        accepted = set(build_parser(version)._option_string_actions)
        rendered = set(flags_from_table(version).flags.values())
        assert rendered <= accepted, (version, sorted(rendered - accepted))
        assert {r.flag for r in TABLE.rows_for(version)} <= accepted


def test_instant_sweep_at_0_5_20_has_no_cli_arg_error():
    """What `run_sweep.py backend=instant sweep=smoke backend.sglang_version=0.5.20` runs, per trial."""
    be = get_backend("instant")
    cfg = {"sglang_version": "0.5.20", "launcher": ["{python}", "-m", "sglang.launch_server"], "emulator": {"noise": 0.0}}
    from tasks.emulator.profile import DEFAULT_MODEL_YAML, DEFAULT_NODE_YAML, load_yaml

    profile = be.profile(load_yaml(DEFAULT_NODE_YAML), load_yaml(DEFAULT_MODEL_YAML), cfg)
    for n, bs in enumerate((64, 128, 512)):
        launch = be.render({"allreduce": "nccl", "cuda_graph_max_bs": bs}, {"gpus": 8}, MODEL, cfg)
        spec = TrialSpec(sweep="t", trial_number=n, params={}, argv=launch.argv, env=launch.env, backend="instant",
                         bench=BenchSpec(), timeouts=Timeouts())
        res = be.run_trial(spec, profile, None)
        assert res.status == "ok" and res.failure_class is None, (res.failure_class, res.log_tail[-400:])


# --- the table is validated at load -------------------------------------------------------
def _write(tmp_path, rows, **top):
    p = tmp_path / "x_flags.json"
    p.write_text(json.dumps({"engine": "x", "default_version": "1.0", "flags": rows, **top}))
    return p


@pytest.mark.parametrize("rows, match", [
    ([{"id": "a", "flag": "-a"}], "starting with '--'"),
    ([{"id": "a", "flag": "--a", "type": "list"}], "type 'list'"),
    ([{"id": "a", "flag": "--a", "since": "1.2", "until": "1.1"}], "not before until"),
    ([{"id": "a", "flag": "--a", "since": "latest"}], "not a version"),
    ([{"id": "a", "flag": "--a", "colour": 1}], "unknown field"),
    ([{"id": "a", "flag": "--a", "until": "1.0"}, {"id": "a", "flag": "--b", "alias_of": "--a", "since": "0.9"}],
     "alias of --a"),
    ([{"id": "a", "flag": "--a"}, {"id": "b", "flag": "--b", "aliases": ["--a"]}], "belongs to both"),
])
def test_malformed_table_names_the_row(tmp_path, rows, match):
    with pytest.raises(FlagTableError, match=match):
        read_flag_table(_write(tmp_path, rows))


def test_table_rows_are_well_formed():
    assert TABLE.default_version in TABLE.inspected_versions
    keys = set(TABLE.sources)
    for r in TABLE.rows:
        cited = {k for k in keys if f"[{k}" in r.source}
        assert cited, f"{r.flag}: no source of {sorted(keys)} cited ({r.source!r})"
    assert len(list(itertools.chain(TABLE.rows))) == len({(r.flag, r.since, r.until) for r in TABLE.rows})
