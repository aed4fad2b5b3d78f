"""Calibration of the emulated node against measurements.

    python -m tasks.emulator.calibration check [measurements.yaml]
    python -m tasks.emulator.calibration fit <measurements.yaml | mlflow experiment> \
        [--free t_ovh_ms,delta_cg,...] [--out-node node.yaml] [--out-model model.yaml]

``check`` freezes the shipped profile (conf/node/rtx_pro_6000x8.yaml +
conf/model/kimi_k25_eagle3.yaml) and prints measured vs modelled per measurement. It exits
1 if any tok/s is off by more than 3 %, a failing approach does not fail with the expected
class (``model.EXPECTED_CLASS``; also run through ``tasks.failures.classify`` when it is
importable), or the EAGLE verify share is more than 5 points from the measurement.

Measurement configs use the canonical knob names (speculative, allreduce, nccl_algo,
nccl_proto, cuda_graph_max_bs, moe_a2a_backend, mem_fraction_static, eagle_*), plus
``expert_parallel`` and ``batch``. Knobs a measurement leaves out take the campaign's
baseline ``BASE_CONFIG`` (NCCL Ring, graph max bs 128: the best configuration known when
the later experiments were run). A ``note`` containing "forced" on an ``allreduce: custom``
config sets the node capability ``force_custom_allreduce_pcie`` (the campaign patched it in).

``fit`` runs scipy least squares on log residuals (tok/s, verify ms, verify share,
acceptance length) over the chosen free constants (in log space, so they stay positive) and
reports constants whose Jacobian columns are (near) linearly dependent as non-identifiable
instead of giving a number for them.
"""

from __future__ import annotations

import argparse
import copy
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from tasks.emulator.model import EXPECTED_CLASS, evaluate_argv
from tasks.emulator.profile import DEFAULT_MODEL_YAML, DEFAULT_NODE_YAML, build_profile, get_path, load_yaml, set_path

SEED_CAMPAIGN = Path(__file__).with_name("seed_campaign.yaml")
TOL_TOK_S = 0.03
TOL_VERIFY_SHARE = 0.05
BASE_CONFIG: dict[str, Any] = {"speculative": "none", "allreduce": "nccl", "nccl_algo": "Ring",
                               "cuda_graph_max_bs": 128}

# Fit parameter name -> dotted profile path.
PARAMS: dict[str, str] = {
    "eta": "node.emulator.eta",
    "alpha_nccl_us": "node.emulator.nccl.alpha_us",
    "t_ovh_ms": "model.emulator.t_ovh_ms",
    "delta_cg": "node.emulator.delta_cg_ms_per_doubling",
    "alpha_verify_us": "node.emulator.alpha_verify_us",
    "alpha_custom_ar_us": "node.emulator.alpha_custom_ar_us",
    "t_draft_ms": "model.emulator.t_draft_ms",
    "accept_rate": "model.emulator.accept_rate",
}
# The [F] (fitted) constants; eta [A] and alpha_nccl [S] stay fixed by default (on batch-1 data
# eta, alpha_nccl and t_ovh trade off, see docs/emulator.md "Calibration").
DEFAULT_FREE = ("t_ovh_ms", "delta_cg", "alpha_verify_us", "alpha_custom_ar_us", "t_draft_ms", "accept_rate")


def shipped_profile(**emulator: Any) -> dict:
    """The frozen shipped profile with noise 0 (``emulator`` overrides the runtime block)."""
    return build_profile(load_yaml(DEFAULT_NODE_YAML), load_yaml(DEFAULT_MODEL_YAML), {"noise": 0.0, **emulator})


