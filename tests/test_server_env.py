"""Shell variables that matter (NCCL_*, CUDA_*, SGLANG_*, VLLM_*, HF_*, TORCH_*) reach the
servers through the trial's env, the same path locally and on a Ray cluster; backend.env
wins; CUDA_VISIBLE_DEVICES and secret-looking names are never copied."""

from __future__ import annotations

import logging

from sweeps.app.inprocess import run_in_process
from sweeps.config.server_env import shell_env
from sweeps.config.spec import load_spec
from tests.conftest import compose_cfg


def test_relevant_shell_variables_reach_the_trial_env(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("NCCL_ALGO", "Ring")
    monkeypatch.setenv("SGLANG_TEST_KNOB", "1")
    monkeypatch.setenv("NCCL_PROTO", "from-shell")
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.setenv("UNRELATED_VAR", "x")
    spec = load_spec(compose_cfg(["backend=instant", "sweep=smoke", "sweep.budget.wall_time_s=null",
                                  "sweep.budget.trials=1", "sweep.confirm.top_k=0", "+backend.env.NCCL_PROTO=Simple",
                                  f"tracking.store_dir={tmp_path / 's'}", f"tracking.findings_dir={tmp_path / 'f'}"]))
    seen = []

    def hook(args):
        seen.append(dict(args[0].env))
        return None

    with caplog.at_level(logging.INFO, logger="servesweep"):
        run_in_process(spec, task_hook=hook)
    assert seen
    env = seen[0]
    assert env["NCCL_ALGO"] == "Ring" and env["SGLANG_TEST_KNOB"] == "1"
    assert env["NCCL_PROTO"] == "Simple"  # backend.env wins over the shell
    assert "HF_TOKEN" not in env and "CUDA_VISIBLE_DEVICES" not in env and "UNRELATED_VAR" not in env
    text = caplog.text
    assert "forwarding to the servers from the driver's shell: NCCL_ALGO, SGLANG_TEST_KNOB" in text
    assert "HF_TOKEN" in text and "look like secrets" in text and "hf_secret" not in text


def test_shell_env_selection():
    fwd, withheld = shell_env({"TORCH_NCCL_X": "1", "VLLM_API_KEY": "k", "PATH": "/bin", "HF_HOME": "/h"}, {})
    assert fwd == {"HF_HOME": "/h", "TORCH_NCCL_X": "1"} and withheld == ["VLLM_API_KEY"]


def test_every_name_the_log_redaction_masks_is_withheld_from_the_servers():
    names = {"HF_AUTH": "a", "CUDA_PASSPHRASE": "b", "SGLANG_CREDENTIAL": "c", "HF_TOKEN": "d", "NCCL_ALGO": "Ring",
             "HF_HOME": "/h", "SGLANG_MAX_TOKENS": "9"}
    fwd, withheld = shell_env(names, {})
    assert sorted(withheld) == ["CUDA_PASSPHRASE", "HF_AUTH", "HF_TOKEN", "SGLANG_CREDENTIAL"]
    assert fwd == {"HF_HOME": "/h", "NCCL_ALGO": "Ring", "SGLANG_MAX_TOKENS": "9"}


def test_a_shell_variable_a_searched_knob_sets_is_not_forwarded(caplog):
    from sweeps.config.server_env import with_shell_env
    from sweeps.config.spec import backend_dict, knob_env_vars

    spec = load_spec(compose_cfg([]))  # the campaign's sweep searches nccl_algo and nccl_proto
    knobs = knob_env_vars(spec)
    assert knobs.get("NCCL_ALGO") == "nccl_algo" and knobs.get("NCCL_PROTO") == "nccl_proto"
    with caplog.at_level(logging.INFO, logger="servesweep"):
        got = with_shell_env(backend_dict(spec), {"NCCL_ALGO": "Ring", "NCCL_DEBUG": "WARN"}, knob_vars=knobs)
    # the nccl_algo=default level must run with NCCL_ALGO unset, as it is credited
    assert "NCCL_ALGO" not in got["env"] and got["env"]["NCCL_DEBUG"] == "WARN"
    assert "not forwarded to the servers: NCCL_ALGO, set by the searched knob(s) nccl_algo" in caplog.text
