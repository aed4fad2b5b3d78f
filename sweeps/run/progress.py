"""Terminal progress (one line per finished trial + a status line) and the closing summary."""

from __future__ import annotations

import io
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import optuna
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from sweeps.config.objective import Objective, metric_text
from sweeps.store.records import DEFAULT_OBJECTIVE, NOT_LAUNCHED, TrialRecord, load_records, ranked_records, value_of
from sweeps.store.tracking import run_name
from tasks.load_search import censored_text


def _latency_cells(r: TrialRecord) -> tuple[str, str, str]:
    """The summary table's TTFT p50 (ms), ITL p50 (ms) and acceptance length cells of ``r``:
    ``-`` for a metric the trial has none of (a winner the confirmation's race added has no
    single run), and for the acceptance length of a config without speculative decoding."""
    def cell(key: str, fmt: str) -> str:
        v = r.metrics.get(key)
        return format(v, fmt) if isinstance(v, (int, float)) and v == v else "-"
    spec = r.params.get("speculative")
    return (cell("ttft_ms_p50", ".0f"), cell("itl_ms_p50", ".1f"),
            cell("accept_length", ".2f") if spec not in (None, "none") else "-")


def eta_s(walls: list[float], left: int, running: int, slots: int) -> float:
    """Seconds until ``left`` more launches (and the ``running`` ones) finish: the median
    measured launched-trial wall time (s) x the launches still to start per slot, plus half a
    trial for the ones in flight."""
    med = statistics.median(walls)
    return med * (left / max(1, slots) + (0.5 if running else 0.0))