def render_config(config: dict, model: dict) -> tuple[list[str], dict[str, str], dict[str, Any]]:
    """Canonical knob dict -> (SGLang 0.5.23 argv, env, capability overrides).

    Mirrors the knob rendering in common.md (full flag names); independent of tasks.backends.sglang.knobs so
    calibration has no dependency on the driver side.
    """
    c = {**BASE_CONFIG, **{k: v for k, v in config.items() if v is not None}}
    argv = ["--model-path", str(model.get("path", "model")), "--tp-size", str(c.get("tp", 8)), "--trust-remote-code"]
    env: dict[str, str] = {}
    caps: dict[str, Any] = {}
    ar = c.get("allreduce", "nccl")
    argv += {"nccl": ["--disable-custom-all-reduce", "--enforce-disable-flashinfer-allreduce-fusion"],
             "custom": ["--enforce-disable-flashinfer-allreduce-fusion"],
             "flashinfer_fusion": ["--disable-custom-all-reduce", "--enable-flashinfer-allreduce-fusion"],
             "torch_symm_mem": ["--disable-custom-all-reduce", "--enforce-disable-flashinfer-allreduce-fusion",
                                "--enable-torch-symm-mem"]}[ar]
    if ar == "custom" and ("forced" in str(c.get("note", "")) or c.get("force_custom_allreduce_pcie")):
        caps["force_custom_allreduce_pcie"] = True
    if c.get("speculative") == "eagle3":
        sd = model.get("emulator", {}).get("spec_defaults", {})
        argv += ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", str(model.get("draft_path")),
                 "--speculative-num-steps", str(c.get("eagle_num_steps", sd.get("num_steps", 3))),
                 "--speculative-eagle-topk", str(c.get("eagle_topk", sd.get("eagle_topk", 1))),
                 "--speculative-num-draft-tokens", str(c.get("eagle_num_draft_tokens", sd.get("num_draft_tokens", 4)))]
    if c.get("cuda_graph_max_bs") is not None:
        argv += ["--cuda-graph-max-bs-decode", str(c["cuda_graph_max_bs"])]
    if c.get("moe_a2a_backend") == "flashinfer":
        argv += ["--moe-a2a-backend", "flashinfer", "--ep-size", str(c.get("expert_parallel", 8))]
    elif c.get("expert_parallel"):
        argv += ["--ep-size", str(c["expert_parallel"])]
    if c.get("mem_fraction_static") is not None:
        argv += ["--mem-fraction-static", str(c["mem_fraction_static"])]
    for knob, var in (("nccl_algo", "NCCL_ALGO"), ("nccl_proto", "NCCL_PROTO")):
        if c.get(knob) not in (None, "default"):
            env[var] = str(c[knob])
    return argv, env, caps


def _with_caps(profile: dict, caps: dict) -> dict:
    if not caps:
        return profile
    p = copy.deepcopy(profile)
    p["emulator"]["capabilities"].update(caps)
    return p


def predict_measurement(profile: dict, m: dict):
    """Prediction for one measurement dict (``config``, optional ``batch``/``input_len``)."""
    cfg = m.get("config", {})
    argv, env, caps = render_config(cfg, profile["model"])
    return evaluate_argv(_with_caps(profile, caps), argv, env, batch=int(cfg.get("batch", 1)),
                         input_len=int(cfg.get("input_len", 128)))


@dataclass
class CheckRow:
    """One line of the calibration table."""

    id: str
    measured: str
    modelled: str
    error: str
    ok: bool
    note: str = ""


def _classifier():
    try:
        from tasks.failures import classify  # type: ignore
        return classify
    except Exception:  # pragma: no cover - depends on the other helper's module
        return None


def check(measurements: list[dict], profile: dict | None = None) -> list[CheckRow]:
    """Compare each measurement with the frozen model; returns table rows (``ok`` per row)."""
    profile = profile or shipped_profile()
    classify = _classifier()
    rows: list[CheckRow] = []
    for m in measurements:
        pred = predict_measurement(profile, m)
        mid = str(m.get("id"))
        if m.get("outcome") == "ok":
            if pred.outcome != "ok":
                rows.append(CheckRow(mid, f"{m.get('tok_s')} tok/s", f"failed ({pred.failure.failure_class})",
                                     "-", False))
                continue
            meas = float(m["tok_s"])
            err = pred.decode_tok_s / meas - 1.0
            rows.append(CheckRow(mid, f"{meas:.1f} tok/s", f"{pred.decode_tok_s:.2f} tok/s", f"{100 * err:+.2f} %",
                                 abs(err) <= TOL_TOK_S, f"path {pred.allreduce_path}"))
            if "verify_share_of_cycle" in m:
                vs = float(m["verify_share_of_cycle"])
                rows.append(CheckRow(mid + ".verify_share", f"{100 * vs:.1f} %", f"{100 * pred.verify_share:.1f} %",
                                     f"{100 * (pred.verify_share - vs):+.1f} pt",
                                     abs(pred.verify_share - vs) <= TOL_VERIFY_SHARE))
            if "verify_ms_per_cycle" in m:
                vm = float(m["verify_ms_per_cycle"])
                rows.append(CheckRow(mid + ".verify_ms", f"{vm:.1f} ms", f"{pred.t_verify_ms:.2f} ms",
                                     f"{100 * (pred.t_verify_ms / vm - 1):+.1f} %", True,
                                     f"tau {pred.accept_length:.3f}, cycle {pred.t_cycle_ms:.2f} ms (informational)"))
        else:
            expected = EXPECTED_CLASS.get(mid)
            got = pred.failure.failure_class if pred.failure else "ok"
            ok = pred.outcome == "failed" and (expected is None or got == expected)
            note = ""
            if pred.failure and classify is not None:
                c = classify("\n".join(pred.log_lines), pred.failure.exit_code, "startup")
                note = f"classifier: {c.failure_class}"
                ok = ok and (expected is None or c.failure_class == expected)
            elif classify is None:
                note = "tasks.failures not importable: emulator class only"
            rows.append(CheckRow(mid, f"failed ({expected or m.get('failure')})", f"{pred.outcome} ({got})",
                                 "-", ok, note))
    return rows


