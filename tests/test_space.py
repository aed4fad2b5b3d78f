"""Search-space YAML -> Optuna distributions, conditions and constraints (table-driven)."""

from __future__ import annotations

import optuna
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

from sweeps.config.space import SpaceError, parse_space, to_distribution

CASES = [
    ({"type": "categorical", "choices": ["nccl", "custom"]}, CategoricalDistribution(["nccl", "custom"])),
    ({"choices": [1, 2, 4]}, CategoricalDistribution([1, 2, 4])),
    ({"type": "int", "low": 1, "high": 5}, IntDistribution(1, 5)),
    ({"type": "int", "low": 16, "high": 512, "log": True}, IntDistribution(16, 512, log=True)),
    ({"type": "int", "low": 0, "high": 512, "step": 64}, IntDistribution(0, 512, step=64)),
    ({"type": "float", "low": 0.8, "high": 0.95}, FloatDistribution(0.8, 0.95)),
    ({"type": "float", "low": 0.8, "high": 0.95, "step": 0.05}, FloatDistribution(0.8, 0.95, step=0.05)),
    ({"type": "float", "low": 1e-3, "high": 1.0, "log": True}, FloatDistribution(1e-3, 1.0, log=True)),
]


@pytest.mark.parametrize("raw,expected", CASES)
def test_to_distribution(raw, expected):
    space = parse_space({"k": raw})
    assert to_distribution(space.params[0]) == expected


BAD = [
    ({"k": {"type": "categorical", "choices": []}}, "params.k.choices is empty"),
    ({"k": {"type": "int", "low": 5, "high": 1}}, "params.k: low=5 > high=1"),
    ({"k": {"type": "int", "low": 0, "high": 8, "log": True}}, "log scale needs low > 0"),
    ({"k": {"type": "int", "low": 1, "high": 8, "log": True, "step": 2}}, "log and step are exclusive"),
    ({"k": {"type": "uniform", "low": 1, "high": 2}}, "params.k.type='uniform'"),
    ({"k": {"type": "int", "low": 1}}, "need both low and high"),
    ({"k": {"type": "int", "low": 1, "high": 2, "sigma": 3}}, "unknown field(s) ['sigma']"),
    ({"k": {"type": "int", "low": 1, "high": 2, "when": {"missing": 1}}}, "params.k.when refers to 'missing'"),
    ({}, "params is empty"),
    ({"k": {"type": "categorical", "choices": [8, 512, 128], "ordered": True}},
     "params.k.choices: [8, 512, 128] are not in strictly ascending order"),
    ({"k": {"type": "categorical", "choices": [64, 64, 128], "ordered": True}}, "list each number once"),
    ({"k": {"type": "categorical", "choices": ["64", "128"], "ordered": True}},
     "params.k.choices: ['64', '128'] are not all numbers, which this param's ordered: true needs (write 64, not '64')"),
    ({"k": {"type": "int", "low": 1, "high": 4, "ordered": False}}, "params.k.ordered: false: an int param is always ordered"),
    ({"k": {"type": "categorical", "choices": [1, 2], "ordered": "yes"}}, "params.k.ordered='yes': use true or false"),
    ({"k": {"type": "categorical", "choices": 8}}, "params.k.choices=8: list the levels, e.g. choices: [8]"),
]


def test_which_params_are_ordered():
    space = parse_space({"bs": {"choices": [8, 128, 512], "ordered": True}, "topk": {"choices": [1, 2, 4]},
                         "steps": {"type": "int", "low": 1, "high": 5}, "frac": {"type": "float", "low": 0.1, "high": 0.9}})
    assert [p.name for p in space.params if p.is_ordered] == ["bs", "steps", "frac"]


@pytest.mark.parametrize("params,msg", BAD)
def test_bad_space_names_field(params, msg):
    with pytest.raises(SpaceError) as e:
        parse_space(params)
    assert msg in str(e.value)


def _space():
    return parse_space(
        {
            "speculative": {"choices": ["none", "eagle3"]},
            "steps": {"type": "int", "low": 1, "high": 5, "when": {"speculative": "eagle3"}},
            "topk": {"choices": [1, 2], "when": {"speculative": ["eagle3"]}},
            "draft": {"type": "int", "low": 2, "high": 8, "when": {"speculative": "eagle3"}},
        },
        [{"name": "fit", "expr": "draft <= topk * steps + 1", "when": {"speculative": "eagle3"}}],
    )


