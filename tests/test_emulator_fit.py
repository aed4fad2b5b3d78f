"""calibration fit: recovers identifiable constants from designed synthetic noisy trials."""

from __future__ import annotations

import math
import random

from tasks.emulator import calibration
from tasks.emulator.calibration import PARAMS, fit, predict_measurement
from tasks.emulator.profile import set_path

TRUE = {"eta": 0.70, "alpha_nccl_us": 28.0, "t_ovh_ms": 2.8, "delta_cg": 0.65, "alpha_verify_us": 120.0,
        "alpha_custom_ar_us": 170.0, "t_draft_ms": 0.40, "accept_rate": 0.55}


def _design() -> list[dict]:
    """Batch sizes (expert fan-out -> eta), NCCL protocols (alpha scaling -> alpha_nccl), graph sizes
    (delta_cg), EAGLE depths (verify/draft/acceptance) and forced custom AR."""
    cfgs = []
    for bs in (1, 4, 16, 64):
        for proto in ("default", "Simple"):
            cfgs.append({"batch": bs, "nccl_proto": proto, "cuda_graph_max_bs": 128})
    for mbs in (256, 512, 1024):  # the graph-size effect is small (~0.5 ms/12 ms): replicate it
        cfgs += [{"cuda_graph_max_bs": mbs, "rep": r} for r in range(4)]
    for steps in (1, 2, 3, 5):
        cfgs.append({"speculative": "eagle3", "eagle_num_steps": steps, "eagle_topk": 1,
                     "eagle_num_draft_tokens": steps + 1})
    cfgs.append({"allreduce": "custom", "force_custom_allreduce_pcie": True})
    return cfgs


def _synthetic(noise: float, seed: int) -> list[dict]:
    prof = calibration.shipped_profile()
    for k, v in TRUE.items():
        set_path(prof, PARAMS[k], v)
    rng = random.Random(seed)
    out = []
    for i, cfg in enumerate(_design()):
        for rep in range(3):
            m = {"id": f"s{i}.{rep}", "config": cfg, "outcome": "ok"}
            pred = predict_measurement(prof, m)
            assert pred.outcome == "ok", cfg
            m["tok_s"] = pred.decode_tok_s * math.exp(noise * rng.gauss(0, 1))
            if cfg.get("speculative") == "eagle3":
                m["accept_length"] = pred.accept_length * math.exp(noise * rng.gauss(0, 1))
                m["verify_ms_per_cycle"] = pred.t_verify_ms * math.exp(noise * rng.gauss(0, 1))
                m["verify_share_of_cycle"] = pred.verify_share * math.exp(noise / 10 * rng.gauss(0, 1))
            out.append(m)
    return out


def test_fit_recovers_identifiable_constants():
    data = _synthetic(noise=0.01, seed=1)
    res = fit(data, free=tuple(TRUE))
    assert not res.non_identifiable, res.non_identifiable
    for k, v in TRUE.items():
        assert abs(res.values[k] / v - 1) < 0.05, (k, res.values[k], v)


def test_fit_reports_non_identifiable_on_bs1_only():
    # Only batch-1 baselines: eta and t_ovh trade off one-for-one.
    data = [m for m in _synthetic(noise=0.0, seed=1) if m["config"].get("batch", 1) == 1
            and not m["config"].get("speculative") and m["config"].get("allreduce") != "custom"
            and m["config"].get("nccl_proto", "default") == "default"]
    res = fit(data, free=("eta", "t_ovh_ms", "delta_cg"))
    assert {"eta", "t_ovh_ms"} <= set(res.non_identifiable)
    assert "eta" not in res.values and "delta_cg" in res.values
    assert abs(res.values["delta_cg"] / TRUE["delta_cg"] - 1) < 0.05


def test_fit_cli_writes_profiles(tmp_path, capsys):
    rc = calibration.main(["fit", str(calibration.SEED_CAMPAIGN), "--out-node", str(tmp_path / "n.yaml"),
                           "--out-model", str(tmp_path / "m.yaml")])
    assert rc == 0
    out = capsys.readouterr().out
    assert "t_ovh_ms" in out and (tmp_path / "n.yaml").exists() and (tmp_path / "m.yaml").exists()
    assert "emulator" in (tmp_path / "m.yaml").read_text()