def format_rows(rows: list[CheckRow]) -> str:
    """Plain-text table."""
    hdr = ("measurement", "measured", "modelled", "error", "ok", "note")
    data = [hdr] + [(r.id, r.measured, r.modelled, r.error, "PASS" if r.ok else "FAIL", r.note) for r in rows]
    w = [max(len(str(row[i])) for row in data) for i in range(len(hdr))]
    return "\n".join("  ".join(str(c).ljust(w[i]) for i, c in enumerate(row)).rstrip() for row in data)


# ------------------------------------------------------------------------------ fit
def _observations(profile: dict, measurements: list[dict]) -> list[tuple[dict, str, float]]:
    obs = []
    for m in measurements:
        if m.get("outcome", "ok") != "ok" or m.get("tok_s") is None:
            continue
        obs.append((m, "tok_s", float(m["tok_s"])))
        for key in ("verify_ms_per_cycle", "verify_share_of_cycle", "accept_length"):
            if m.get(key) is not None:
                obs.append((m, key, float(m[key])))
    return obs


def _model_value(pred, key: str) -> float:
    return {"tok_s": pred.decode_tok_s, "verify_ms_per_cycle": pred.t_verify_ms,
            "verify_share_of_cycle": pred.verify_share, "accept_length": pred.accept_length}[key]


@dataclass
class FitResult:
    """Fit outcome: ``values`` for identifiable constants, ``non_identifiable`` names with the
    reason, ``profile`` the fitted profile, ``rms_log_residual``."""

    values: dict[str, float]
    non_identifiable: dict[str, str]
    profile: dict
    rms_log_residual: float
    n_obs: int


def fit(measurements: list[dict], profile: dict | None = None, free: tuple[str, ...] = DEFAULT_FREE) -> FitResult:
    """Least-squares fit of the ``free`` constants (names in ``PARAMS``) to ok measurements.

    Raises:
        ValueError: unknown parameter name, or no usable (ok, tok_s) measurement.
    """
    from scipy.optimize import least_squares

    profile = copy.deepcopy(profile or shipped_profile())
    for f in free:
        if f not in PARAMS:
            raise ValueError(f"fit --free: unknown constant {f!r}; choose from {sorted(PARAMS)}")
    obs = _observations(profile, measurements)
    if not obs:
        raise ValueError("fit: no measurement with outcome ok and tok_s")
    x0 = np.array([math.log(float(np.atleast_1d(get_path(profile, PARAMS[f]))[0])) for f in free])

    def with_x(x: np.ndarray) -> dict:
        p = copy.deepcopy(profile)
        for f, v in zip(free, x):
            val = math.exp(float(v))
            if f == "accept_rate":
                val = min(val, 0.999)
            set_path(p, PARAMS[f], val)
        return p

    def resid(x: np.ndarray) -> np.ndarray:
        p = with_x(x)
        out = []
        for m, key, meas in obs:
            pred = predict_measurement(p, m)
            val = _model_value(pred, key) if pred.outcome == "ok" else 1e-6
            out.append(math.log(max(val, 1e-9) / meas))
        return np.array(out)

    sol = least_squares(resid, x0, method="trf", x_scale="jac", diff_step=1e-4)
    jac = sol.jac
    # Identifiability: columns in the (near) null space of J, or columns with no effect.
    non_id: dict[str, str] = {}
    col_norm = np.linalg.norm(jac, axis=0)
    _, s, vt = np.linalg.svd(jac / np.where(col_norm > 0, col_norm, 1.0), full_matrices=True)
    s_full = np.zeros(vt.shape[0])
    s_full[:len(s)] = s
    null = vt[s_full < 1e-3 * max(s_full.max(), 1e-30)]
    for i, f in enumerate(free):
        if col_norm[i] < 1e-9:
            non_id[f] = "no measurement depends on it"
        elif null.size and np.max(np.abs(null[:, i])) > 0.1:
            partners = sorted({free[j] for row in null for j in range(len(free))
                               if j != i and abs(row[j]) > 0.1 and abs(row[i]) > 0.1})
            non_id[f] = "not identifiable: trades off with " + (", ".join(partners) or "the data's null space")
    fitted = with_x(sol.x)
    values = {f: float(np.atleast_1d(get_path(fitted, PARAMS[f]))[0]) for f in free if f not in non_id}
    return FitResult(values, non_id, fitted, float(np.sqrt(np.mean(sol.fun ** 2))), len(obs))


