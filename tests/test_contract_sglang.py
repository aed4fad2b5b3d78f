"""Contract: what servesweep renders is what SGLang 0.5.23's own parser accepts.

The checks run in the contract venv (``scripts/contract_env.sh`` -> ``.contract-venv``,
SGLang 0.5.23 on CPU torch) through ``python -m tasks.backends.sglang.cli check-argv`` with the
repo on PYTHONPATH; this test process only renders and compares. Without the venv these
tests skip with the reason; under ``CI=true`` a missing venv is a failure.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from tasks.backends.sglang import cli as sglang_cli
from tasks.backends.sglang.knobs import render_launch

pytestmark = pytest.mark.contract

ROOT = Path(__file__).resolve().parent.parent
VENV_PY = ROOT / ".contract-venv" / "bin" / "python"
NODE = yaml.safe_load((ROOT / "conf/node/rtx_pro_6000x8.yaml").read_text())
MODEL = yaml.safe_load((ROOT / "conf/model/kimi_k25_eagle3.yaml").read_text())
BACKEND = {"kind": "sglang", "launcher": ["python", "-m", "sglang.launch_server"], "sglang_version": "0.5.23"}
NODE_FLAGS = ["--host", "127.0.0.1", "--port", "30011", "--nccl-port", "30012"]  # as tasks/trial.py adds them


def _unavailable(reason: str) -> None:
    msg = f"CONTRACT CHECK NOT RUN: {reason}. Build it with scripts/contract_env.sh"
    if os.environ.get("CI") == "true":
        pytest.fail(msg + " (CI=true: a skipped contract test is a failure)")
    pytest.skip(msg)


@pytest.fixture(scope="module")
def contract_python() -> str:
    if not VENV_PY.exists():
        _unavailable(f"{VENV_PY} is missing")
    probe = subprocess.run(
        [str(VENV_PY), "-c", "import importlib.metadata as m; print(m.version('sglang'))"],
        capture_output=True, text=True, timeout=60, check=False,
    )
    if probe.returncode != 0 or probe.stdout.strip() != "0.5.23":
        _unavailable(f"{VENV_PY} has no SGLang 0.5.23 ({probe.stdout.strip() or probe.stderr.strip()[-300:]})")
    return str(VENV_PY)


class Verdicts:
    """SGLang 0.5.23's verdict on every argv the tests need, from two checker runs.

    Importing SGLang costs 4-8 s per subprocess on our 2-core machines, so every test
    registers its argvs here (at collection-independent module level) and the module
    fixture checks them all at once: one strict run, one lenient run.
    """

    def __init__(self, py: str):
        self.py = py
        self.flags: dict | None = None
        self._res: dict[tuple[bool, tuple[str, ...]], dict] = {}

    def run(self, strict: bool, argvs: list[list[str]]) -> None:
        uniq = list(dict.fromkeys(tuple(a) for a in argvs))
        cli = ["check-argv", "--json", "-"] + ([] if strict else ["--lenient"])
        proc = sglang_cli._run_checker(self.py, cli, timeout_s=300.0, stdin=json.dumps([list(a) for a in uniq]))
        assert proc.returncode in (0, 1), proc.stdout + proc.stderr[-2000:]
        out = json.loads(proc.stdout)
        self.flags = out["flags"]
        assert len(out["results"]) == len(uniq)
        for a, r in zip(uniq, out["results"]):
            self._res[(strict, a)] = r

    def __call__(self, argvs: list[list[str]], strict: bool = True) -> list[dict]:
        return [self._res[(strict, tuple(a))] for a in argvs]


def _assert_all_ok(argvs: list[list[str]], results: list[dict]) -> None:
    bad = [(a, r["error"]) for a, r in zip(argvs, results) if not r["ok"]]
    assert not bad, f"{len(bad)} of {len(argvs)} rendered argvs rejected by SGLang 0.5.23, e.g. {bad[:3]}"


# --- the flag table ----------------------------------------------------------------------
def test_version_table_matches_the_real_0_5_23_parser(check):
    real = sglang_cli.FlagSet.from_dict(check.flags)
    table = sglang_cli.flags_from_table("0.5.23")
    assert real.source == "parser" and real.version == "0.5.23"
    assert dict(real) == dict(table)
    assert not real.missing  # every logical id has a flag in 0.5.23
    assert real["cuda_graph_max_bs"] == "--cuda-graph-max-bs-decode"


# --- knob renderings ---------------------------------------------------------------------
SPEC_SHAPES = [(1, 1, 2), (3, 1, 4), (5, 1, 6), (2, 2, 5), (3, 4, 8), (5, 4, 8)]  # (steps, topk, draft tokens)


def _knob_grid() -> list[dict]:
    """Every combination of the categorical levels of common.md, EAGLE shapes and sizes."""
    out = []
    for allreduce, a2a, bs, mem, algo, proto in itertools.product(
        ["nccl", "custom", "flashinfer_fusion", "torch_symm_mem"],
        ["none", "flashinfer"],
        [8, 128, 512],
        [None, 0.85],
        ["default", "Ring", "Tree"],
        ["default", "LL", "LL128", "Simple"],
    ):
        base = {"allreduce": allreduce, "moe_a2a_backend": a2a, "cuda_graph_max_bs": bs,
                "nccl_algo": algo, "nccl_proto": proto}
        if mem is not None:
            base["mem_fraction_static"] = mem
        out.append({**base, "speculative": "none"})
        for s, k, d in SPEC_SHAPES:
            out.append({**base, "speculative": "eagle3", "eagle_num_steps": s, "eagle_topk": k,
                        "eagle_num_draft_tokens": d})
    return out


def _render_unique(configs, backend=BACKEND) -> list[list[str]]:
    seen: dict[tuple, list[str]] = {}
    for p in configs:
        argv, _, _ = render_launch(p, NODE, MODEL, backend, flags=sglang_cli.flags_from_table("0.5.23"))
        seen.setdefault(tuple(argv), [*argv, *NODE_FLAGS])
    return list(seen.values())


def test_every_knob_level_renders_to_an_argv_sglang_accepts(check):
    argvs = _render_unique(_knob_grid())
    assert len(argvs) >= 4 * 2 * 3 * 2 * (1 + len(SPEC_SHAPES))  # env-only knobs collapse
    _assert_all_ok(argvs, check(argvs))
    from tasks.emulator.flags import parse_flags

    for a in argvs:  # the emulated server reads the same knob table: it accepts them too
        parse_flags(sglang_cli.server_args_of(a), "0.5.23")


def test_every_flag_the_emulated_server_accepts_exists_in_sglang_0_5_23(contract_python):
    """The knob table's 0.5.23 rows (names and aliases) are option strings of SGLang's real parser."""
    from tasks.emulator.flags import flag_names

    dump = ("import argparse, json; from sglang.srt.server_args import ServerArgs; p = argparse.ArgumentParser(); "
            "ServerArgs.add_cli_args(p); print(json.dumps(sorted(p._option_string_actions)))")
    proc = subprocess.run([contract_python, "-c", dump], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    real = set(json.loads(proc.stdout.strip().splitlines()[-1]))
    assert flag_names("0.5.23") <= real, sorted(flag_names("0.5.23") - real)


# --- shipped sweep configs ---------------------------------------------------------------
def _sweep_files() -> list[Path]:
    """The shipped sweeps over SGLang knobs (a vLLM sweep such as cpu_real is not SGLang's to check)."""
    from tasks.backends.sglang.knobs import KNOWN_KNOBS

    files = sorted((ROOT / "conf/sweep").glob("*.yaml"))
    return [f for f in files if set(_sweep_body(f).get("params") or {}) <= KNOWN_KNOBS]


def _sweep_body(sweep_file: Path) -> dict:
    """The sweep mapping of a conf/sweep file (a ``# @package _global_`` file nests it under ``sweep:``)."""
    cfg = yaml.safe_load(sweep_file.read_text()) or {}
    return cfg["sweep"] if isinstance(cfg.get("sweep"), dict) else cfg


def _sweep_argvs(sweep_file: Path) -> list[list[str]]:
    """Every trial of a sweep config (grid of its finite space + baseline + seeds), rendered."""
    try:
        from sweeps.config.space import parse_space
    except ImportError as e:  # pragma: no cover - the lead's module
        pytest.skip(f"LOUD SKIP: sweeps.config.space is not importable yet ({e}); shipped sweeps unchecked")
    cfg = _sweep_body(sweep_file)
    space = parse_space(cfg.get("params") or {}, cfg.get("constraints") or [])
    finite = all(p.type != "float" or getattr(p, "step", None) for p in space.params)
    if not finite:
        pytest.skip(f"LOUD SKIP: {sweep_file.name} has a continuous float param; grid enumeration impossible")
    configs = list(space.enumerate(limit=200_000))
    assert configs, f"{sweep_file.name}: no feasible config"
    named = [cfg.get("baseline")] + list(cfg.get("seed_trials") or [])
    configs += [space.normalize(c) for c in named if c]
    return _render_unique(configs)


@pytest.mark.parametrize("sweep_file", _sweep_files(), ids=lambda p: p.stem)
def test_every_trial_of_every_shipped_sweep_is_accepted(check, sweep_file):
    argvs = _sweep_argvs(sweep_file)
    _assert_all_ok(argvs, check(argvs))


# --- rejections ----------------------------------------------------------------------------
GOOD = ["--model-path", "m", "--tp-size", "8"]
BAD_ARGVS = {
    "ambiguous_old_graph_flag": (GOOD + ["--cuda-graph-max-bs", "128"], "--cuda-graph-max-bs"),
    "typo": (GOOD + ["--disable-custom-allreduce"], "--disable-custom-allreduce"),
    "bad_choice": (GOOD + ["--moe-a2a-backend", "nvshmem"], "--moe-a2a-backend"),
    "bad_int": (GOOD + ["--cuda-graph-max-bs-decode", "lots"], "--cuda-graph-max-bs-decode"),
    "unknown_spec_algorithm": (GOOD + ["--speculative-algorithm", "EAGLE4"], "--speculative-algorithm"),
    "missing_model_path": (["--tp-size", "8"], None),
}


def test_sglang_rejects_bad_argvs_and_preflight_names_the_flag(check):
    names = list(BAD_ARGVS)
    results = check([BAD_ARGVS[n][0] for n in names])
    for name, res in zip(names, results):
        flag = BAD_ARGVS[name][1]
        assert not res["ok"], f"{name}: SGLang 0.5.23 accepted {BAD_ARGVS[name][0]}"
        if flag:
            assert res["flag"] == flag and flag in res["error"], (name, res)
    # the fix is in the message
    assert "--cuda-graph-max-bs-decode" in results[0]["error"]
    assert "--disable-custom-all-reduce" in results[1]["error"]
    assert "flashinfer" in results[2]["error"]  # lists the valid choices


ABBREV = GOOD + ["--cuda-graph-max-bs-dec", "64", "--mem-frac", "0.8"]


def test_strict_preflight_refuses_abbreviations_sglang_would_accept(check, contract_python):
    lenient, strict = check([ABBREV], strict=False)[0], check([ABBREV])[0]
    assert lenient["ok"], lenient  # SGLang's parser takes unique prefixes...
    assert not strict["ok"] and strict["flag"] == "--cuda-graph-max-bs-dec"  # ...servesweep does not
    # the public API end to end (one subprocess): launcher prefix stripped, fix named
    with pytest.raises(sglang_cli.PreflightError, match="--cuda-graph-max-bs-decode") as ei:
        sglang_cli.preflight_argv(["python", "-m", "sglang.launch_server", *ABBREV], python=contract_python)
    assert ei.value.flag == "--cuda-graph-max-bs-dec"


def test_checker_cli_exit_codes(check, contract_python):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = lambda payload: subprocess.run(  # noqa: E731
        [contract_python, "-m", "tasks.backends.sglang.cli", "check-argv", "--json", json.dumps(payload)],
        capture_output=True, text=True, env=env, cwd=str(ROOT), timeout=120, check=False,
    )
    bad = run([GOOD, GOOD + ["--tp-sizes", "8"]])
    assert bad.returncode == 1, bad.stderr[-2000:]
    out = json.loads(bad.stdout)
    assert out["sglang_version"] == "0.5.23"
    assert [r["ok"] for r in out["results"]] == [True, False]
    assert check([GOOD])[0]["ok"]  # and the all-accepted batch exits 0 (the fixture asserts 0|1)


# --- the emulated server rejects what SGLang rejects --------------------------------------
EMULATOR_CASES = {
    "good": GOOD,
    "good_full": GOOD + ["--disable-custom-all-reduce", "--enforce-disable-flashinfer-allreduce-fusion",
                         "--cuda-graph-max-bs-decode", "128", "--speculative-algorithm", "EAGLE3",
                         "--speculative-draft-model-path", "d", "--speculative-num-steps", "3",
                         "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4", *NODE_FLAGS],
    "good_fusion": GOOD + ["--disable-custom-all-reduce", "--enable-flashinfer-allreduce-fusion"],
    "good_symm_a2a": GOOD + ["--enable-torch-symm-mem", "--moe-a2a-backend", "flashinfer", "--ep-size", "8"],
    "abbreviation_unique": GOOD + ["--cuda-graph-max-bs-dec", "64"],
    "ambiguous": GOOD + ["--cuda-graph-max-bs", "128"],
    "typo": GOOD + ["--disable-custom-allreduce"],
    "bad_choice": GOOD + ["--moe-a2a-backend", "nvshmem"],
    "bad_int": GOOD + ["--tp-size", "eight"],
    "unknown_spec_algorithm": GOOD + ["--speculative-algorithm", "EAGLE4"],
    "missing_model_path": ["--tp-size", "8"],
}


def test_emulated_server_accepts_and_rejects_like_sglang(check):
    try:
        from tasks.emulator.flags import LaunchArgError, parse_flags
    except ImportError as e:  # pragma: no cover - another helper's module
        pytest.skip(f"LOUD SKIP: tasks.emulator.flags not importable yet ({e})")
    names = list(EMULATOR_CASES)
    real = check([EMULATOR_CASES[n] for n in names], strict=False)
    mismatches = []
    for name, res in zip(names, real):
        try:
            parse_flags(list(EMULATOR_CASES[name]), "0.5.23")
            emu_ok = True
        except LaunchArgError:
            emu_ok = False
        if emu_ok != res["ok"]:
            mismatches.append(f"{name}: SGLang {'accepts' if res['ok'] else 'rejects'}, emulator "
                              f"{'accepts' if emu_ok else 'rejects'} ({res['error']})")
    assert not mismatches, "\n".join(mismatches)


@pytest.fixture(scope="module")
def check(contract_python) -> Verdicts:
    """Every argv of this module checked by SGLang 0.5.23 in two subprocess runs."""
    v = Verdicts(contract_python)
    strict = _render_unique(_knob_grid()) + [a for a, _ in BAD_ARGVS.values()] + [ABBREV, GOOD]
    for f in _sweep_files():
        try:
            strict += _sweep_argvs(f)
        except pytest.skip.Exception:
            pass  # the per-sweep test reports the skip
    v.run(True, strict)
    v.run(False, [ABBREV, *EMULATOR_CASES.values()])
    return v