class Progress:
    """Prints each finished trial and, every refresh, a status line: launched / running /
    failed / skipped, the best objective so far, the trials' ETA from the median launched-trial
    time, and what runs after the trials (the confirmation's launches, the serving check)."""

    def __init__(self, study_name: str, budget_trials: int | None, console: Console | None = None,
                 objective: Objective = DEFAULT_OBJECTIVE, deploy: Callable[[dict], str | None] | None = None,
                 node: str = "", emulated: bool = False):
        # no TTY (CI, a log file): rich would wrap at 80 columns mid-phrase
        self.console = console or Console(highlight=False, width=None if sys.stdout.isatty() else 200)
        self.study_name = study_name
        self.budget = budget_trials
        self.objective = objective
        self.deploy = deploy  #: params -> the deployable command on the target node
        self.node = node  #: where the numbers come from, e.g. "emulated 8×RTX PRO 6000"
        self.emulated = emulated  #: the numbers are the emulated node's (no real GPU time is spent)
        self.slots = 1  #: trials in flight at once (the driver sets the executor's)
        self.confirm_launches = 0  #: launches the confirmation adds after the budget, at least (a race adds more)
        self.serving_checks = 0  #: load searches the serving check runs after the confirmation
        self._last_status = 0.0

    def event(self, line: str) -> None:
        self.console.print(f"[dim]{time.strftime('%H:%M:%S')}[/dim] {escape(line)}", markup=True, soft_wrap=True)

    def status_line(self, recs: list[TrialRecord], running: int, t_start: float) -> str:
        launched = [r for r in recs if r.budgeted]  # re-question probes are not launches of the budget
        probes = sum(r.requestion and r.launched for r in recs)
        failed = sum(r.status in ("failed", "infra_error") for r in recs if not r.requestion)
        skipped = sum(r.status in ("skipped", "infeasible") for r in recs)
        ranked = ranked_records(recs, self.objective)
        best = value_of(ranked[0], self.objective) if ranked else None
        eta = ""
        walls = [r.timings["wall_s"] for r in launched if r.timings.get("wall_s")]
        if self.budget and walls:
            left = max(0, self.budget - len(launched) - running)
            eta = f", ETA {eta_s(walls, left, running, self.slots):.0f} s for the trials" + self._after_text(walls)
        head = (f"[{self.study_name}] launched {len(launched)}/{self.budget or '-'}"
                + (f" (+{probes} re-question probe{'s' if probes != 1 else ''})" if probes else "")
                + f", running {running}, failed {failed}, skipped {skipped}")
        return head + (f", best {metric_text(self.objective.name, best)}" if best is not None else "") + eta

    def _after_text(self, walls: list[float]) -> str:
        """What runs after the trials, which the trials' ETA leaves out: the confirmation's launches
        at this pace (at least: an undecided race adds repeats) and the serving check's load
        searches (each many trial-lengths long, not estimated)."""
        parts = []
        if self.confirm_launches:
            parts.append(f"at least {self.confirm_launches} confirmation launches "
                         f"(~{eta_s(walls, self.confirm_launches, 0, self.slots):.0f} s at this pace)")
        if self.serving_checks:
            parts.append(f"{self.serving_checks} serving-check load searches")
        return "; then " + " and ".join(parts) if parts else ""

    def refresh(self, study: optuna.Study, running: int, t_start: float, every_s: float = 15.0) -> None:
        now = time.monotonic()
        if now - self._last_status >= every_s:
            self._last_status = now
            self.console.print(f"[bold]{escape(self.status_line(load_records(study), running, t_start))}[/bold]")

    def summary(self, recs: list[TrialRecord], best: TrialRecord | None, baseline: float | None,
                stop_reason: str | None, findings: Path, confirmation: dict | None = None,
                note: str | None = None, headline: Sequence[str] | None = None,
                classes: Mapping[str, tuple[int, int]] | None = None, reference: float | None = None,
                winner: int | None = None) -> None:
        """The closing table: top configs (when any ranks), failures by class, the best launch
        command; ``note`` (why nothing was measured, or why speedups are missing) is the last
        line, where a reader of a long log looks.

        ``headline``: the counts, GPU-hours, baseline and winner lines of the study's one summary
        (:meth:`sweeps.publish.summary.StudySummary.lines`), printed instead of this printer's own;
        ``classes``: failure class -> (launched trials, proposals skipped), the summary's counts;
        ``reference``: the summary's baseline value (its confirmed mean where confirmed), which the
        table's speedups are taken against, so they are the findings' speedups (None: each
        trial's own ``speedup_vs_baseline``, against the baseline's run of the sweep);
        ``winner``: the summary's winner, marked in the table.
        """
        c = self.console
        c.rule(escape(f"servesweep: {self.study_name}"))
        if stop_reason:
            c.print(escape(f"stopped: {stop_reason}"))
            if stop_reason.startswith("trial budget spent") and best is not None:
                c.print("(to continue this study, run the same command with a larger sweep.budget.trials=N)")
        obj = self.objective
        ok = ranked_records(recs, obj)  # a silently degraded level is not listed as that level
        unit = "tok/s" if obj.name == "decode_tok_s" else obj.name
        t = Table(title=("best configurations (decode tok/s, batch 1)" if obj.name == "decode_tok_s"
                         else f"best configurations ({obj.label})")
                  + ("; single runs, speedup vs the summary's baseline" if reference else ""))
        for col in ("trial", unit, "speedup", "TTFT ms", "ITL p50 ms", "accept len", "config"):
            t.add_column(col)
        shown = ok[:8]
        if winner is not None and winner not in {r.number for r in shown}:
            shown += [r for r in ok if r.number == winner]
        # a winner the confirmation's race added has no single run of the sweep: its row is its confirmed mean
        added = (best if best is not None and best.number == winner and winner not in {r.number for r in shown}
                 else None)
        added_mean = next((e.get("mean") for e in (confirmation or {}).get("entries", [])
                           if added is not None and e.get("trial") == added.number), None)
        if added is not None and added_mean is not None:
            shown.append(added)
        for r in shown:
            v = added_mean if r is added else value_of(r, obj)
            sp = obj.ratio(v, reference) if reference and v else r.metrics.get("speedup_vs_baseline")
            marks = (" [baseline]" if r.is_baseline else "") + (
                " [winner: its confirmed mean; the race added it, no single run]" if r is added
                else " [winner]" if r.number == winner else "")
            t.add_row(str(r.number), f"{v:.1f}", f"{sp:.2f}x" if sp else "-", *_latency_cells(r),
                      escape(run_name(r).split(" ", 1)[-1] + marks))
        # a value its load search only bounded (failed at the incumbent's rate): listed with its bound, unranked
        for r in [r for r in recs if r.status == "ok" and r.duplicate_of is None and value_of(r, obj) is None
                  and censored_text(r.metrics, obj.name)][:8]:
            t.add_row(str(r.number), escape(censored_text(r.metrics, obj.name) or ""), "-", *_latency_cells(r),
                      escape(run_name(r).split(" ", 1)[-1] + (" [baseline]" if r.is_baseline else "")))
        if t.row_count:
            c.print(t)
        if classes is not None:
            if classes:
                ft = Table(title="failures and skips by class")
                # (a re-question probe of a known dead end launches too: its class counts here)
                for col in ("class", "launched or probed", "skipped without GPU time"):
                    ft.add_column(col)
                for k, (nl, ns) in classes.items():
                    ft.add_row(k, str(nl), str(ns))
                c.print(ft)
        else:
            self._fail_table(recs)
        if headline is not None:
            for line in headline:
                c.print(escape(line), soft_wrap=True)
            self._deploy_lines(best, findings, note)
            return
        launched = sum(r.launched for r in recs)
        gpu_h = sum(r.timings.get("gpu_s", 0.0) for r in recs) / 3600
        booked = f"booked on the {self.node} (modelled, no real GPU used)" if self.emulated \
            else f"on {self.node or 'the node'} (real GPUs)"
        answered = sum(not r.launched and r.state not in ("RUNNING", "WAITING") and r.status != NOT_LAUNCHED
                       for r in recs)
        c.print(escape(f"{launched} trials launched, {answered} answered without GPU time, "
                       f"{gpu_h:.3f} GPU-hours {booked}."))
        if baseline:
            c.print(f"baseline: {metric_text(obj.name, baseline)}")
        entry = next((e for e in (confirmation or {}).get("entries", [])
                      if best is not None and e.get("trial") == best.number and e.get("mean") is not None), None)
        on = f"{self.node}: " if self.node else ""
        if best is not None and entry is not None:
            sp = entry.get("speedup_ci") or [None, None]
            c.print(escape(f"best (confirmed over {entry.get('n')} repeats): trial {best.number}, {on}"
                           f"{metric_text(obj.name, entry['mean'])} "
                           f"[{confirmation.get('confidence', 0.95):.0%} CI {entry['ci_low']:.1f}-{entry['ci_high']:.1f}]"
                           + (f", {entry['speedup_mean']:.2f}x baseline [{sp[0]:.2f}-{sp[1]:.2f}]"
                              if entry.get("speedup_mean") and None not in sp else "")))
            if confirmation.get("winner_note"):
                c.print(escape(str(confirmation["winner_note"])))
        elif best is not None:
            bv = value_of(best, obj)
            c.print(escape(f"best: trial {best.number}, {on}{metric_text(obj.name, bv)} (one measurement)"
                           + (f" ({obj.ratio(bv, baseline):.2f}x baseline)" if baseline and bv else "")))
        self._deploy_lines(best, findings, note)

    def _fail_table(self, recs: list[TrialRecord]) -> None:
        fails: dict[str, int] = {}
        for r in recs:
            if r.failure_class and r.status in ("failed", "infra_error", "skipped"):
                fails[r.failure_class] = fails.get(r.failure_class, 0) + 1
        if fails:
            ft = Table(title="failures and skips by class")
            ft.add_column("class")
            ft.add_column("trials")
            for k, v in sorted(fails.items(), key=lambda kv: -kv[1]):
                ft.add_row(k, str(v))
            self.console.print(ft)

    def _deploy_lines(self, best: TrialRecord | None, findings: Path, note: str | None) -> None:
        c = self.console
        if best is not None:
            cmd = self.deploy(best.params) if self.deploy else None
            c.print("deploy command (target node, real engine):" if cmd else "launch command:")
            c.print(cmd or best.launch_command, markup=False, soft_wrap=True)
        if findings.exists():
            c.print(f"findings: {findings}")
        if note:
            c.print(escape(note), soft_wrap=True)

    def summary_text(self, *args: Any, **kwargs: Any) -> str:
        """:meth:`summary` as plain text (same arguments), for the ``summary.txt`` artifact."""
        saved = self.console
        self.console = Console(file=io.StringIO(), highlight=False, width=200, record=True)
        try:
            self.summary(*args, **kwargs)
            return self.console.export_text()
        finally:
            self.console = saved

    def confirm_event(self, done: int, total: int, label: str, result: str) -> None:
        """One line per finished confirmation launch: ``confirm 3/20 t012 eagle3 ...: 88.1 tok/s``."""
        self.event(f"confirm {done}/{total} {label}: {result}")