def measurements_from_mlflow(experiment: str) -> list[dict]:
    """Ok child runs of an MLflow experiment -> measurement dicts (params = knobs, metrics)."""
    import mlflow  # local import: heavy

    df = mlflow.search_runs(experiment_names=[experiment])
    out = []
    for _, row in df.iterrows():
        if str(row.get("tags.status", "ok")) != "ok" or "metrics.decode_tok_s" not in row:
            continue
        tok = row.get("metrics.decode_tok_s")
        if tok is None or (isinstance(tok, float) and math.isnan(tok)):
            continue
        cfg = {}
        for k, v in row.items():
            if isinstance(k, str) and k.startswith("params.") and v is not None:
                key = k[len("params."):]
                try:
                    cfg[key] = int(v)
                except (TypeError, ValueError):
                    cfg[key] = v
        m = {"id": row.get("run_id"), "config": cfg, "outcome": "ok", "tok_s": float(tok)}
        al = row.get("metrics.accept_length")
        if al is not None and not (isinstance(al, float) and math.isnan(al)) and cfg.get("speculative") == "eagle3":
            m["accept_length"] = float(al)
        out.append(m)
    return out


def load_measurements(source: str) -> list[dict]:
    """A measurements YAML (seed_campaign format) or, if no such file, an MLflow experiment name."""
    if Path(source).exists():
        data = yaml.safe_load(Path(source).read_text())
        return list(data.get("measurements", data) if isinstance(data, dict) else data)
    return measurements_from_mlflow(source)


def main(argv: list[str] | None = None) -> int:
    """CLI; returns the exit code (check: 1 on any failed row)."""
    ap = argparse.ArgumentParser(prog="python -m tasks.emulator.calibration")
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check", help="frozen shipped profile vs measurements")
    c.add_argument("measurements", nargs="?", default=str(SEED_CAMPAIGN))
    f = sub.add_parser("fit", help="least-squares fit of the [F] constants")
    f.add_argument("source", help="measurements YAML or MLflow experiment name")
    f.add_argument("--free", default=",".join(DEFAULT_FREE), help=f"comma list from {sorted(PARAMS)}")
    f.add_argument("--out-node", default="fitted_node.yaml")
    f.add_argument("--out-model", default="fitted_model.yaml")
    a = ap.parse_args(argv)
    if a.cmd == "check":
        rows = check(load_measurements(a.measurements))
        print(format_rows(rows))
        bad = [r.id for r in rows if not r.ok]
        print("\nRESULT:", "PASS" if not bad else f"FAIL ({', '.join(bad)})")
        return 1 if bad else 0
    res = fit(load_measurements(a.source), free=tuple(x for x in a.free.split(",") if x))
    print(f"fit over {res.n_obs} observations, rms log residual {res.rms_log_residual:.4f}")
    for k, v in res.values.items():
        print(f"  {k:20s} = {v:.5g}   ({PARAMS[k]})")
    for k, why in res.non_identifiable.items():
        print(f"  {k:20s}   {why}")
    header = f"# Fitted by `python -m tasks.emulator.calibration fit {a.source}`; [F] values replaced.\n"
    Path(a.out_node).write_text(header + yaml.safe_dump(res.profile["node"], sort_keys=False))
    Path(a.out_model).write_text(header + yaml.safe_dump(res.profile["model"], sort_keys=False))
    print(f"wrote {a.out_node} and {a.out_model}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
