"""The deployable command (Backend.deploy_command): the target node's real engine, never the
emulator's launcher, ephemeral ports or a venv path; SGLang 0.5.23's parser accepts it."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import yaml

from tasks.backends import get_backend

ROOT = Path(__file__).resolve().parent.parent
NODE = yaml.safe_load((ROOT / "conf/node/rtx_pro_6000x8.yaml").read_text())
MODEL = yaml.safe_load((ROOT / "conf/model/kimi_k25_eagle3.yaml").read_text())
EMULATED = yaml.safe_load((ROOT / "conf/backend/emulated.yaml").read_text())
VLLM = yaml.safe_load((ROOT / "conf/backend/vllm.yaml").read_text())
PARAMS = {"allreduce": "custom", "speculative": "eagle3", "nccl_proto": "LL", "cuda_graph_max_bs": 16}
CONTRACT_PY = ROOT / ".contract-venv" / "bin" / "python"


def split_deploy(cmd: str) -> tuple[dict[str, str], list[str]]:
    """``VAR=v ... python -m module args`` -> (env, argv)."""
    words = shlex.split(cmd)
    env = {}
    while words and "=" in words[0] and not words[0].startswith("-"):
        k, v = words.pop(0).split("=", 1)
        env[k] = v
    return env, words


@pytest.mark.parametrize("kind", ["emulated", "instant", "sglang"])
def test_sglang_family_deploys_sglang_launch_server_on_fixed_port(kind):
    cmd = get_backend(kind).deploy_command(PARAMS, NODE, MODEL, EMULATED)
    env, argv = split_deploy(cmd)
    assert argv[:3] == ["python", "-m", "sglang.launch_server"]
    assert env == {"NCCL_PROTO": "LL"}
    assert argv[argv.index("--model-path") + 1] == MODEL["path"]
    assert argv[argv.index("--tp-size") + 1] == "8"
    assert argv[-4:] == ["--host", "0.0.0.0", "--port", "30000"]
    assert "--nccl-port" not in argv
    assert "tasks.emulator.server" not in cmd and ".venv" not in cmd and "{python}" not in cmd


def test_vllm_deploys_openai_api_server():
    cmd = get_backend("vllm").deploy_command({"allreduce": "custom", "max_num_seqs": 8}, NODE, MODEL, VLLM)
    env, argv = split_deploy(cmd)
    assert argv[:3] == ["python", "-m", "vllm.entrypoints.openai.api_server"]
    assert argv[-4:] == ["--host", "0.0.0.0", "--port", "8000"]
    assert argv[argv.index("--max-num-seqs") + 1] == "8"
    assert ".vllm-venv" not in cmd and env["VLLM_ALLREDUCE_USE_SYMM_MEM"] == "0"


@pytest.mark.contract
def test_sglang_0_5_23_parser_accepts_the_deploy_command():
    if not CONTRACT_PY.exists():
        pytest.skip(f"{CONTRACT_PY} missing (scripts/contract_env.sh)")
    from tasks.backends.sglang.cli import check_many

    cmds = [get_backend("emulated").deploy_command(p, NODE, MODEL, EMULATED)
            for p in (PARAMS, {"allreduce": "nccl", "speculative": "none"})]
    verdicts = check_many([split_deploy(c)[1][3:] for c in cmds], python=str(CONTRACT_PY))
    assert [v["ok"] for v in verdicts] == [True, True], verdicts


def _summary_command(tmp_path, backend: str) -> tuple[str, str]:
    from sweeps.app.inprocess import run_in_process
    from sweeps.config.spec import load_spec
    from tests.conftest import compose_cfg

    store = tmp_path / "store"
    spec = load_spec(compose_cfg([f"backend={backend}", "sweep=smoke", "sweep.budget.trials=2", "sweep.confirm.top_k=0",
                                  f"tracking.store_dir={store}", f"tracking.findings_dir={store / 'findings'}"]))
    drv = run_in_process(spec)
    text = (store / "reports" / drv.study_name / "summary.txt").read_text()
    lines = text.splitlines()
    i = lines.index("deploy command (target node, real engine):")
    return text, lines[i + 1]


@pytest.mark.parametrize("backend", ["instant", "emulated"])
def test_summary_prints_the_deploy_command_and_labels_the_emulated_node(tmp_path, backend):
    text, cmd = _summary_command(tmp_path, backend)
    env, argv = split_deploy(cmd)
    assert argv[:3] == ["python", "-m", "sglang.launch_server"] and argv[-2:] == ["--port", "30000"]
    assert "tasks.emulator" not in cmd and "--nccl-port" not in cmd
    assert "emulated 8×RTX PRO 6000: " in text  # the numbers are the emulated node's
    assert "GPU-hours, modelled: emulated node, no real GPU used" in text  # the booking says what it is
    if CONTRACT_PY.exists():
        from tasks.backends.sglang.cli import check_many

        assert check_many([argv[3:]], python=str(CONTRACT_PY))[0]["ok"], cmd


def test_estimate_says_it_is_a_real_node_projection_and_who_books_it():
    from sweeps.app.estimate import estimate_gpu_hours
    from sweeps.config.spec import load_spec
    from tests.conftest import compose_cfg

    _, emu = estimate_gpu_hours(load_spec(compose_cfg(["backend=emulated"])))
    _, real = estimate_gpu_hours(load_spec(compose_cfg(["backend=sglang"])))
    assert "on the real node (a projection from the emulator's model)" in emu and real.startswith(emu.split(";")[0][:40])
    assert "runs on the emulated node, no real GPU is used (the GPU-hours its summary books are that run's, not " \
           "this projection)" in emu
    assert "emulated node" not in real
