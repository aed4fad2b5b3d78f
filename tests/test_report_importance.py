"""Parameter importances: computed on launched trials only, with a method that sees a
categorical's effect, and labelled with that method."""

from __future__ import annotations

import random

import optuna
import pytest

from sweeps.config.objective import Objective
from sweeps.publish.importance import METHOD, anova_importances, importances, importances_figure, launched_rows
from sweeps.publish.plots import write_plots
from sweeps.store import records as trial_records


def _records(seed: int = 0) -> list[trial_records.TrialRecord]:
    """speculative: -35 tok/s for eagle3 (the largest effect); cuda_graph_max_bs: +-2; nccl_proto: +-1;
    eagle_topk only with eagle3 (small); plus skips and duplicates that must not count."""
    rng = random.Random(seed)
    out: list[trial_records.TrialRecord] = []
    n = 0
    for spec in ("none", "eagle3"):
        for bs in (32, 128, 512):
            for proto in ("default", "LL"):
                p = {"speculative": spec, "cuda_graph_max_bs": bs, "nccl_proto": proto}
                if spec == "eagle3":
                    p["eagle_topk"] = rng.choice([1, 2])
                v = 90.0 - (35.0 if spec == "eagle3" else 0.0) + {32: 2.0, 128: 0.0, 512: -2.0}[bs] \
                    + (1.0 if proto == "LL" else -1.0) + rng.gauss(0, 0.5)
                out.append(trial_records.TrialRecord(number=n, state="COMPLETE", params=p, status="ok",
                                                     metrics={"decode_tok_s": v}))
                n += 1
    best = dict(out[0].params)
    for _ in range(40):  # TPE re-proposing the plain config: duplicates carry its value
        out.append(trial_records.TrialRecord(number=n, state="COMPLETE", params=best, status="ok",
                                 metrics=dict(out[0].metrics), duplicate_of=0))
        n += 1
    for _ in range(30):  # known dead ends: no value, never launched
        out.append(trial_records.TrialRecord(number=n, state="PRUNED", params={**best, "nccl_proto": "Simple"}, status="skipped",
                                 failure_class="nccl_env_algo_proto_invalid"))
        n += 1
    return out


def test_speculative_the_largest_effect_gets_the_largest_importance():
    recs = _records()
    imp = importances(recs, Objective())
    assert list(imp)[0] == "speculative" and imp["speculative"] > 2 * max(v for k, v in imp.items() if k != "speculative")
    assert imp["cuda_graph_max_bs"] > imp["eagle_topk"] >= 0.0
    assert set(imp) == {"speculative", "cuda_graph_max_bs", "nccl_proto", "eagle_topk"}
    assert len(launched_rows(recs, Objective())) == 12  # duplicates and skips do not count


def test_effect_share_matches_the_textbook_value():
    # one knob, groups [1, 2, 3] and [5, 6, 7]: SS_between = 24 of SS_total = 28 (η² of a one-way ANOVA)
    rows = [({"k": "a"}, 1.0), ({"k": "a"}, 2.0), ({"k": "a"}, 3.0), ({"k": "b"}, 5.0), ({"k": "b"}, 6.0), ({"k": "b"}, 7.0)]
    assert anova_importances(rows)["k"] == pytest.approx(24 / 28)
    # a second, balanced knob with no effect explains nothing beyond k
    rows2 = [({**p, "j": "x" if i % 2 else "y"}, v) for i, (p, v) in enumerate(rows + rows)]
    assert anova_importances(rows2)["j"] == pytest.approx(0.0, abs=0.02) and anova_importances(rows2)["k"] > 0.7
    assert anova_importances(rows[:2]) == {}  # too few trials


def test_figure_is_labelled_with_the_method_and_written(tmp_path):
    recs = _records()
    fig = importances_figure(recs)
    ax = fig.axes[0]
    assert METHOD in ax.get_xlabel() and "n=12" in ax.get_xlabel()
    assert [t.get_text() for t in ax.get_yticklabels()][-1] == "speculative"  # the top bar
    study = optuna.create_study(direction="maximize")
    names = {p.name for p in write_plots(study, tmp_path, ["nccl"], records=recs)}
    assert {"param_importances.png", "param_importances.html"} <= names
    assert "ANOVA main effects" in (tmp_path / "param_importances.html").read_text()  # the same label (JSON-escaped)
