"""Failure rules: what is known to fail on an environment, shared by every sweep on a storage.

A rule says: on this environment fingerprint (GPU arch, driver, CUDA, NCCL, torch, SGLang,
FlashInfer), for this model (memory classes only), a trial whose *implicated* knob values
(``conf/failure_knobs.yaml``) equal the rule's fails with this class. A later trial that
matches is skipped without GPU time. Rules live in one SQL table
(``servesweep_failure_rules``) in a database given by a SQLAlchemy URL (default: the
SQLite file ``mlflow/servesweep.db`` at the repo root), shared by all sweeps, not per study.

- Only ``deterministic`` classes become rules on the first failure. A ``transient`` class
  becomes a rule only with ``learn(..., force=True)`` (the caller retried once and it
  failed again); such a rule is scoped to that sweep (``scope_sweep``) and only matches
  when ``match(..., sweep=<that sweep>)``. ``infra`` and ``perf`` never become rules.
- ``learn`` is idempotent: the same rule again appends the evidence (sweep, trial number).
- Every rule carries how it was learned (:data:`ORIGINS`: a shipped entry's probe, a probe of
  a risky level, a failed full launch; ``repeated`` once it failed in two trials or more), the
  studies that learned, confirmed or were skipped by it (its age in studies), and when a
  failure last confirmed it. :meth:`RuleStore.retire` marks a rule that a probe passed (the dead
  end no longer reproduces on this fingerprint): it no longer matches; a later failure of the
  same rule revives it. Stores written before these columns existed are migrated on open
  (``ALTER TABLE ADD COLUMN``; old rows read their origin from their evidence).
- After an upgrade the fingerprint hash changes, so old rules stop applying;
  :meth:`RuleStore.all_dead_ends` lists them for a recheck sweep.

Concurrency (:mod:`sweeps.rules.engine`): SQLite gets WAL, a busy timeout and ``BEGIN
IMMEDIATE`` write transactions, so two processes (two sweeps, or a sweep and the CLI) can learn
at once without losing evidence, and reads never wait for a writer; other databases use
``SELECT ... FOR UPDATE``.

What a rule matches on (canonical values, fingerprints, implicated knobs, ``Rule``) is in
``sweeps.rules.match``, re-exported here.

CLI: ``python -m sweeps.rules [--db URL] list|explain ID|forget ID``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import Column, Integer, MetaData, String, Table, Text, inspect, select
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError
from tenacity import Retrying, retry_if_exception_type, stop_after_attempt

from sweeps.rules.engine import READ_ONLY, make_engine
from sweeps.rules.match import (
    DEFAULT_KNOBS_PATH,
    FINGERPRINT_KEYS,
    REPO,
    Rule,
    canon_value,
    canonical_json,
    fingerprint_hash,
    fingerprint_subset,
    implicated_params,
    load_implicated_knobs,
    uses_model,
)
from sweeps.store.retry import StoreWriteError, retrying
from tasks.failures import KIND

__all__ = [
    "DEFAULT_DB_URL",
    "DEFAULT_KNOBS_PATH",
    "FINGERPRINT_KEYS",
    "Rule",
    "RuleStore",
    "canonical_json",
    "fingerprint_hash",
    "fingerprint_subset",
    "implicated_params",
    "load_implicated_knobs",
]

#: Default store: the SQLite file ``mlflow/servesweep.db`` at the repo root (absolute path).
DEFAULT_DB_URL = f"sqlite:///{REPO / 'mlflow' / 'servesweep.db'}"
#: SQLite busy timeout, s: how long a writer waits for another process's transaction.
BUSY_TIMEOUT_S = 30.0
TABLE_NAME = "servesweep_failure_rules"

_metadata = MetaData()
_rules = Table(
    TABLE_NAME, _metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("rule_key", String(64), nullable=False, unique=True),
    Column("fingerprint_hash", String(64), nullable=False, index=True),
    Column("fingerprint", Text, nullable=False),
    Column("model", String(512), nullable=True),
    Column("knobs", Text, nullable=False),
    Column("failure_class", String(128), nullable=False),
    Column("kind", String(32), nullable=False),
    Column("signature", Text, nullable=False),
    Column("evidence", Text, nullable=False),
    Column("scope_sweep", String(512), nullable=True),
    Column("created_at", String(40), nullable=False),
    Column("updated_at", String(40), nullable=False),
    Column("hits", Integer, nullable=False, default=0),
    # evidence columns (nullable: added to older stores by _migrate)
    Column("origin", String(32), nullable=True),
    Column("studies", Text, nullable=True),
    Column("last_confirmed", String(40), nullable=True),
    Column("retired_at", String(40), nullable=True),
    Column("retired_evidence", Text, nullable=True),
)
#: columns added after the first schema: (name, SQL type) for ``ALTER TABLE ADD COLUMN``
_ADDED_COLUMNS = (("origin", "VARCHAR(32)"), ("studies", "TEXT"), ("last_confirmed", "VARCHAR(40)"),
                  ("retired_at", "VARCHAR(40)"), ("retired_evidence", "TEXT"))
#: how a rule was first learned: a probe sent by a shipped entry (conf/knowledge), a probe of a
#: risky level or a re-question, a failed full launch
ORIGINS = ("shipped", "probe", "launch")


def _origin_of(evidence: list[dict[str, Any]]) -> str:
    """The origin an old row (no ``origin`` column) had: read from its first evidence."""
    first = evidence[0] if evidence else {}
    if first.get("shipped"):
        return "shipped"
    return "probe" if first.get("probe") else "launch"


def _row_to_rule(r: Any) -> Rule:
    evidence = json.loads(r.evidence)
    studies = json.loads(r.studies) if r.studies else sorted({str(e["sweep"]) for e in evidence if e.get("sweep")})
    return Rule(id=r.id, fingerprint_hash=r.fingerprint_hash, fingerprint=json.loads(r.fingerprint), model=r.model,
                knobs=json.loads(r.knobs), failure_class=r.failure_class, kind=r.kind, signature=r.signature,
                evidence=evidence, scope_sweep=r.scope_sweep, created_at=r.created_at,
                updated_at=r.updated_at, hits=int(r.hits or 0), origin=r.origin or _origin_of(evidence),
                studies=studies, last_confirmed=r.last_confirmed or r.updated_at, retired_at=r.retired_at,
                retired_evidence=json.loads(r.retired_evidence) if r.retired_evidence else None)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


# ----------------------------------------------------------------------------- store
class RuleStore:
    """The failure-rules table behind a SQLAlchemy URL (created on first use).

    Args:
        url: SQLAlchemy URL, e.g. ``sqlite:////abs/path/servesweep.db`` or a PostgreSQL URL;
            default :data:`DEFAULT_DB_URL`.
        knobs_path: ``conf/failure_knobs.yaml``-style mapping used when ``learn`` gets no
            ``mapping``.
    Raises:
        sqlalchemy.exc.SQLAlchemyError: the database cannot be opened or created.
        sweeps.store.retry.StoreWriteError: another writer held it locked past the retry budget.

    Reads take no write lock; writes (``learn``, ``forget``, hit counts) take it up front
    and retry a lock for :data:`sweeps.store.retry.RETRY_S`.
    """

    def __init__(self, url: str | None = None, knobs_path: str | Path = DEFAULT_KNOBS_PATH) -> None:
        self.url = url or DEFAULT_DB_URL
        self.engine, self._sqlite = make_engine(self.url, BUSY_TIMEOUT_S)
        self._knobs_path = Path(knobs_path)
        self._mapping: dict[str, list[str]] | None = None
        retrying(self._create_schema, f"create the rules table in {self.url}")

    def _create_schema(self) -> None:
        with self._read() as conn:
            insp = inspect(conn)
            if insp.has_table(_rules.name):
                have = {c["name"] for c in insp.get_columns(_rules.name)}
                missing = [(n, t) for n, t in _ADDED_COLUMNS if n not in have]
                if not missing:
                    return  # nothing to write: no write lock to wait for
            else:
                missing = None
        with self._tx() as conn:
            if missing is None:
                _metadata.create_all(conn, checkfirst=True)
                return
            have = {c["name"] for c in inspect(conn).get_columns(_rules.name)}  # another process may have migrated
            for name, sql_type in missing:
                if name not in have:
                    conn.exec_driver_sql(f"ALTER TABLE {TABLE_NAME} ADD COLUMN {name} {sql_type}")

    # -- plumbing
    @contextmanager
    def _tx(self) -> Iterator[Connection]:
        with self.engine.begin() as conn:
            yield conn

    def _write(self, stmt: Any, what: str) -> int:
        """Run one write statement in its own transaction, retrying a lock; its rowcount."""
        def run() -> int:
            with self._tx() as conn:
                return int(conn.execute(stmt).rowcount)
        return retrying(run, what)

    @contextmanager
    def _read(self) -> Iterator[Connection]:
        with self.engine.connect() as conn:
            conn.execution_options(**{READ_ONLY: True})
            yield conn

    def _select(self, *where: Any) -> Any:
        q = select(_rules).where(*where)
        return q if self._sqlite else q.with_for_update()

    @property
    def mapping(self) -> dict[str, list[str]]:
        """The class -> implicated knobs mapping from ``knobs_path`` (loaded once)."""
        if self._mapping is None:
            self._mapping = load_implicated_knobs(self._knobs_path)
        return self._mapping

    def close(self) -> None:
        """Release the connection pool."""
        self.engine.dispose()

    # -- writing
    def learn(self, fingerprint: Mapping[str, Any], model: str, params: Mapping[str, Any], failure_class: str,
              signature: str, evidence: Mapping[str, Any], *, force: bool = False,
              mapping: Mapping[str, list[str]] | None = None, origin: str | None = None) -> Rule | None:
        """Record that a trial failed with ``failure_class``; returns the (new or merged) rule.

        Args:
            fingerprint: the environment fingerprint the trial ran on.
            model: model name; stored only for classes whose mapping lists ``model``.
            params: the trial's knob values.
            failure_class: canonical class id.
            signature: the normalized failure signature (kept from the first failure).
            evidence: ``{"sweep": str, "trial_number": int, ...}``; appended once per
                (sweep, trial_number).
            force: make a ``transient`` class a rule (call only after a retry also failed);
                the rule is scoped to ``evidence["sweep"]``.
            origin: how it was learned (:data:`ORIGINS`); default: ``shipped`` when the
                evidence names ``shipped`` entries, ``probe`` when it has ``probe``, else ``launch``.
                Kept from the first failure; a later one adds evidence and confirms it.
            mapping: class -> implicated knobs (default: the store's ``knobs_path``).
        Returns:
            The rule, or None when the class's kind does not make rules (transient without
            ``force``, infra, perf).
        Raises:
            ValueError: unknown class or origin, or a fingerprint without any :data:`FINGERPRINT_KEYS`.
            sqlalchemy.exc.IntegrityError: three concurrent inserts of the same rule in a row.
            sweeps.store.retry.StoreWriteError: the rules DB stayed locked for the retry budget.
        """
        kind = KIND.get(failure_class)
        if kind is None:
            raise ValueError(f"{failure_class!r} is not a canonical failure class")
        if not (kind == "deterministic" or (kind == "transient" and force)):
            return None
        m = self.mapping if mapping is None else mapping
        fp_hash = fingerprint_hash(fingerprint)
        knobs = implicated_params(failure_class, params, m, signature)
        model_key = str(model) if uses_model(failure_class, m) else None
        scope = str(evidence.get("sweep")) if kind != "deterministic" and evidence.get("sweep") is not None else None
        key = hashlib.sha256(canonical_json([fp_hash, model_key, failure_class, knobs, scope]).encode()).hexdigest()
        ev = canon_value(dict(evidence))
        origin = origin or _origin_of([ev])
        if origin not in ORIGINS:
            raise ValueError(f"origin {origin!r} is not one of {ORIGINS}")
        values = {"rule_key": key, "fingerprint_hash": fp_hash, "fingerprint": canonical_json(fingerprint_subset(fingerprint)),
                  "model": model_key, "knobs": canonical_json(knobs), "failure_class": failure_class, "kind": kind,
                  "signature": signature or "", "scope_sweep": scope, "origin": origin}
        # Another process may insert the same rule between our SELECT and INSERT (a unique-key
        # IntegrityError): retry, and the next attempt merges into its row.
        for attempt in Retrying(stop=stop_after_attempt(3), retry=retry_if_exception_type(IntegrityError), reraise=True):
            with attempt:
                rid = retrying(lambda: self._upsert(values, ev), f"record the {failure_class} rule")  # lock/busy
        return self.get(rid)

    def _upsert(self, values: dict[str, Any], ev: dict[str, Any]) -> int:
        """Insert the rule ``values`` with evidence ``ev``, or append ``ev`` to the existing row; its id."""
        with self._tx() as conn:
            row = conn.execute(self._select(_rules.c.rule_key == values["rule_key"])).first()
            now = _now()
            study = [str(ev["sweep"])] if ev.get("sweep") is not None else []
            if row is None:
                res = conn.execute(_rules.insert().values(**values, evidence=canonical_json([ev]), created_at=now,
                                                          updated_at=now, hits=0, studies=canonical_json(study),
                                                          last_confirmed=now))
                return int(res.inserted_primary_key[0])
            evs = json.loads(row.evidence)
            if not any(e.get("sweep") == ev.get("sweep") and e.get("trial_number") == ev.get("trial_number")
                       for e in evs):
                evs.append(ev)
                old = _row_to_rule(row)
                # a failure again: more evidence, confirmed now, and a retired rule is alive again
                conn.execute(_rules.update().where(_rules.c.id == int(row.id))
                             .values(evidence=canonical_json(evs), updated_at=now, last_confirmed=now,
                                     studies=canonical_json(sorted(set(old.studies) | set(study))),
                                     origin=old.origin, retired_at=None, retired_evidence=None))
            return int(row.id)

    def retire(self, rule_id: int, evidence: Mapping[str, Any]) -> Rule | None:
        """Mark a rule retired: a probe of its knobs passed on its fingerprint (the dead end no
        longer reproduces), so it stops matching. ``evidence``: the probe's facts (``sweep``,
        ``trial_number``, ``gpu_s``, ...). Returns the updated rule, None when there is no such rule.

        Raises:
            sweeps.store.retry.StoreWriteError: the rules DB stayed locked for the retry budget.
        """
        rule = self.get(rule_id)
        if rule is None:
            return None
        studies = sorted(set(rule.studies) | ({str(evidence["sweep"])} if evidence.get("sweep") else set()))
        self._write(_rules.update().where(_rules.c.id == int(rule_id))
                    .values(retired_at=_now(), retired_evidence=canonical_json(dict(evidence)),
                            studies=canonical_json(studies)), f"retire rule {rule_id}")
        return self.get(rule_id)

    def forget(self, rule_id: int) -> bool:
        """Delete a rule; True when it existed."""
        return self._write(_rules.delete().where(_rules.c.id == int(rule_id)), f"forget rule {rule_id}") > 0

    def record_hit(self, rule_id: int, sweep: str | None = None) -> None:
        """Count one trial skipped by a rule; ``sweep`` (the study skipping) joins its studies."""
        values: dict[str, Any] = {"hits": _rules.c.hits + 1}
        if sweep is not None:
            rule = self.get(rule_id)
            if rule is not None and sweep not in rule.studies:
                values["studies"] = canonical_json(sorted({*rule.studies, sweep}))
        self._write(_rules.update().where(_rules.c.id == int(rule_id)).values(**values),
                    f"count a skip by rule {rule_id}")

    # -- reading
    def match(self, fingerprint: Mapping[str, Any], model: str, params: Mapping[str, Any], *,
              sweep: str | None = None, record_hit: bool = True) -> Rule | None:
        """The oldest rule that matches a trial, or None.

        A rule matches when it is not retired, the fingerprint hash is equal, its model is None
        or ``model``, its scope is None or ``sweep``, and every implicated knob value equals the trial's.

        Args:
            fingerprint / model / params: the trial's environment, model and knob values.
            sweep: the sweep (study) asking; forced (transient) rules apply only to theirs.
            record_hit: count the skip in ``hits`` (the caller is about to skip the trial).
        """
        try:
            fp_hash = fingerprint_hash(fingerprint)
        except ValueError:
            return None
        for rule in self.rules_for_fingerprint(fingerprint):
            if rule.applies_to(fp_hash, model, params, sweep):
                if record_hit:
                    self.record_hit(rule.id, sweep)
                    return self.get(rule.id)
                return rule
        return None

    def get(self, rule_id: int) -> Rule | None:
        """The rule with this id, or None."""
        with self._read() as conn:
            row = conn.execute(select(_rules).where(_rules.c.id == int(rule_id))).first()
        return _row_to_rule(row) if row is not None else None

    def list(self, *, fingerprint: Mapping[str, Any] | None = None, failure_class: str | None = None,
             model: str | None = None) -> list[Rule]:
        """Rules ordered by id, optionally only one fingerprint / class / model (model None = any)."""
        where = []
        if fingerprint is not None:
            where.append(_rules.c.fingerprint_hash == fingerprint_hash(fingerprint))
        if failure_class is not None:
            where.append(_rules.c.failure_class == failure_class)
        if model is not None:
            where.append(_rules.c.model == model)
        with self._read() as conn:
            rows = conn.execute(select(_rules).where(*where).order_by(_rules.c.id)).all()
        return [_row_to_rule(r) for r in rows]

    def rules_for_fingerprint(self, fingerprint: Mapping[str, Any], *, retired: bool = False) -> list[Rule]:
        """The rules learned on this environment that still apply (``retired=True``: retired
        ones too), ordered by id ([] for an empty fingerprint)."""
        try:
            rules = self.list(fingerprint=fingerprint)
        except ValueError:
            return []
        return rules if retired else [r for r in rules if r.retired_at is None]

    def all_dead_ends(self, sweep: str | None = None, *,
                      exclude_fingerprint: Mapping[str, Any] | None = None) -> list[Rule]:
        """Rules to re-check after an upgrade, ordered by id.

        Args:
            sweep: only rules with evidence from this sweep (None: every rule).
            exclude_fingerprint: leave out rules of this environment (the current one: they
                still apply, re-trying them would only fail again).
        """
        rules = self.list()
        if sweep is not None:
            rules = [r for r in rules if any(e.get("sweep") == sweep for e in r.evidence)]
        if exclude_fingerprint is not None:
            h = fingerprint_hash(exclude_fingerprint)
            rules = [r for r in rules if r.fingerprint_hash != h]
        return rules


# ----------------------------------------------------------------------------- CLI
def _fmt_row(r: Rule) -> str:
    knobs = ",".join(f"{k}={v}" for k, v in r.knobs.items())
    status = f"retired {r.retired_at}" if r.retired_at else "active"
    return (f"{r.id}\t{r.failure_class}\t{r.kind}\t{r.model or '-'}\t{knobs}\t{len(r.evidence)}\t{r.hits}\t"
            f"{r.fingerprint_hash[:12]}\t{r.scope_sweep or '-'}\t{r.learned_how}\t{len(r.studies)}\t"
            f"{r.last_confirmed or '-'}\t{status}")


def main(argv: Iterable[str] | None = None) -> int:
    """``python -m sweeps.rules [--db URL] list|explain ID|forget ID``; 0 ok, 1 no such rule or a
    store it cannot write, 2 an unknown ``--node`` profile."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--db", dest="db_sub", default=None, help="SQLAlchemy URL of the rules store")
    p = argparse.ArgumentParser(prog="python -m sweeps.rules", description="Inspect and edit servesweep failure rules.")
    p.add_argument("--db", default=None, help=f"SQLAlchemy URL (default {DEFAULT_DB_URL})")
    sub = p.add_subparsers(dest="cmd", required=True)
    ls = sub.add_parser("list", parents=[common], help="list rules (tab-separated)")
    ls.add_argument("--class", dest="failure_class", default=None)
    ls.add_argument("--node", default=None, help="the learned rules on conf/node/NODE.yaml's fingerprint and the "
                                              "shipped knowledge for that node only")
    for name, help_ in (("explain", "show one rule in full"), ("forget", "delete one rule")):
        sp = sub.add_parser(name, parents=[common], help=help_)
        sp.add_argument("id", type=int)
    a = p.parse_args(list(argv) if argv is not None else None)
    try:
        return _run_cli(a)
    except FileNotFoundError as e:  # --node NAME without conf/node/NAME.yaml: the message lists the profiles
        print(f"servesweep.rules: {e}", file=sys.stderr)
        return 2
    except StoreWriteError as e:
        print(f"servesweep.rules: {e}; nothing was changed. Run it again once the other writer is done.",
              file=sys.stderr)
        return 1
    except BrokenPipeError:
        # the reader went away (``list | head``): what it read is complete, no traceback; stdout is
        # pointed at devnull so the interpreter's final flush does not raise again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _node_hash(name: str) -> str | None:
    """The fingerprint hash of ``conf/node/<name>.yaml`` (what its sweeps' rules carry); None
    for a profile that declares no fingerprint (``local_cpu``: read from the machine at run time),
    whose learned rules cannot be told apart: all are listed, and stderr says so.

    Raises:
        FileNotFoundError: no such node profile."""
    from sweeps.rules.match import fingerprint_hash, fingerprint_subset
    from sweeps.rules.shipped import node_conf

    _, fp = node_conf(name)
    if not fingerprint_subset(fp):
        print(f"servesweep.rules: --node {name} declares no fingerprint (the machine's is read at run time): "
              "every learned rule is listed", file=sys.stderr)
        return None
    return fingerprint_hash(fp)


def _run_cli(a: argparse.Namespace) -> int:
    store = RuleStore(a.db_sub or a.db or DEFAULT_DB_URL)
    try:
        if a.cmd == "list":
            from sweeps.rules.shipped import shipped_lines

            print("id\tclass\tkind\tmodel\tknobs\tevidence\thits\tfingerprint\tscope\tlearned\tage_studies\t"
                  "last_confirmed\tstatus")
            on = _node_hash(a.node) if a.node else None
            for r in store.list(failure_class=a.failure_class):
                if on is None or r.fingerprint_hash == on:
                    print(_fmt_row(r))
            print("\n" + "\n".join(shipped_lines(a.node)))  # apart: after a blank line
            return 0
        rule = store.get(a.id)
        if rule is None:
            print(f"servesweep.rules: no rule {a.id} in {store.url}; 'python -m sweeps.rules list' shows the ids",
                  file=sys.stderr)
            return 1
        if a.cmd == "explain":
            print(rule.explain())
            return 0
        store.forget(a.id)
        print(f"forgot rule {a.id}: {rule.failure_class} when {canonical_json(rule.knobs)}")
        return 0
    finally:
        store.close()


if __name__ == "__main__":
    sys.exit(main())
