"""The findings document: one markdown file per sweep, read before it is written.

``update_findings(spec, study_name, records, fingerprint, rules)`` rewrites only the
servesweep section of ``spec.findings_path`` (default ``findings/<sweep>.md`` at the repo
root) and keeps everything outside it byte for byte (:mod:`sweeps.findings.document`:
markers, splice, data line, atomic write). The section is rendered by
:func:`~sweeps.findings.render.render_section`, one function per section (environment,
baseline and drift, best config, approaches, dead ends, untried).

The ``servesweep:data`` line is a JSON block the next write reads back: the baseline
history across sweeps (so drift such as 82.0 -> 89.5 tok/s is called out) and the
best configs of earlier sweeps.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sweeps import records as R
from sweeps.findings.baseline import DRIFT_THRESHOLD, baseline_drift, baseline_history
from sweeps.findings.context import Context, context_from_spec
from sweeps.findings.document import (
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
from sweeps.findings.groups import GROUP_PREFERENCE, group_knobs
from sweeps.findings.render import DATA_VERSION, render_section
from tasks.redact import redact_text

__all__ = [
    "BEGIN", "DATA_PREFIX", "DATA_VERSION", "DRIFT_THRESHOLD", "END", "GROUP_PREFERENCE", "HEADER", "Context",
    "atomic_write", "baseline_drift", "baseline_history", "context_from_spec", "find_sections", "group_knobs",
    "read_data_block", "render_section", "splice_section", "study_user_attrs", "update_findings",
]

log = logging.getLogger("servesweep.findings")

_STORAGES: dict[str, Any] = {}


def study_user_attrs(storage_url: str, study_name: str) -> dict[str, Any]:
    """The study's user attributes read from its RDB storage ({} when it does not exist)."""
    import optuna

    st = _STORAGES.get(storage_url)
    if st is None:
        st = optuna.storages.RDBStorage(storage_url, engine_kwargs={"connect_args": {"timeout": 30}}
                                        if storage_url.startswith("sqlite") else {})
        _STORAGES[storage_url] = st
    try:
        sid = st.get_study_id_from_name(study_name)
    except KeyError:
        return {}
    return dict(st.get_study_user_attrs(sid))


def update_findings(spec: Any, study_name: str, records: Sequence[R.TrialRecord], fingerprint: Mapping[str, str] | None,
                    rules: Any, *, confirmation: Mapping[str, Any] | None = None, path: Path | None = None) -> Path:
    """Read the findings document, rewrite its servesweep section, keep everything else.

    Args:
        spec: the :class:`~sweeps.config.SweepSpec` (node, model, space, baseline, paths).
        study_name: the Optuna study (its confirmation, if any, is read from the study's
            user attribute ``confirmation`` unless ``confirmation`` is given).
        records: every trial (:func:`sweeps.records.load_records`).
        fingerprint: the node's environment fingerprint ({} if unknown).
        rules: a :class:`~sweeps.rules.RuleStore` or None.
        path: the document (default ``spec.findings_path``).
    Returns:
        The document's path.
    Raises:
        OSError: the document cannot be read or written.
    """
    path = Path(path or spec.findings_path)
    if confirmation is None:
        try:
            confirmation = study_user_attrs(spec.optuna_storage, study_name).get("confirmation")
        except Exception as e:  # noqa: BLE001
            log.debug("findings: no study attrs (%s)", e)
    ctx = context_from_spec(spec, study_name, fingerprint, rules, confirmation)
    old = read_document(path)  # bytes kept as is
    section, _ = render_section(ctx, records, read_data_block(old))
    section = redact_text(section)  # model paths with credentials, tokens in decisive log lines
    new = splice_section(old, section)
    if new != old:
        atomic_write(path, new)
    return path