def test_conditional_params_only_when_active():
    space = _space()
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    seen = set()
    for _ in range(40):
        t = study.ask()
        cfg = space.sample(t)
        seen.add(cfg["speculative"])
        if cfg["speculative"] == "none":
            assert set(cfg) == {"speculative"}
        else:
            assert set(cfg) == {"speculative", "steps", "topk", "draft"}
        study.tell(t, 0.0)
    assert seen == {"none", "eagle3"}


@pytest.mark.parametrize(
    "cfg,violated",
    [
        ({"speculative": "eagle3", "steps": 3, "topk": 1, "draft": 4}, []),
        ({"speculative": "eagle3", "steps": 3, "topk": 1, "draft": 5}, ["fit"]),
        ({"speculative": "eagle3", "steps": 2, "topk": 2, "draft": 5}, []),
        ({"speculative": "none"}, []),
    ],
)
def test_constraint(cfg, violated):
    assert _space().violated(cfg) == violated


def test_enumerate_respects_conditions_and_constraints():
    configs = list(_space().enumerate())
    assert {"speculative": "none"} in configs
    eagle = [c for c in configs if c["speculative"] == "eagle3"]
    assert all(c["draft"] <= c["topk"] * c["steps"] + 1 for c in eagle)
    # steps 1..5 x topk {1,2} x draft 2..8, filtered by the constraint
    expected = sum(1 for s in range(1, 6) for k in (1, 2) for d in range(2, 9) if d <= k * s + 1)
    assert len(eagle) == expected


@pytest.mark.parametrize("expr,msg", [
    ("__import__('os')", "not allowed"),
    ("draft <=", "is not an expression"),
    ("nothere < 3", "'nothere', which is not a param"),
])
def test_constraint_expressions_are_checked(expr, msg):
    with pytest.raises(SpaceError) as e:
        parse_space({"draft": {"type": "int", "low": 1, "high": 3}}, [{"expr": expr}])
    assert msg in str(e.value)


def test_normalize_drops_inactive_and_checks_range():
    space = _space()
    assert space.normalize({"speculative": "none", "steps": 3}) == {"speculative": "none"}
    with pytest.raises(SpaceError, match="params.steps=9"):
        space.normalize({"speculative": "eagle3", "steps": 9, "topk": 1, "draft": 2})
    with pytest.raises(SpaceError, match="params.topk: missing"):
        space.normalize({"speculative": "eagle3", "steps": 1, "draft": 2})


def test_seed_configs_baseline_first_one_per_level_deduplicated():
    from sweeps.config.space import seed_configs

    space = _space()
    seeds = seed_configs(space, {"speculative": "none"}, [{"speculative": "none"}], ["speculative"])
    assert seeds[0] == {"speculative": "none"}
    # the eagle3 level switches its conditional params on at their first levels; duplicates dropped
    assert seeds == [{"speculative": "none"}, {"speculative": "eagle3", "steps": 1, "topk": 1, "draft": 2}]
    with pytest.raises(SpaceError, match="not a param"):
        seed_configs(space, {"speculative": "none"}, [], ["nope"])


def test_log_int_levels_are_every_integer_the_sampler_can_draw():
    space = parse_space({"k": {"type": "int", "low": 3, "high": 40, "log": True}})
    (p,) = space.params
    assert p.levels() == list(range(3, 41))
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    drawn = {space.sample(study.ask())["k"] for _ in range(300)}
    assert drawn <= set(p.levels()) and len(drawn) > 6  # not only 3, 6, 12, 24


def test_ordered_leaves_a_studys_space_signature_alone():
    """``ordered`` changes how the search reads results, not the configs: a study started before
    a sweep declared it resumes (its signature is the one computed without the field)."""
    from sweeps.config.spec import load_spec
    from sweeps.store.study import space_signature
    from tests.conftest import compose_cfg

    declared = load_spec(compose_cfg(["sweep=eagle3_allreduce"]))
    plain = load_spec(compose_cfg(["sweep=eagle3_allreduce", "~sweep.params.cuda_graph_max_bs.ordered",
                                   "~sweep.params.eagle_topk.ordered"]))
    assert declared.space != plain.space  # the field is read
    assert space_signature(declared) == space_signature(plain)
    other = load_spec(compose_cfg(["sweep=eagle3_allreduce", "sweep.params.cuda_graph_max_bs.choices=[8,128,512]"]))
    assert space_signature(other) != space_signature(declared)
