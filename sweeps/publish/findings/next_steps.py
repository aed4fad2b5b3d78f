"""The "Next steps" section: what is worth running next, from what this sweep left open.

* untried regions: knob levels and approaches never launched (levels only skipped by a
  known dead end are not a region: the rule says why);
* ties: confirmed configs whose interval overlaps the winner's, when more repeats could decide
  them (not when the confirmation's race decided the pick: separated, shown equivalent, or
  ranked after it with no room to beat it);
* rechecks after an upgrade: dead ends whose class depends on the GPU architecture or a
  component version (``recheck_classes.yaml`` beside this module), with the recheck command;
* the plots, linked relative to the document (also on the MLflow parent run).
"""

from __future__ import annotations

import math
import os
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from sweeps.publish.findings.context import Context
from sweeps.publish.findings.groups import Group
from sweeps.publish.findings.load import break_evens, curve
from sweeps.publish.findings.text import fmt, trials
from sweeps.publish.findings.untried import knowledge, level_is_dead_end, open_approaches
from sweeps.store import records

RECHECK_FILE = Path(__file__).with_name("recheck_classes.yaml")
#: the node profiles (``conf/node/<name>.yaml``) a recheck command can name
NODE_DIR = Path(__file__).resolve().parents[3] / "conf" / "node"
#: How the README runs the project's commands (the interpreter ``make venv`` installs into), so a
#: command copied from the findings runs as written in a checkout.
PYTHON = ".venv/bin/python"
#: The confirmation race's decisions that more repeats cannot change
#: (:func:`sweeps.search.decision.decide` statuses).
DECIDED = frozenset({"single", "separated", "equivalent", "pick_decided"})
# The PNGs sweeps.publish.plots.write_plots writes, listed when the plots directory is not there yet.
DEFAULT_PLOTS = ("optimization_history.png", "param_importances.png", "toks_by_allreduce_speculation.png",
                 "failures_by_class.png", "eagle_draft_acceptance.png")


