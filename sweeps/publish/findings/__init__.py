"""The findings document: one markdown file per sweep, read before it is written.

``update_findings(spec, study, records, fingerprint, rules)`` rewrites only the
servesweep section of ``spec.findings_path`` (default ``findings/<sweep>.md`` at the repo
root) and keeps everything outside it byte for byte (:mod:`sweeps.publish.findings.document`:
markers, splice, data line, atomic write). The section is rendered by
:func:`~sweeps.publish.findings.render.render_section`, one function per section (environment,
baseline and drift, best config, approaches, dead ends, untried). Every value, ranking and
ratio is the sweep's objective (:mod:`sweeps.publish.findings.measure`); the study's own storage is
never opened here: the caller passes the study (or the confirmation).

The ``servesweep:data`` line is a JSON block the next write reads back: the baseline
history across sweeps (so drift such as 82.0 -> 89.5 tok/s is called out) and the
best configs of earlier sweeps.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import optuna

from sweeps.config.objective import Objective
from sweeps.publish.findings.baseline import DRIFT_THRESHOLD, baseline_drift, baseline_history
from sweeps.publish.findings.context import Context, context_from_spec
from sweeps.publish.findings.document import (
    BEGIN,
    DATA_PREFIX,
    END,
    HEADER,
    atomic_write,
    find_sections,
    read_data_block,
    read_document,
    splice_section,
)
from sweeps.publish.findings.groups import GROUP_PREFERENCE, group_knobs
from sweeps.publish.findings.measure import objective_of
from sweeps.publish.findings.render import DATA_VERSION, render_section
from sweeps.search.coverage import STOP_ATTR
from sweeps.store import records as trial_records
from sweeps.store.study import OVERRIDES_ATTR
from tasks.redact import redact_text

__all__ = [
    "BEGIN", "DATA_PREFIX", "DATA_VERSION", "DRIFT_THRESHOLD", "END", "GROUP_PREFERENCE", "HEADER", "Context",
    "atomic_write", "baseline_drift", "baseline_history", "context_from_spec", "find_sections", "group_knobs",
    "objective_of", "read_data_block", "render_section", "splice_section", "update_findings",
]

log = logging.getLogger("servesweep.findings")
CONFIRMATION_ATTR = "confirmation"  # the study user attribute sweeps.search.confirm writes
SERVING_ATTR = "serving_check"  # the study user attribute sweeps.search.serving_check writes


def update_findings(spec: Any, study: optuna.Study | str, records: Sequence[trial_records.TrialRecord],
                    fingerprint: Mapping[str, str] | None, rules: Any, *,
                    confirmation: Mapping[str, Any] | None = None, path: Path | None = None,
                    objective: Objective | None = None) -> Path:
    """Read the findings document, rewrite its servesweep section, keep everything else.

    Args:
        spec: the :class:`~sweeps.config.spec.SweepSpec` (node, model, space, baseline, paths).
        study: the Optuna study (its confirmation, if any, is its user attribute
            ``confirmation`` unless ``confirmation`` is given), or only its name (then
            there is a confirmation only when ``confirmation`` is given).
        records: every trial (:func:`sweeps.store.records.load_records`).
        fingerprint: the node's environment fingerprint ({} if unknown).
        rules: a :class:`~sweeps.rules.store.RuleStore` or None.
        confirmation: the winner confirmation (:func:`sweeps.search.confirm.confirm_top`).
        path: the document (default ``spec.findings_path``).
        objective: what to rank and report by (default: the spec's primary objective,
            :func:`~sweeps.publish.findings.measure.objective_of`).
    Returns:
        The document's path.
    Raises:
        OSError: the document cannot be read or written.
    """
    path = Path(path or spec.findings_path)
    study_name = study if isinstance(study, str) else study.study_name
    if confirmation is None and not isinstance(study, str):
        confirmation = study.user_attrs.get(CONFIRMATION_ATTR)
    ctx = context_from_spec(spec, study_name, fingerprint, rules, confirmation, objective)
    if not isinstance(study, str):
        ctx.serving = study.user_attrs.get(SERVING_ATTR) or None
        ctx.stop_reason = study.user_attrs.get(STOP_ATTR) or None
        ctx.overrides = [str(o) for o in study.user_attrs.get(OVERRIDES_ATTR) or []]
    old = read_document(path)  # bytes kept as is
    section, _ = render_section(ctx, records, read_data_block(old))
    section = redact_text(section)  # model paths with credentials, tokens in decisive log lines
    new = splice_section(old, section)
    if new != old:
        atomic_write(path, new)
    return path
