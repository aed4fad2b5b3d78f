"""A serving check of the winner: does the batch-1 decode winner hold a latency SLO under load?

A sweep ranked by single-stream decode tok/s can crown a config that serves one user fast and
many users badly (an LL protocol at a small CUDA-graph batch: p99 TPOT 183 ms at 2.96 req/s
where default-protocol configs held 47 ms). When ``sweep.serving_check`` is on and the
objective is ``decode_tok_s``, after the confirmation:

1. the baseline is launched once with the ``sweep.serving_check_bench`` workload (default
   ``conf/bench/chat_goodput.yaml``: chat-like Poisson traffic, an SLO and a load search) and
   its load search finds its sustainable rate ``R`` (``max_rate_at_slo_req_s``);
2. the winner is launched once with the same workload, its first level offered at ``R``
   (the load search's incumbent rate; ``max_levels=2`` keeps it short), so its p99 TTFT and
   p99 TPOT at exactly the baseline's rate are measured.

The result (:func:`run_serving_check`) is stored in the study user attribute
``serving_check``; :func:`passes` is what a tie-break reads ("passes the serving check").
Every check a study ran, and the baseline's load search, are also kept in ``serving_checks``
(:data:`ALL_ATTR`): a later member of a tie group reuses the baseline's rate (one launch, not
two), and a rerun of a finished study reuses every check it needs (no launch).

Result shape (JSON)::

    {"bench": "chat_goodput", "slo": {"ttft_ms_p99": 2000, "tpot_ms_p99": 50},
     "rate_req_s": R, "winner_trial": 13, "baseline_trial": 0,
     "baseline": {"trial", "met", "rate_req_s", "ttft_ms_p99", "tpot_ms_p99", "goodput_req_s", "status"},
     "winner": {...the same at R...}, "verdict": "holds" | "trades_away" | "unknown",
     "sentence": "...", "launches": 2, "gpu_s": 123.4}

where ``launches`` and ``gpu_s`` count every serving-check launch of the study (the baseline's
load search once, one level per checked member),

or ``{"error": "..."}`` when it could not run (a failed launch is a verdict ``unknown``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sweeps.config.bench import BenchConfig
from sweeps.config.spec import REPO_ROOT, SweepSpec
from sweeps.run.runner import Runner
from sweeps.search.interfaces import ConfirmHost
from sweeps.store import records
from tasks.types import BenchSpec, TrialResult, TrialSpec

log = logging.getLogger("servesweep.serving_check")
ATTR = "serving_check"
#: every serving check of the study by ``"<winner>/<baseline>/<bench>"``, and the baseline's load
#: search by ``"baseline/<trial>/<bench>"`` (``rate_req_s``, its side, its launch and GPU-s)
ALL_ATTR = "serving_checks"
DECODE = "decode_tok_s"  # the batch-1 objective the check guards
# Serving-check launches use trial numbers SERVING_BASE + trial (work dirs, the noise seed);
# far above any study's trial numbers and the confirmation's (10_000_000 + trial * 100 + repeat).
SERVING_BASE = 20_000_000
WINNER_LEVELS = 2  # the winner's load search: its first level at the baseline's rate, then one more
RATE_MATCH = 0.01  # a level within 1 % of the baseline's rate is "at" it (the search's rates are floats)


def wanted(spec: SweepSpec) -> bool:
    """True when the sweep asks for a serving check: ``sweep.serving_check`` on, a search sweep,
    a single objective that is batch-1 decode (``decode_tok_s``)."""
    sw = spec.sweep
    objs = spec.objective_set
    return bool(sw.serving_check) and sw.mode == "search" and not objs.multi and objs.primary.name == DECODE


def serving_bench(spec: SweepSpec) -> BenchSpec:
    """The load workload of the check: ``conf/bench/<sweep.serving_check_bench>.yaml``.

    Raises:
        ValueError: no such file, or a bench without ``workload``, ``slo`` and ``load_search``
            (names ``sweep.serving_check_bench`` and the fix).
    """
    from omegaconf import OmegaConf

    name = spec.sweep.serving_check_bench
    path = Path(name) if name.endswith(".yaml") else REPO_ROOT / "conf" / "bench" / f"{name}.yaml"
    if not path.exists():
        raise ValueError(f"sweep.serving_check_bench={name!r}: no {path}; name a file of conf/bench/ "
                         f"(e.g. chat_goodput) or set sweep.serving_check=false")
    cfg = BenchConfig(**OmegaConf.to_container(OmegaConf.load(path), resolve=True))  # type: ignore[arg-type]
    if cfg.workload is None or cfg.slo is None or cfg.load_search is None:
        raise ValueError(f"sweep.serving_check_bench={name!r}: the bench needs workload, slo and load_search "
                         f"(as conf/bench/chat_goodput.yaml)")
    return cfg.to_spec()


def passes(check: Mapping[str, Any] | None, trial: int) -> bool | None:
    """Whether ``trial`` passed the stored serving check (True/False), None when it was not checked
    (no check, an error, or another trial). The baseline passes by construction at its own rate."""
    if not check or check.get("error"):
        return None
    for side in ("winner", "baseline"):
        s = check.get(side) or {}
        if s.get("trial") == trial and s.get("met") is not None:
            return bool(s["met"])
    return None


def level_at(res: TrialResult, rate: float) -> dict[str, Any] | None:
    """The load level of ``res`` offered at ``rate`` (within :data:`RATE_MATCH`), as
    ``{"rate_req_s", "met", "ttft_ms_p99", "tpot_ms_p99", "goodput_req_s"}``; None when it has none."""
    for b in res.bench or []:
        art = b.get("load") if isinstance(b, dict) else None
        if not art or art.get("kind") != "load_search":
            continue
        for lv in art.get("levels") or []:
            r = float(lv.get("rate_req_s") or 0.0)
            if rate > 0 and abs(r / rate - 1.0) <= RATE_MATCH:
                m = lv.get("metrics") or {}
                return {"rate_req_s": r, "met": bool(lv.get("met")), "ttft_ms_p99": m.get("ttft_ms_p99"),
                        "tpot_ms_p99": m.get("tpot_ms_p99"), "goodput_req_s": m.get("goodput_req_s")}
    return None


def _spec_for(host: ConfirmHost, r: records.TrialRecord, bench: BenchSpec) -> TrialSpec:
    from tasks.backends import get_backend

    spec = host.spec
    argv, env, expected = get_backend(spec.backend.kind).render(r.params, spec.node.model_dump(),
                                                                spec.model.model_dump(), host.backend)
    return TrialSpec(sweep=f"{host.study_name}-serving", trial_number=SERVING_BASE + r.number, params=r.params,
                     argv=argv, env=dict(env), backend=spec.backend.kind, gpus=spec.gpus_per_trial, bench=bench,
                     timeouts=spec.timeouts(), container_name=spec.backend.container_name, expected_paths=expected)


def _launch(host: ConfirmHost, runner: Runner[int], r: records.TrialRecord, bench: BenchSpec) -> TrialResult | None:
    """One launch of ``r`` with ``bench``; None when the sweep was interrupted meanwhile."""
    runner.submit(_spec_for(host, r, bench), f"{host.study_name}/serving/{r.number}", r.number)
    while runner.inflight:
        if host.interrupted:
            runner.cancel_all()
            runner.drop_all()
            return None
        for handle in runner.wait(timeout=1.0):
            return runner.take(handle)[1]
    return None


def _side(r: records.TrialRecord, res: TrialResult, rate: float | None) -> dict[str, Any]:
    out: dict[str, Any] = {"trial": r.number, "status": res.status, "met": None,
                           "failure_class": res.failure_class or ""}
    if res.status == "ok" and rate:
        lv = level_at(res, rate)
        if lv is not None:
            out.update(lv)
    return out


def _num(v: Any, digits: int = 0) -> str:
    return f"{float(v):.{digits}f}" if isinstance(v, int | float) and math.isfinite(float(v)) else "?"


def sentence(check: Mapping[str, Any]) -> str:
    """The check's verdict in one sentence, with the numbers (p99 TTFT / TPOT at the rate)."""
    slo = check.get("slo") or {}
    rate = check.get("rate_req_s")
    w, b = check.get("winner") or {}, check.get("baseline") or {}
    lim = f"SLO p99 TTFT <= {_num(slo.get('ttft_ms_p99'))} ms, p99 TPOT <= {_num(slo.get('tpot_ms_p99'))} ms"
    if not rate:
        return (f"unknown: the baseline (t{b.get('trial')}) held the {lim} at no rate its load search tried "
                f"({b.get('status')}{' ' + b['failure_class'] if b.get('failure_class') else ''}).")

    def at(s: Mapping[str, Any]) -> str:
        return f"p99 TTFT {_num(s.get('ttft_ms_p99'))} ms, p99 TPOT {_num(s.get('tpot_ms_p99'), 1)} ms"
    where = f"at the baseline's sustainable rate {rate:.2f} req/s ({check.get('bench')} workload, {lim})"
    base = f"the baseline t{b.get('trial')}: {at(b)}"
    if check.get("winner_trial") == check.get("baseline_trial"):
        return f"holds: the winner is the baseline, {where}: {at(b)}."
    if w.get("met") is None:
        return (f"unknown: the winner t{w.get('trial')} was not measured {where} "
                f"({w.get('status')}{' ' + w['failure_class'] if w.get('failure_class') else ''}); {base}.")
    if w["met"]:
        return f"holds: the winner t{w.get('trial')} meets the SLO {where}: {at(w)} ({base})."
    return (f"trades it away: the winner t{w.get('trial')} misses the SLO {where}: {at(w)}, "
            f"while {base}. Its batch-1 speed costs serving capacity.")


