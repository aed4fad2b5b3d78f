"""Config composition and validation: every shipped group validates; bad input names the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from sweeps.config.spec import ConfigError, load_spec
from tests.conftest import CONF, compose_cfg

SWEEPS = sorted(p.stem for p in (CONF / "sweep").glob("*.yaml") if p.stem != "recheck")
BACKENDS = sorted(p.stem for p in (CONF / "backend").glob("*.yaml"))


#: sweeps written for vLLM's knobs; smoke's knobs (speculative, allreduce, CUDA-graph size) both
#: engines have; every other shipped sweep sets SGLang-only knobs (NCCL env, MoE A2A, EAGLE shape)
VLLM_SWEEPS = {"cpu_real"}
PORTABLE = {"smoke"}
VLLM_RUN = ["node=local_cpu", "model=tiny_llama"]


@pytest.mark.parametrize("sweep", SWEEPS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_every_shipped_config_validates_on_its_engine(sweep, backend):
    vllm_sweep, vllm_backend = sweep in VLLM_SWEEPS, backend == "vllm"
    overrides = [f"sweep={sweep}", f"backend={backend}", *(VLLM_RUN if vllm_sweep else [])]
    if vllm_sweep != vllm_backend and sweep not in PORTABLE:  # the other engine's knobs: refused, naming the backend
        with pytest.raises(ConfigError) as e:
            load_spec(compose_cfg(overrides))
        want = "backend=vllm" if vllm_sweep else "backend=emulated"
        assert "backend.kind:" in str(e.value) and want in str(e.value), str(e.value)
        return
    spec = load_spec(compose_cfg(overrides))
    assert spec.sweep.name == sweep
    assert spec.gpus_per_trial == spec.node.gpus
    assert spec.mlflow_uri.startswith("sqlite:////")  # absolute path
    assert Path(spec.artifact_location.removeprefix("file://")).is_absolute()


def test_store_paths_do_not_depend_on_cwd(tmp_path, monkeypatch):
    a = load_spec(compose_cfg())
    monkeypatch.chdir(tmp_path)
    b = load_spec(compose_cfg())
    assert a.mlflow_uri == b.mlflow_uri and a.optuna_storage == b.optuna_storage


def _err(overrides):
    with pytest.raises(ConfigError) as e:
        load_spec(compose_cfg(overrides))
    return str(e.value)


@pytest.mark.parametrize(
    "overrides,needle",
    [
        (["+sweep.params.not_a_knob={type:categorical,choices:[a]}"], "sweep.params.not_a_knob: unknown knob"),
        (["sweep.params.allreduce.choices=[]"], "params.allreduce.choices is empty"),
        (["bench.repeats=zero"], "bench.repeats"),
        (["bench.output_len=1"], "bench.output_len"),
        (["node.gpus=-1"], "node.gpus"),
        (["sweep.params.eagle_num_steps.low=9"], "params.eagle_num_steps: low=9 > high=5"),
        (["sweep.baseline.allreduce=ring"], "sweep.baseline"),
        (["+sweep.budget.trails=3"], "sweep.budget.trails"),
        # pydantic alone reads true as 1: one trial run instead of a refusal
        (["sweep.budget.trials=true"], "sweep.budget.trials: Value error, true is not a number"),
        (["bench.repeats=false"], "bench.repeats"),
        (["backend.tp_size=16"], "backend.tp_size=16 exceeds node.gpus=8"),
        (["sweep.constraints=[{name: never, expr: 'cuda_graph_max_bs > 100000'}]"], "no config in the space satisfies"),
        (["sweep.constraints=[{name: z, expr: 'cuda_graph_max_bs / 0 > 1'}]"], "cannot be evaluated"),
        (["sweep.constraints=[{name: p, expr: '9 ** 9 ** 9 > cuda_graph_max_bs'}]"], "Pow is not allowed"),
        (["~sweep.params.cuda_graph_max_bs.ordered", "sweep.params.cuda_graph_max_bs.choices=[64,big,128]"],
         "cuda_graph_max_bs takes whole numbers only"),
        # the campaign declares its graph sizes ordered: a non-number among them is refused there first
        (["sweep.params.cuda_graph_max_bs.choices=[64,big,128]"],
         "sweep.params.cuda_graph_max_bs.choices: [64, 'big', 128] are not all numbers"),
        (["~sweep.params.cuda_graph_max_bs.choices", "sweep.params.cuda_graph_max_bs.type=float",
          "+sweep.params.cuda_graph_max_bs.low=63.5", "+sweep.params.cuda_graph_max_bs.high=600"],
         "parses cuda_graph_max_bs as an int"),
        (["sweep.params.allreduce.choices=[nccl,custom,ring_allreduce]"], "level 'ring_allreduce'"),
        (["study_name=../../escaped"], "study_name"),
        (["study_name=.."], "study_name: Value error, '..' starts with '.'"),
        (["study_name=-rf"], "study_name: Value error, '-rf' starts with '-'"),
        (["sweep.constraints=['cuda_graph_max_bs <= 4']"], "a constraint is {name: <name>, expr:"),
        (["backend.launcher=[]"], "backend.launcher"),
        (["sweep.confirm.repeats=6", "sweep.confirm.max_repeats=4"], "raise max_repeats to at least 6"),
        (["sweep.confirm.margin=0"], "sweep.confirm.margin"),
        # a variable a searched knob sets: its "default" level would run with the override
        (["+backend.env.NCCL_ALGO=Rnig"], "backend.env.NCCL_ALGO: the searched knob sweep.params.nccl_algo sets"),
    ],
)
def test_bad_config_names_the_field(overrides, needle):
    assert needle in _err(overrides)


def test_a_backend_env_variable_no_knob_sets_is_accepted():  # a guard of the overlap check
    load_spec(compose_cfg(["+backend.env.NCCL_DEBUG=WARN"]))


def test_unknown_group_option_is_a_hydra_error():
    from hydra.errors import MissingConfigException

    with pytest.raises(MissingConfigException):
        compose_cfg(["sweep=does_not_exist"])


@pytest.mark.parametrize("sweep", SWEEPS)
def test_every_confirm_and_approaches_field_overrides_without_plus(sweep):
    """The README documents sweep.confirm.* and sweep.approaches.* overrides: Hydra's struct mode
    refuses a key the YAML does not declare, so each sweep declares every field of the models."""
    from sweeps.config.spec import ApproachesConfig, ConfirmConfig

    engine = ["backend=vllm", *VLLM_RUN] if sweep in VLLM_SWEEPS else ["backend=emulated"]
    base = [f"sweep={sweep}", *engine]
    cfg = compose_cfg(base)
    assert set(ConfirmConfig.model_fields) <= set(cfg.sweep.confirm), sweep
    overrides = ["sweep.confirm.futility=false", "sweep.confirm.descend=2", "sweep.confirm.margin=0.02"]
    if cfg.sweep.get("approaches") is not None:
        assert set(ApproachesConfig.model_fields) <= set(cfg.sweep.approaches), sweep
        overrides += ["sweep.approaches.release_after=3", "sweep.approaches.release_below=0.1"]
    spec = load_spec(compose_cfg([*base, *overrides]))
    assert (spec.sweep.confirm.futility, spec.sweep.confirm.descend, spec.sweep.confirm.margin) == (False, 2, 0.02)
    if spec.sweep.approaches is not None:
        assert (spec.sweep.approaches.release_after, spec.sweep.approaches.release_below) == (3, 0.1)


def test_recheck_declares_every_confirm_field():
    """sweep=recheck needs a source to compose; its YAML declares the same confirm keys."""
    from omegaconf import OmegaConf

    from sweeps.config.spec import ConfirmConfig

    confirm = OmegaConf.load(CONF / "sweep" / "recheck.yaml").confirm
    assert set(ConfirmConfig.model_fields) <= set(confirm)
