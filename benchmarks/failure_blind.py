"""The classifier's blind reading of each held-out part, beside an engineer's reading of the same logs.

    python benchmarks/failure_blind.py            # every part of tasks/failure_corpus/blind.yaml
    python benchmarks/failure_blind.py --cached   # re-score the stored blind verdicts (no git checkouts)

A held-out part is scored blind once: by the classifier of the commit named for it in
``tasks/failure_corpus/blind.yaml``, before any rule was written from its logs. This benchmark
checks each of those commits out (``git worktree add``, removed after), classifies the part with
it (``benchmarks/failure_corpus.py``'s ``--code-root`` runner) and keeps each entry's blind verdict
in ``benchmarks/results/failure_blind.json``, so the blind figures are data, not only prose.

Beside it: **an engineer's reading** of the same logs (``tasks/failure_corpus/engineer/<part>.yaml``).
A reader who knows the engines was given each log and its exit code only (no thread, no label, no
classifier) and named the class they would give it, quoting the deciding line. That is the
ceiling of reading a log alone: an excerpt that stops before its error line, or a label that rests
on what the thread says rather than on what the log shows, defeats the engineer too. Per part and
pooled it reports:

- the classifier's blind class and kind accuracy, and the engineer's;
- the classifier's blind accuracy on the logs the engineer read right ("the log shows it"): how
  close the classifier comes to an engineer where the log is enough;
- the entries where the engineer was right and the classifier was not (what a rule could learn),
  and the reverse.

Kinds are those of ``tasks/failure_signatures.yaml`` (``healthy`` for a healthy log); an engineer's
class outside the table counts as ``unknown``. Writes ``benchmarks/results/failure_blind.json``
and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
RESULTS = REPO / "benchmarks" / "results"
BLIND_FILE = REPO / "tasks" / "failure_corpus" / "blind.yaml"
ENGINEER_DIR = REPO / "tasks" / "failure_corpus" / "engineer"

from benchmarks.failure_corpus import classify_entries  # noqa: E402
from tasks.failure_corpus import HEALTHY, CorpusEntry, load_corpus  # noqa: E402
from tasks.failure_signatures import TABLES  # noqa: E402


def kind_of(cls: str) -> str:
    """The kind of a class name (``healthy`` for a healthy log; ``unknown``'s for a name outside the table)."""
    return HEALTHY if cls == HEALTHY else TABLES.kinds.get(cls, TABLES.kinds["unknown"])


def engineer_reads(part: str, root: Path = ENGINEER_DIR) -> dict[str, str]:
    """id -> the class the engineer gave (``unknown`` for a name outside the table); {} when the
    part has no reading. Raises ValueError naming the file for a malformed reading."""
    path = root / f"{part}.yaml"
    if not path.exists():
        return {}
    rows = yaml.safe_load(path.read_text())
    if not isinstance(rows, list) or not all(isinstance(r, dict) and "id" in r and "class" in r for r in rows):
        raise ValueError(f"{path}: expected a list of {{id, class, line, sure}}")
    return {r["id"]: (r["class"] if r["class"] == HEALTHY or r["class"] in TABLES.kinds else "unknown") for r in rows}


def blind_verdicts(parts: dict[str, str]) -> dict[str, dict[str, Any]]:
    """part -> {commit, entries: {id: {class, kind}}}: each part classified by its blind commit's
    classifier, in a temporary git worktree (this repository's history must hold the commit)."""
    out: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for part, commit in parts.items():
            wt = Path(tmp) / part
            subprocess.run(["git", "-C", str(REPO), "worktree", "add", "-q", "--detach", str(wt), commit], check=True)
            try:
                got, _ = classify_entries(load_corpus([part]), wt)
            finally:
                subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(wt)], check=False)
            full = subprocess.run(["git", "-C", str(REPO), "rev-parse", commit], capture_output=True, text=True,
                                  check=True).stdout.strip()
            out[part] = {"commit": full,
                         "entries": {i: {"class": g["class"], "kind": g["kind"]} for i, g in sorted(got.items())}}
    return out


def _pct(k: int, n: int) -> float | None:
    return round(k / n, 3) if n else None


