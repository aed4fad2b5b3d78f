"""Is the campaign's decision stable? The same campaign over several seeds, and a rerun of each.

    .venv/bin/python benchmarks/decision_stability.py              # 5 seeds, writes benchmarks/results/
    .venv/bin/python benchmarks/decision_stability.py --seeds 2    # quicker look

Each seed runs the campaign sweep (``conf/sweep/eagle3_allreduce.yaml``, the ``make sweep``
default) on the ``instant`` emulator in process (:func:`sweeps.app.inprocess.run_in_process`,
Ray replaced by an inline executor; the emulated node's noise model, no sleeping), with the
sampler seed and the emulator's noise seed both set to the seed, to the end: the sweep, the
confirmation race, the serving check. It reads the stored decision (the study's
``confirmation`` attribute, :mod:`sweeps.search.confirm`): the winner and the tie group, as
configs (trial numbers differ between seeds), the confirmed value, the configs the race added
(``sweep.confirm.descend``: one step simpler than its pick, some measured by no trial) and the
launches (trials + confirmation repeats). Then it runs the same
command on the finished study again and counts every launch it submits (trials, probes,
confirmation repeats, serving checks; the README: a finished sweep prints its summary and
launches nothing).

What "stable" means here (issue 22): every seed reports the same tie group, or at least a
winner that every other seed's tie group holds. Both are reported, with each seed's winner,
tie group and interval. Output: ``benchmarks/results/decision_stability.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

RESULTS = REPO / "benchmarks" / "results"
#: the campaign's wall budget under the instant backend: modelled seconds, so that the 30
#: launches of ``eagle3_allreduce`` fit (its own 480 s is the emulated node's real clock)
WALL_TIME_S = 3000


def _spec(seed: int, store: Path, extra: list[str]):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from sweeps.config.spec import load_spec

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=[
            "backend=instant", f"sweep.sampler.seed={seed}", f"backend.emulator.seed={seed}",
            f"sweep.budget.wall_time_s={WALL_TIME_S}", f"tracking.store_dir={store}",
            f"tracking.findings_dir={store}/findings", f"tracking.optuna_storage=sqlite:///{store}/optuna.db",
            f"tracking.rules_db=sqlite:///{store}/rules.db", *extra])
    GlobalHydra.instance().clear()
    return load_spec(cfg)


def _label(params: dict[str, Any], baseline: dict[str, Any]) -> str:
    """A config as its settings that differ from the baseline (``baseline`` for none)."""
    diff = [f"{k}={v}" for k, v in sorted(params.items()) if baseline.get(k) != v]
    return ", ".join(diff) or "baseline"


def _true_rate(spec: Any, params: dict[str, Any]) -> float | None:
    """The config's noise-free decode tok/s in the emulator's model (None when it fails to start),
    as ``benchmarks/sweep_efficiency.py`` evaluates a config."""
    from sweeps.config.spec import backend_dict
    from sweeps.run.preflight import emulator_profile
    from tasks.backends.sglang.knobs import render_launch
    from tasks.emulator.instant import simulate

    argv, env, _ = render_launch(params, spec.node.model_dump(), spec.model.model_dump(), backend_dict(spec))
    out = simulate(emulator_profile(spec), argv, env, spec.bench_spec(), seed=0)
    return round(float(out["prediction"].get("decode_tok_s") or 0.0), 2) if out["status"] == "ok" else None


def _rerun_launches(spec: Any) -> int:
    """Run the sweep again on its finished study; returns how many launches it submitted
    (trials, probes, confirmation repeats and serving checks all go through ``submit``)."""
    from sweeps.app.inprocess import InProcessDriver
    from sweeps.run.executor import Executor

    class Counting(InProcessDriver):
        submitted = 0

        def make_executor(self) -> Executor:
            ex = super().make_executor()
            submit = ex.submit

            def counted(*a: Any, **kw: Any) -> Any:
                self.submitted += 1
                return submit(*a, **kw)
            ex.submit = counted  # type: ignore[method-assign]
            return ex

    drv = Counting(spec)
    drv.setup()
    drv.loop()
    drv.finish()
    return drv.submitted


def one_seed(seed: int, extra: list[str]) -> dict[str, Any]:
    """Run the campaign for ``seed``, then rerun it; returns its decision and the rerun's launches."""
    from sweeps.app.inprocess import run_in_process
    from sweeps.search.confirm import DERIVED_BASE, config_record
    from sweeps.store import records

    with tempfile.TemporaryDirectory(prefix="servesweep-decision-") as tmp:
        spec = _spec(seed, Path(tmp), extra)
        t0 = time.monotonic()
        drv = run_in_process(spec)
        wall = time.monotonic() - t0
        study = drv.study
        conf = dict(study.user_attrs.get("confirmation") or {})
        recs = {r.number: r for r in records.load_records(study)}
        for e in conf.get("entries", []):  # configs only the race measured (its descent)
            if (r := config_record(list(recs.values()), conf, e.get("trial"))) is not None:
                recs.setdefault(r.number, r)
        base = dict(spec.sweep.baseline)
        added = _rerun_launches(_spec(seed, Path(tmp), extra))
    winner = conf.get("winner")
    entry = next((e for e in conf.get("entries", []) if e.get("trial") == winner), {})
    ties = [t for t in conf.get("tie_group") or [] if t in recs] or ([winner] if winner in recs else [])
    return {
        "seed": seed, "wall_s": round(wall, 1), "winner": winner, "margin": spec.sweep.confirm.margin,
        "winner_config": _label(recs[winner].params, base) if winner in recs else None,
        "winner_key": records.config_key(recs[winner].params) if winner in recs else None,
        "mean": entry.get("mean"), "ci": entry.get("interval"), "n": entry.get("n"),
        "winner_true": _true_rate(spec, recs[winner].params) if winner in recs else None,
        "race_added": len(conf.get("derived") or []),
        "launches": {"trials": sum(1 for r in recs.values() if r.launched and r.number < DERIVED_BASE),
                     "confirmation": len(conf.get("launches") or [])},
        "best_true_launched": max((v for r in recs.values() if r.launched and r.status == "ok"
                                   and (v := _true_rate(spec, r.params)) is not None), default=None),
        "tie_group": [_label(recs[t].params, base) for t in ties],
        "tie_keys": sorted(records.config_key(recs[t].params) for t in ties),
        "status": (conf.get("decision") or {}).get("status"), "reason": conf.get("decision_reason"),
        "rerun_added_launches": added,
    }


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Stability over the seeds: one tie group for all, and each winner inside every other tie group."""
    groups = {tuple(r["tie_keys"]) for r in rows}
    inside = [all(r["winner_key"] in o["tie_keys"] for o in rows) for r in rows]
    return {"seeds": len(rows), "distinct_tie_groups": len(groups), "same_tie_group": len(groups) == 1,
            "winners_in_every_tie_group": sum(inside), "distinct_winners": len({r["winner_key"] for r in rows}),
            "rerun_launches": sum(r["rerun_added_launches"] for r in rows),
            "margin": rows[0]["margin"] if rows else None,
            "winners_within_margin": sum(1 for r in rows if r["winner_true"] and r["best_true_launched"]
                                         and r["winner_true"] >= (1 - r["margin"]) * r["best_true_launched"])}


def write(rows: list[dict[str, Any]], summary: dict[str, Any], out: Path, took: float) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "decision_stability.json").write_text(json.dumps({"rows": rows, "summary": summary}, indent=1) + "\n")
    L = ["# Decision stability: the campaign over several seeds", "",
         f"`eagle3_allreduce` on the instant emulator, {summary['seeds']} seeds (sampler and noise), "
         f"wall budget {WALL_TIME_S} modelled s; each study then rerun as it stands.", "",
         "Noise-free: the emulator's model rate of the winner, and the best of every config the seed "
         "launched (what the decision could have found).", "",
         "| seed | winner | confirmed (95 % CI, n) | noise-free winner / best launched | tie group | decision "
         "| race-added configs | launches (trials + confirmation) | rerun launches |",
         "|---|---|---|---|---|---|---:|---:|---:|"]
    for r in rows:
        ci = r["ci"] or [None, None]
        val = f"{r['mean']:.1f} [{ci[0]:.1f}-{ci[1]:.1f}], n={r['n']}" if r["mean"] is not None and None not in ci \
            else str(r["mean"])
        L.append(f"| {r['seed']} | t{r['winner']}: {r['winner_config']} | {val} | "
                 f"{r['winner_true']} / {r['best_true_launched']} | "
                 f"{'; '.join(r['tie_group'])} | {r['status']} | {r['race_added']} | "
                 f"{r['launches']['trials']} + {r['launches']['confirmation']} | {r['rerun_added_launches']} |")
    L += ["", f"- distinct tie groups: {summary['distinct_tie_groups']} (same for every seed: "
              f"{summary['same_tie_group']})",
          f"- distinct winners: {summary['distinct_winners']}; winners inside every seed's tie group: "
          f"{summary['winners_in_every_tie_group']} of {summary['seeds']}",
          f"- winner's noise-free rate within the confirmation's margin ({100 * summary['margin']:g} %) of the best "
          f"launched: "
          f"{summary['winners_within_margin']} of {summary['seeds']}",
          f"- launches added by rerunning the finished studies: {summary['rerun_launches']}", "",
          f"Generated by `benchmarks/decision_stability.py` in {took:.0f} s."]
    (out / "decision_stability.md").write_text("\n".join(L) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("overrides", nargs="*", help="extra Hydra overrides, e.g. sweep.confirm.max_repeats=12")
    a = ap.parse_args(argv)
    t0 = time.monotonic()
    rows = [one_seed(s, a.overrides) for s in range(a.seeds)]
    summary = summarise(rows)
    write(rows, summary, a.out, time.monotonic() - t0)
    print((a.out / "decision_stability.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