def run_serving_check(host: ConfirmHost, winner: records.TrialRecord, baseline: records.TrialRecord,
                      force: bool = False) -> dict[str, Any]:
    """Load-check ``baseline`` (its sustainable rate) and ``winner`` (at that rate); store and return
    the result (module docstring). Reuses a stored check of the same pair and bench unless ``force``.

    Never raises for a failed launch (a verdict ``unknown``); a bad ``serving_check_bench`` gives
    ``{"error": ...}`` (also stored, so the summary says why).
    """
    spec = host.spec
    old = host.study.user_attrs.get(ATTR) or {}
    name = spec.sweep.serving_check_bench
    done = dict(host.study.user_attrs.get(ALL_ATTR) or {})
    key, base_key = f"{winner.number}/{baseline.number}/{name}", f"baseline/{baseline.number}/{name}"
    if not force and key in done and not done[key].get("error"):
        log.info("serving check of t%d against t%d already done; reusing it", winner.number, baseline.number)
        _store(host, done[key])
        return dict(host.study.user_attrs.get(ATTR) or done[key])
    if (not force and old and not old.get("error") and old.get("winner_trial") == winner.number
            and old.get("baseline_trial") == baseline.number and old.get("bench") == name):
        log.info("serving check of t%d against t%d already done; reusing it", winner.number, baseline.number)
        return dict(old)
    if force:
        done = {}
    try:
        bench = serving_bench(spec)
    except ValueError as e:
        out: dict[str, Any] = {"error": str(e), "bench": name}
        _store(host, out)
        return out
    t0 = time.monotonic()
    runner: Runner[int] = Runner(host.executor, host.profile, spec.backend.retries_transient)
    base = done.get(base_key)
    if base is None:
        log.info("serving check: load search of the baseline t%d (%s)", baseline.number, name)
        bres = _launch(host, runner, baseline, bench)
        if bres is None:
            return {}
        rate = float(bres.metrics.get("max_rate_at_slo_req_s") or 0.0) if bres.status == "ok" else 0.0
        base = {"rate_req_s": rate, "side": _side(baseline, bres, rate), "launches": 1,
                "gpu_s": round(float(bres.gpu_s or 0.0), 3)}
        done[base_key] = base
    rate = float(base["rate_req_s"] or 0.0)
    launches, gpu_s = 0, 0.0
    wside = base["side"]
    if winner.number != baseline.number and rate > 0:
        ls = bench.load_search
        assert ls is not None
        wbench = dataclasses.replace(bench, incumbent_rate=rate, load_search=dataclasses.replace(
            ls, max_levels=WINNER_LEVELS, rate_lo=min(ls.rate_lo, rate * 0.5), rate_hi=max(ls.rate_hi, rate * 2)))
        log.info("serving check: the winner t%d at %.2f req/s", winner.number, rate)
        got = _launch(host, runner, winner, wbench)
        if got is None:
            return {}
        wside, launches, gpu_s = _side(winner, got, rate), 1, float(got.gpu_s or 0.0)
    slo = bench.slo
    out = {"bench": name, "slo": {"ttft_ms_p99": slo.ttft_ms_p99, "tpot_ms_p99": slo.tpot_ms_p99} if slo else {},
           "rate_req_s": rate or None, "winner_trial": winner.number, "baseline_trial": baseline.number,
           "baseline": base["side"], "winner": wside,
           "launches": launches, "gpu_s": round(gpu_s, 3), "wall_s": round(time.monotonic() - t0, 2)}
    w = out["winner"]
    out["verdict"] = ("unknown" if not rate or w.get("met") is None else "holds" if w["met"] else "trades_away")
    out["sentence"] = sentence(out)
    log.info("serving check: %s", out["sentence"])
    done[key] = out
    host.study.set_user_attr(ALL_ATTR, json.loads(json.dumps(done, default=str).replace("NaN", "null")))
    _store(host, out)
    return dict(host.study.user_attrs.get(ATTR) or out)