def compare(entries: list[CorpusEntry], blind: dict[str, dict[str, str]], eng: dict[str, str]) -> dict[str, Any]:
    """Figures of one part (or of several pooled): the classifier's blind accuracy, the engineer's,
    and the classifier's on the logs the engineer read right."""
    n = len(entries)
    b_cls = sum(blind[e.id]["class"] == e.expected_class for e in entries)
    b_kind = sum(blind[e.id]["kind"] == e.expected_kind for e in entries)
    read = [e for e in entries if e.id in eng]
    e_cls = sum(eng[e.id] == e.expected_class for e in read)
    e_kind = sum(kind_of(eng[e.id]) == e.expected_kind for e in read)
    shown = [e for e in read if eng[e.id] == e.expected_class]
    s_cls = sum(blind[e.id]["class"] == e.expected_class for e in shown)
    s_kind = sum(blind[e.id]["kind"] == e.expected_kind for e in shown)
    return {
        "n": n, "engineer_read": len(read),
        "classifier_class": b_cls, "classifier_kind": b_kind,
        "classifier_class_accuracy": _pct(b_cls, n), "classifier_kind_accuracy": _pct(b_kind, n),
        "engineer_class": e_cls, "engineer_kind": e_kind,
        "engineer_class_accuracy": _pct(e_cls, len(read)), "engineer_kind_accuracy": _pct(e_kind, len(read)),
        "log_shows_it": len(shown), "classifier_class_where_log_shows_it": s_cls,
        "classifier_kind_where_log_shows_it": s_kind,
        "classifier_class_accuracy_where_log_shows_it": _pct(s_cls, len(shown)),
        "classifier_kind_accuracy_where_log_shows_it": _pct(s_kind, len(shown)),
        "engineer_right_classifier_wrong": sorted(
            ({"id": e.id, "label": e.expected_class, "classifier": blind[e.id]["class"]} for e in shown
             if blind[e.id]["class"] != e.expected_class), key=lambda x: x["id"]),
        "classifier_right_engineer_wrong": sorted(
            ({"id": e.id, "label": e.expected_class, "engineer": eng[e.id]} for e in read
             if eng[e.id] != e.expected_class and blind[e.id]["class"] == e.expected_class), key=lambda x: x["id"]),
    } if n else {"n": 0}


def _fmt(k: int, n: int) -> str:
    return f"{k / n:.1%} ({k}/{n})" if n else "-"


def _md(report: dict[str, Any]) -> str:
    lines = ["# The classifier's blind reading beside an engineer's (held-out parts)", "",
             "Blind: each part classified by the commit that first scored it (`tasks/failure_corpus/blind.yaml`), "
             "before any rule was written from it. Engineer: a reader given each log and its exit code only "
             "(`tasks/failure_corpus/engineer/`). \"Log shows it\": the logs the engineer read right.", "",
             "| part | n | classifier class | classifier kind | engineer class | engineer kind | "
             "classifier class where the log shows it | classifier kind where the log shows it |",
             "|---|---|---|---|---|---|---|---|"]
    for part, r in [*report["parts"].items(), ("**pooled**", report["pooled"])]:
        if not r.get("n"):
            continue
        lines.append(f"| {part} | {r['n']} | {_fmt(r['classifier_class'], r['n'])} | {_fmt(r['classifier_kind'], r['n'])} | "
                     f"{_fmt(r['engineer_class'], r['engineer_read'])} | {_fmt(r['engineer_kind'], r['engineer_read'])} | "
                     f"{_fmt(r['classifier_class_where_log_shows_it'], r['log_shows_it'])} | "
                     f"{_fmt(r['classifier_kind_where_log_shows_it'], r['log_shows_it'])} |")
    pooled = report["pooled"]
    if pooled.get("n"):
        lines += ["", "## The engineer right, the classifier (blind) wrong", ""]
        lines += [f"- {x['id']}: {x['label']} (classifier: {x['classifier']})"
                  for x in pooled["engineer_right_classifier_wrong"]] or ["- none"]
        lines += ["", "## The classifier (blind) right, the engineer wrong", ""]
        lines += [f"- {x['id']}: {x['label']} (engineer: {x['engineer']})"
                  for x in pooled["classifier_right_engineer_wrong"]] or ["- none"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Classify each blind part with its blind commit (or read the stored verdicts), compare with
    the engineer's reading, print and write the figures. Returns 0."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cached", action="store_true", help="use the verdicts stored in benchmarks/results/failure_blind.json")
    p.add_argument("--no-write", action="store_true")
    a = p.parse_args(argv)
    commits: dict[str, str] = {k: str(v["commit"]) for k, v in (yaml.safe_load(BLIND_FILE.read_text()) or {}).items()}
    if a.cached:
        stored = json.loads((RESULTS / "failure_blind.json").read_text())["blind"]
        blind = {part: stored[part] for part in commits}
    else:
        blind = blind_verdicts(commits)
    flat = {i: v for part in blind.values() for i, v in part["entries"].items()}
    eng_all: dict[str, str] = {}
    parts = {}
    for part in commits:
        entries = load_corpus([part])
        eng = engineer_reads(part)
        eng_all.update(eng)
        parts[part] = compare(entries, flat, eng)
    pooled = compare(load_corpus(list(commits)), flat, eng_all)
    report = {"parts": parts, "pooled": pooled, "blind": blind}
    for part, r in [*parts.items(), ("pooled", pooled)]:
        print(f"{part}: n={r['n']} classifier {_fmt(r['classifier_class'], r['n'])} class, "
              f"{_fmt(r['classifier_kind'], r['n'])} kind; engineer {_fmt(r['engineer_class'], r['engineer_read'])} class, "
              f"{_fmt(r['engineer_kind'], r['engineer_read'])} kind; classifier where the log shows it "
              f"{_fmt(r['classifier_class_where_log_shows_it'], r['log_shows_it'])} class, "
              f"{_fmt(r['classifier_kind_where_log_shows_it'], r['log_shows_it'])} kind")
    if not a.no_write:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "failure_blind.json").write_text(json.dumps(report, indent=1) + "\n")
        (RESULTS / "failure_blind.md").write_text(_md(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
