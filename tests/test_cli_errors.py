"""The command line's config mistakes get one clear line and exit code 2: "did you mean" for a
typo'd key or option (never Hydra's "use +key", which would add the typo), file:line:column
for YAML that does not parse (no traceback)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from sweeps.app.cli_errors import closest, precheck
from tests.conftest import REPO

CONF = REPO / "conf"


def _run(cwd, *args):
    return subprocess.run([sys.executable, str(cwd / "run_sweep.py"), *args], capture_output=True, text=True,
                          timeout=120, cwd=str(cwd), env={**os.environ, "PYTHONPATH": str(REPO)})


@pytest.mark.parametrize("override,suggestion", [
    ("sweep.budgt.trials=3", "did you mean sweep.budget.trials=3?"),
    ("sweep.budget.trails=3", "did you mean sweep.budget.trials=3?"),
    ("dryrun=true", "did you mean dry_run=true?"),
    ("sweep=smok", "did you mean sweep=smoke?"),
])
def test_precheck_suggests_the_closest_declared_key(override, suggestion):
    msg = precheck(CONF, ["sweep=smoke", override] if not override.startswith("sweep=") else [override])
    assert msg is not None and suggestion in msg, msg
    assert "+" not in msg.split("did you mean")[1]  # never the advice to append the typo


def test_precheck_passes_a_valid_command_line():
    assert precheck(CONF, ["sweep=smoke", "sweep.budget.trials=3", "backend=instant"]) is None


def test_typo_exits_2_with_one_line():
    r = _run(REPO, "sweep=smoke", "sweep.budgt.trials=3", "dry_run=true")
    assert r.returncode == 2, r.stderr
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert lines == ["servesweep: unknown config key 'sweep.budgt.trials': did you mean sweep.budget.trials=3? "
                     "(nothing was started)"], r.stderr
    assert "use +" not in r.stderr and "Traceback" not in r.stderr


def test_malformed_yaml_is_one_line_with_file_line_column(tmp_path):
    shutil.copy(REPO / "run_sweep.py", tmp_path / "run_sweep.py")
    shutil.copytree(CONF, tmp_path / "conf")
    bad = tmp_path / "conf" / "sweep" / "smoke.yaml"
    bad.write_text("name: smoke\nparams: {a: [1, 2\nfoo: bar\n")
    r = _run(tmp_path, "sweep=smoke", "dry_run=true")
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1, r.stderr
    assert f"{bad}:3:4: expected ',' or ']', but got ':'" in lines[0]
    assert "Traceback" not in r.stderr


def test_closest_has_a_cutoff():
    assert closest("sweep.budgt", ["sweep.budget", "tracking.uri"]) == "sweep.budget"
    assert closest("zzzz", ["sweep.budget", "tracking.uri"]) is None


def test_config_path_is_prechecked_too(tmp_path):
    """``--config-path`` (a user's own config tree) gets the same one line, not Hydra's traceback."""
    conf = tmp_path / "myconf"
    shutil.copytree(CONF, conf)
    bad = conf / "sweep" / "mine.yaml"
    bad.write_text("name: mine\n  params: [\n")
    r = _run(REPO, "--config-path", str(conf), "sweep=mine", "dry_run=true")
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    assert [x for x in r.stderr.splitlines() if x.strip()] == [
        f"servesweep: {bad}:2:9: mapping values are not allowed here [line 2, column 9] "
        "(the YAML does not parse; nothing was started)"], r.stderr
    assert precheck(CONF, ["--config-path", str(conf), "sweep=smok"]).startswith(
        "servesweep: no config 'sweep/smok.yaml': did you mean sweep=smoke?")
    assert "no config.yaml there" in precheck(CONF, [f"--config-path={tmp_path / 'nowhere'}", "sweep=smoke"])
    assert precheck(CONF, ["--config-path", str(conf), "sweep=smoke"]) is None
    # relative to the entry script's directory, as Hydra resolves it, and no ~ expansion (Hydra has none)
    assert precheck(CONF, ["--config-path", "conf", "sweep=smoke"]) is None
    assert "no config.yaml there" in precheck(CONF, ["--config-path=~/conf", "sweep=smoke"])
    assert precheck(CONF, ["sweep=smoke", "--config-path"]) == "servesweep: --config-path needs a directory (nothing was started)"
    # print-only flags still get the precheck
    assert precheck(CONF, ["--config-path", str(conf), "sweep=smok", "--cfg", "job"]).startswith(
        "servesweep: no config 'sweep/smok.yaml'")
    assert precheck(CONF, ["sweep.budgt.trials=3", "--cfg=job", "--resolve"]).startswith(
        "servesweep: unknown config key 'sweep.budgt.trials'")


def test_a_secret_in_backend_env_never_stays_in_hydras_run_dir(tmp_path):
    """Hydra writes the composed config and the overrides to ``<run dir>/.hydra`` before the job;
    the driver masks secret values there first thing, even when the config is then refused."""
    run_dir = tmp_path / "hydra-run"
    r = _run(REPO, "sweep=smoke", "backend=instant", "sweep.budget.trials=0", "+backend.env.SGLANG_API_KEY=ZZSECRET42",
             "+backend.env.NCCL_ALGO=Ring", f"hydra.run.dir={run_dir}")
    assert r.returncode == 2, r.stderr  # refused (trials=0) after Hydra wrote its files
    written = {p.name: p.read_text() for p in (run_dir / ".hydra").glob("*.yaml")}
    assert set(written) == {"config.yaml", "overrides.yaml", "hydra.yaml"}
    assert not any("ZZSECRET42" in t for t in written.values()), written
    assert "SGLANG_API_KEY: '***'" in written["config.yaml"] and "NCCL_ALGO: Ring" in written["config.yaml"]
    assert "+backend.env.SGLANG_API_KEY=***" in written["overrides.yaml"]
    assert "ZZSECRET42" not in r.stderr + r.stdout


def test_an_override_hydras_grammar_rejects_is_a_config_error_with_exit_2():
    r = _run(REPO, "sweep=smoke", "sweep.constraints=[nonexistent_param<=4]")
    assert r.returncode == 2, r.stderr
    assert "servesweep: cannot parse the override 'sweep.constraints=[nonexistent_param<=4]' at '<=4]'" in r.stderr
    assert "{name: n, expr: 'x <= 4'}" in r.stderr and "LexerNoViableAltException" not in r.stderr


def test_an_unknown_key_under_an_open_mapping_is_told_to_add_it_with_a_plus():
    assert precheck(CONF, ["sweep.params.bogus_knob={type:categorical,choices:[a,b]}"]) == (
        "servesweep: unknown config key 'sweep.params.bogus_knob': sweep.params has no entry 'bogus_knob' yet; "
        "to add one, write +sweep.params.bogus_knob={type:categorical,choices:[a,b]} (nothing was started)")


def test_a_params_optional_field_it_leaves_out_is_told_to_add_it_with_a_plus():
    assert precheck(CONF, ["sweep=smoke", "sweep.params.cuda_graph_max_bs.ordered=true"]) == (
        "servesweep: unknown config key 'sweep.params.cuda_graph_max_bs.ordered': sweep.params.cuda_graph_max_bs "
        "does not set its optional field 'ordered'; to add it, write +sweep.params.cuda_graph_max_bs.ordered=true "
        "(nothing was started)")


def test_a_misspelled_param_under_a_field_is_told_its_spelling_not_to_add_the_field():
    assert precheck(CONF, ["sweep.params.cuda_grph_max_bs.choices=[8,16]"]) == (
        "servesweep: unknown config key 'sweep.params.cuda_grph_max_bs.choices': did you mean "
        "sweep.params.cuda_graph_max_bs.choices=[8,16]? (nothing was started)")
    msg = precheck(CONF, ["sweep.params.brand_new.choices=[8,16]"])  # no such param: it is added whole
    assert "sweep.params has no entry 'brand_new'; a new one is added whole, e.g. +sweep.params.brand_new={" in msg, msg
    assert "optional field" not in msg


def test_an_unknown_key_of_a_fixed_section_lists_its_keys_not_a_far_guess():
    msg = precheck(CONF, ["sweep.bogus=1"])
    assert "sweep has no key 'bogus'; its keys: " in msg and "baseline, budget" in msg and "budget=1" not in msg