def load_recheck_classes(path: Path = RECHECK_FILE) -> dict[str, list[str]]:
    """failure class -> fingerprint components whose upgrade is worth a recheck.

    Raises:
        ValueError: the file is not a mapping of a canonical class (``tasks.failures.KIND``)
            to a list of fingerprint components (``sweeps.rules.knowledge.version_components``).
    """
    from sweeps.rules.knowledge import version_components
    from tasks.failures import KIND

    data = yaml.safe_load(path.read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of failure class -> components")
    for cls, comps in data.items():
        if cls not in KIND:
            raise ValueError(f"{path}: {cls!r} is not a canonical failure class")
        known = version_components()
        if not isinstance(comps, list) or not comps or any(c not in known for c in comps):
            raise ValueError(f"{path}: {cls}: expected a list of {list(known)}, got {comps!r}")
    return {k: list(v) for k, v in data.items()}


RECHECK_CLASSES = load_recheck_classes()


#: overrides a next-step command never repeats: the command sets the sweep and the study itself, and
#: a new study, a dry run or a recheck would not continue this one
_NOT_REPEATED = frozenset({"sweep", "study_name", "new_study", "dry_run", "source"})


def rerun_command(ctx: Context, *sets: str) -> str:
    """The command that runs this study again with ``sets`` (``key=value`` overrides): the sweep,
    the study, the overrides its latest run was given (:attr:`Context.overrides`, secrets masked)
    except those ``sets`` replace, then ``sets``; it runs as pasted against the same store."""
    def key(o: str) -> str:
        return o.partition("=")[0].lstrip("+~")
    replaced = {key(o) for o in sets} | _NOT_REPEATED
    kept = [o for o in ctx.overrides if key(o) not in replaced]
    return " ".join([f"{PYTHON} run_sweep.py", f"sweep={ctx.sweep or ctx.study}", f"study_name={ctx.study}",
                     *(shlex.quote(o) for o in kept), *sets])


def _untried_lines(ctx: Context, recs: Sequence[records.TrialRecord], groups: dict[tuple, Group], gk: list[str]) -> list[str]:
    if ctx.space is None:
        return []
    launched = [r for r in recs if r.launched]
    ok = knowledge(ctx, recs)
    regions: list[str] = []
    for p in ctx.space.params:
        try:
            lv = p.levels()
        except Exception:  # noqa: BLE001 - a continuous float: the "Still untried" section gives its range
            continue
        tried = {r.params.get(p.name) for r in launched if p.name in r.params}
        # the "Still untried" section's reading: a level skipped only for other knobs' dead ends is open
        open_ = [v for v in lv if v not in tried and not level_is_dead_end(ctx, recs, p.name, v, ok)]
        if open_:
            regions.append(f"`{p.name}` = " + ", ".join(str(v) for v in open_))
    combos = open_approaches(ctx, recs, groups, gk) if gk else []
    out = []
    if regions:
        out.append("- **Untried levels** (never launched, no known dead end): " + "; ".join(regions) + ".")
    if combos:
        out.append("- **Untried approaches** (no known dead end): " + "; ".join(combos) + ".")
    if out:
        # a number, not a placeholder: the command runs as pasted (a shell reads "<more>" as a redirection)
        more = 2 * ctx.trial_budget if ctx.trial_budget else len(launched) + 10
        out.append(f"  Continue the study with a larger budget (twice this study's; the budget counts the "
                   f"launches already made), with the overrides its last run was given: "
                   f"`{rerun_command(ctx, f'sweep.budget.trials={more}')}`.")
    return out


def _overlaps(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    lo1, hi1, lo2, hi2 = (x.get(k) for x in (a, b) for k in ("ci_low", "ci_high"))
    vals = (lo1, hi1, lo2, hi2)
    if any(not isinstance(v, int | float) or not math.isfinite(v) for v in vals):
        return False
    return lo1 <= hi2 and lo2 <= hi1


def _tie_lines(ctx: Context) -> list[str]:
    conf = ctx.confirmation or {}
    win = next((e for e in conf.get("entries", []) if e.get("trial") == conf.get("winner")), None)
    if win is None or (conf.get("decision") or {}).get("status") in DECIDED:
        return []
    # a contender the race left undecided but could not change the pick with (settled) needs no repeats
    settled = set((conf.get("decision") or {}).get("settled") or [])
    ties = [e for e in conf.get("entries", []) if e is not win and not e.get("is_baseline")
            and e.get("tokens_match") is not False and e.get("n") and _overlaps(win, e)
            and e.get("trial") not in settled]
    if not ties:
        return []
    rep = int(conf.get("repeats") or 0)
    cap = int(conf.get("max_repeats") or 0)  # 0: a confirmation stored without a race
    ns = [int(e.get("n") or 0) for e in [win, *ties]]
    at_cap = sum(n >= cap for n in ns) if cap else 0
    status = (conf.get("decision") or {}).get("status")
    runs = f"{min(ns)}" if min(ns) == max(ns) else f"{min(ns)}-{max(ns)}"
    more = max(2 * rep, rep + 3)
    if cap and cap <= rep:
        # no race (sweep.confirm.race false: the cap is the repeats): only more repeats add runs,
        # and a max_repeats below them would refuse the config
        why, flag = (f" The confirmation ran each config its `repeats` ({rep}), with no race.",
                     f"sweep.confirm.repeats={more} sweep.confirm.max_repeats={more}")
    elif cap and at_cap == len(ns):
        # the race already ran each config to its cap: only a higher cap adds repeats (they accumulate)
        why, flag = (f" The race ran them to its cap (`max_repeats`, {cap} per config).",
                     f"sweep.confirm.max_repeats={max(2 * cap, cap + 4)}")
    elif cap and status == "undecidable":
        # the race stopped early: its cap could not decide them (projected); the cap the projection
        # says would (decision "needed"), or, when none would, a wider margin and never more repeats
        reached = f"{at_cap} of them at its cap, " if at_cap else ""
        dec = conf.get("decision") or {}
        # (a confirmation stored before the projection named a cap has no "needed": double the cap)
        needed = dec.get("needed", max(2 * cap, cap + 4))
        stopped = (f" The race stopped them early, at {runs} runs ({reached}`max_repeats` {cap} per config): "
                   f"projected to the cap from their means and spreads so far, they could still not be decided")
        if "needed" not in dec:
            why, flag = f"{stopped}.", f"sweep.confirm.max_repeats={needed}"
        elif not needed:
            from sweeps.search.decision import NEEDED_LADDER

            margin = float(conf.get("margin") or 0.01)
            desc = "; ".join(_with_runs(e) for e in ties)
            return [f"- **A tie more repeats would not split**: the winner {_with_runs(win)} overlaps {desc}.{stopped}, "
                    f"nor at any cap up to {NEEDED_LADDER[-1]} times it: their difference is below what the node's run-to-run noise "
                    f"lets repeats resolve, so the pick by the tie-break stands and is as good as they are. To call "
                    f"them equivalent at a wider margin instead: `{rerun_command(ctx, f'sweep.confirm.margin={2 * margin:g}')}`."]
        else:
            why, flag = (f"{stopped}; at {needed} per config they would be.", f"sweep.confirm.max_repeats={needed}")
    elif cap and status == "budget_spent":
        why, flag = (f" The race's launch budget ran out with them at {runs} runs (`max_repeats` {cap} per config).",
                     f"sweep.confirm.max_repeats={max(2 * cap, cap + 4)}")
    else:
        why, flag = "", f"sweep.confirm.repeats={more}" + (f" sweep.confirm.max_repeats={more}" if cap and cap < more else "")
    desc = "; ".join(_with_runs(e) for e in ties)
    return [f"- **Ties that need more repeats**: the winner {_with_runs(win)} overlaps {desc}.{why} "
            f"Re-run the confirmation with more, with the overrides its last run was given: "
            f"`{rerun_command(ctx, *flag.split())}`."]


def _with_runs(e: Mapping[str, Any]) -> str:
    """``t25 89.3 (81.8–96.8, 3 runs)``: a confirmed config's mean, interval and its own number
    of measured runs (configs of one race can differ: the race repeats only the undecided)."""
    n = int(e.get("n") or 0)
    return (f"t{e['trial']} {fmt(e.get('mean'))} ({fmt(e.get('ci_low'))}–{fmt(e.get('ci_high'))}, "
            f"{n} run{'' if n == 1 else 's'})")


def _recheck_lines(ctx: Context, recs: Sequence[records.TrialRecord]) -> list[str]:
    seen: dict[str, list[int]] = {}
    skipped: dict[str, int] = {}
    for r in recs:
        if r.duplicate_of is not None:
            continue
        if r.status == "skipped" and r.failure_class in RECHECK_CLASSES:
            skipped[r.failure_class] = skipped.get(r.failure_class, 0) + 1
            continue
        cls = r.failure_class if r.status == "failed" else (
            records.DEGRADED if r.status == "ok" and not records.counts_for_level(r) else None)
        if cls in RECHECK_CLASSES:
            seen.setdefault(cls, []).append(r.number)
    if not seen:
        return []
    # a word, not "<...>": a shell reads an angle bracket as a redirection when the command is pasted
    # (and the study's store, as its last run was told it: the recheck reads the source study there)
    store = "".join(f" {shlex.quote(o)}" for o in ctx.overrides if o.partition("=")[0].lstrip("+~").startswith("tracking."))
    node = upgraded_node(str(ctx.node.get("name") or "")) or "NODE"
    where = "" if node != "NODE" else ", NODE being the upgraded node's profile (`conf/node/NODE.yaml`)"
    parts = [f"{cls} ({trials(ns, 4)}" + (f", {skipped[cls]} skipped" if skipped.get(cls) else "")
             + f"; after a {' / '.join(RECHECK_CLASSES[cls])} upgrade)" for cls, ns in sorted(seen.items())]
    return ["- **Rechecks worth running after an upgrade** (dead ends that depend on the GPU architecture or a "
            "component version): " + "; ".join(parts)
            + f". Re-run each once on the new stack: `{PYTHON} run_sweep.py sweep=recheck source={ctx.study} "
            f"node={node}{store}`{where} (on the node they were learned on they all still apply, and nothing is "
            "re-run)."]


def upgraded_node(name: str, node_dir: Path = NODE_DIR) -> str | None:
    """The profile a recheck of a study on node ``name`` names: the one ``conf/node/<name>_*.yaml``
    (``rtx_pro_6000x8`` -> ``rtx_pro_6000x8_upgraded``), else None (none, or several to choose from)."""
    found = sorted(p.stem for p in node_dir.glob(f"{name}_*.yaml")) if name else []
    return found[0] if len(found) == 1 else None


def expected_plots(ctx: Context, recs: Sequence[records.TrialRecord]) -> list[str]:
    """The PNGs the report writes for these records (:func:`sweeps.publish.plots.write_plots`):
    :data:`DEFAULT_PLOTS`, plus ``throughput_latency_curves.png`` when a trial has a load curve,
    ``pareto_front.png`` for several objectives and ``speculative_speedup_by_concurrency.png``
    with concurrency levels. The findings are written before the plots, so the directory alone
    would miss the plots a sweep's first write has not drawn yet."""
    names = list(DEFAULT_PLOTS)
    if any(r.status == "ok" and r.duplicate_of is None and curve(r) for r in recs):
        names.append("throughput_latency_curves.png")
    if getattr(ctx.objectives, "multi", False):
        names.append("pareto_front.png")
    if break_evens(recs):
        names.append("speculative_speedup_by_concurrency.png")
    return names


def plot_links(ctx: Context, recs: Sequence[records.TrialRecord] = ()) -> list[str]:
    """Markdown links to the study's PNG plots, relative to the findings document: those on
    disk and those the report writes for ``recs`` (:func:`expected_plots`), the expected ones
    first in their own order and any other on disk after them by name: the first write, before
    the plots exist, and a rerun list them alike."""
    if ctx.plots_dir is None:
        return []
    pdir = Path(ctx.plots_dir)
    names = expected_plots(ctx, recs)
    names += sorted({p.name for p in pdir.glob("*.png")} - set(names) if pdir.is_dir() else set())
    start = Path(ctx.findings_path).parent if ctx.findings_path else Path.cwd()
    rel = Path(os.path.relpath(pdir, start)).as_posix()
    links = ", ".join(f"[{n.removesuffix('.png')}]({rel}/{n})" for n in names)
    return [f"- **Plots**: {links} (written by the sweep and `{PYTHON} -m sweeps.report {ctx.study}`; "
            "also attached to the MLflow parent run under `plots/`)."]


def next_steps_section(ctx: Context, recs: Sequence[records.TrialRecord], groups: dict[tuple, Group], gk: list[str]) -> list[str]:
    """The "Next steps" section (always present: at least the plots)."""
    lines = _untried_lines(ctx, recs, groups, gk) + _tie_lines(ctx) + _recheck_lines(ctx, recs) + plot_links(ctx, recs)
    return ["### Next steps", "", *(lines or ["Nothing left open."]), ""]