def check_winner(host: ConfirmHost, confirmation: Mapping[str, Any] | None) -> dict[str, Any]:
    """The serving check of the sweep's winner (the confirmed one, else the best single
    measurement) against its baseline when :func:`wanted`; {} when off or nothing to check."""
    if not wanted(host.spec) or host.interrupted:
        return {}
    recs = records.load_records(host.study)
    obj = host.spec.objective_set.primary
    win = (confirmation or {}).get("winner")
    from sweeps.search.confirm import config_record

    winner = config_record(recs, confirmation, win) if win is not None else records.best_record(recs, obj)
    baseline = next((r for r in recs if r.is_baseline and r.status == "ok"), None)
    if winner is None or baseline is None:
        return {}
    return run_serving_check(host, winner, baseline)


def check_tie_group(host: ConfirmHost, confirmation: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The serving check as the confirmation's first tie-break (:data:`sweeps.search.decision.TIE_BREAK`).

    The winner is checked first (:func:`check_winner`). When it trades the SLO away and its tie
    group has other members, the pick moves (:func:`sweeps.search.decision.repick`) to the next
    member by the tie-break and that one is checked, until a member holds or every member has
    failed (then the original tie-break's pick stands, its failure reported). The first check
    costs the baseline's load search and the member's level (2 launches), each later member its
    level only; a rerun reuses every stored check (:data:`ALL_ATTR`, no launch).

    Returns:
        (the check of the final pick or {}, the confirmation: ``confirmation`` itself when the pick
        did not move, else a new dict, also stored in the study).
    """
    from sweeps.search.confirm import ATTR as CONFIRM_ATTR
    from sweeps.search.decision import repick

    check = check_winner(host, confirmation)
    group = [int(t) for t in confirmation.get("tie_group") or []]
    if check.get("verdict") != "trades_away" or len(group) < 2:
        return check, confirmation
    from sweeps.search.confirm import config_record

    study_recs = records.load_records(host.study)
    recs = {r.number: r for r in study_recs}
    for t in group:  # a member only the race measured (sweeps.search.confirm's descent)
        if t not in recs and (r := config_record(study_recs, confirmation, t)) is not None:
            recs[t] = r
    baseline = recs.get(int(check["baseline_trial"]))
    verdicts: dict[int, bool | None] = {int(check["winner_trial"]): False}
    conf, first = confirmation, check
    while baseline is not None and not host.interrupted:
        conf = repick(confirmation, verdicts, maximize=host.spec.objective_set.primary.maximize)
        pick = conf.get("winner")
        if not isinstance(pick, int) or pick in verdicts or pick not in recs:
            break
        check = run_serving_check(host, recs[pick], baseline)
        if not check or check.get("verdict") == "unknown":
            verdicts[pick] = None
            break
        verdicts[pick] = check["verdict"] == "holds"
        if verdicts[pick]:
            break
    if not any(verdicts.values()):  # nobody holds: the tie-break's own pick, with its own check
        if check is not first:
            _store(host, first)
        return first, confirmation
    host.study.set_user_attr(CONFIRM_ATTR, json.loads(json.dumps(conf, default=str).replace("NaN", "null")))
    return check, conf


def _store(host: ConfirmHost, out: Mapping[str, Any]) -> None:
    """Make ``out`` the study's serving check (:data:`ATTR`), its ``launches`` and ``gpu_s`` the
    totals of every serving-check launch the study made (:data:`ALL_ATTR`)."""
    done = host.study.user_attrs.get(ALL_ATTR) or {}
    total = dict(out)
    if done:
        total["launches"] = sum(int(v.get("launches") or 0) for v in done.values())
        total["gpu_s"] = round(sum(float(v.get("gpu_s") or 0.0) for v in done.values()), 3)
    host.study.set_user_attr(ATTR, json.loads(json.dumps(total, default=str).replace("NaN", "null")))


__all__ = ["ALL_ATTR", "ATTR", "check_tie_group", "check_winner", "level_at", "passes", "run_serving_check", "sentence",
           "serving_bench", "wanted"]
