"""A study lease that works across machines, kept in the study's own storage.

One driver per study, wherever it runs: the lease is a row of the table
``servesweep_study_lease`` in the database Optuna uses (PostgreSQL for a team, the SQLite
file on one machine, where the file lock of :func:`sweeps.store.study.lock_study` stays too).
The row names its holder (host, pid, when it started) and an expiry; the holder renews it
every ``ttl_s / 4`` s (:class:`LeaseKeeper`, a daemon thread) and deletes it when it ends.

Decision: a second driver on a live study **exits 2 naming the holder** (host, pid, since
when, when the lease expires) instead of joining as a cooperating worker. Joining would need
every fail/re-queue decision (stale RUNNING trials, retries, confirmation repeats) to know
which driver owns which trial; refusing keeps the invariant "only the lease holder writes
trial states" trivially true. A crashed driver's lease is taken over once it expires
(``ttl_s``, default 60 s), or at once when the holder is on this host and its process is
gone (pid + process start time, so a reused pid does not count as alive).

All times are the database server's clock (``clock_timestamp()`` / ``julianday('now')``),
so clock skew between driver machines does not move expiries.

Guarded writes: a trial that may have been finished elsewhere (by a driver that took over a
stale lease) is written through :func:`write_unless_finished`, which turns
:class:`optuna.exceptions.UpdateFinishedTrialError` into a logged no-op returning ``False``.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import optuna
import psutil
import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError

from sweeps.errors import ConfigurationError
from sweeps.store.retry import StoreWriteError, brief, retrying

log = logging.getLogger("servesweep")

TABLE = "servesweep_study_lease"
DEFAULT_TTL_S = 60.0  # a killed driver blocks its study at most this long (another host) before takeover

_meta = sa.MetaData()
_lease = sa.Table(
    TABLE, _meta,
    sa.Column("study_name", sa.String(512), primary_key=True),
    sa.Column("holder_id", sa.String(64), nullable=False),  # random per acquire: renew/release only our own
    sa.Column("host", sa.String(255), nullable=False),
    sa.Column("pid", sa.Integer, nullable=False),
    sa.Column("pid_created", sa.Float, nullable=False),  # holder's process start (its host's clock)
    sa.Column("started_at", sa.Float, nullable=False),  # epoch s, database clock
    sa.Column("renewed_at", sa.Float, nullable=False),
    sa.Column("expires_at", sa.Float, nullable=False),
)


@dataclass(frozen=True)
class Holder:
    """Who holds a study's lease. Times are epoch seconds on the database's clock."""

    host: str
    pid: int
    pid_created: float
    started_at: float
    renewed_at: float
    expires_at: float
    holder_id: str = ""

    def describe(self, now: float | None = None) -> str:
        """``host <h> pid <p> since <UTC time>`` (+ when it expires, given the database's ``now``)."""
        since = datetime.fromtimestamp(self.started_at, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        out = f"host {self.host} pid {self.pid} since {since}"
        if now is not None:
            out += f" (renewed {max(0.0, now - self.renewed_at):.0f} s ago, expires in {max(0.0, self.expires_at - now):.0f} s)"
        return out


class LeaseHeld(ConfigurationError, RuntimeError):
    """Another live driver holds the study's lease (``holder``); the driver exits 2."""

    def __init__(self, study: str, holder: Holder, now: float):
        self.study, self.holder = study, holder
        super().__init__(
            f"study {study!r} is being run by another driver: {holder.describe(now)}. Wait for it to finish, "
            f"stop it (kill {holder.pid} on {holder.host}), or run a separate study with study_name=<name>. "
            f"A crashed driver's lease is taken over once it expires.")


class LeaseLost(RuntimeError):
    """Our lease was taken over (it expired: the driver could not renew it in time) or deleted."""


def _db_now(conn: sa.Connection) -> float:
    """The database server's time, epoch seconds."""
    if conn.dialect.name == "sqlite":
        q = "SELECT (julianday('now') - 2440587.5) * 86400.0"
    elif conn.dialect.name == "postgresql":
        q = "SELECT extract(epoch from clock_timestamp())"
    else:  # MySQL and others: a portable form
        q = "SELECT UNIX_TIMESTAMP(NOW(6))"
    return float(conn.execute(sa.text(q)).scalar_one())


def _engine(url: str) -> sa.Engine:
    if url.startswith("sqlite"):
        return sa.create_engine(url, connect_args={"timeout": 30})
    return sa.create_engine(url, pool_pre_ping=True, pool_size=1, max_overflow=1)


def _this_process() -> tuple[str, int, float]:
    return socket.gethostname(), os.getpid(), psutil.Process().create_time()


def _holder_gone(h: Holder) -> bool:
    """True when ``h`` is on this host and its process no longer exists (pid reuse ignored)."""
    if h.host != socket.gethostname():
        return False
    try:
        return abs(psutil.Process(h.pid).create_time() - h.pid_created) > 0.5
    except psutil.NoSuchProcess:
        return True
    except psutil.Error:
        return False


class StudyLease:
    """The lease of one study in the storage at ``url`` (any SQLAlchemy URL Optuna accepts).

    Use: ``lease.acquire()`` before touching the study, ``lease.keep_alive()`` while running,
    ``lease.release()`` at the end (or ``with StudyLease(...) as lease:``).
    """

    def __init__(self, url: str, study: str, ttl_s: float = DEFAULT_TTL_S, engine: sa.Engine | None = None):
        if ttl_s <= 0:
            raise ValueError(f"ttl_s must be > 0, got {ttl_s}")
        self.url, self.study, self.ttl_s = url, study, float(ttl_s)
        self.engine = engine or _engine(url)
        self.holder_id = ""
        self._keeper: LeaseKeeper | None = None

    def _create_table(self) -> None:
        try:
            _meta.create_all(self.engine, checkfirst=True)
        except (IntegrityError, ProgrammingError, OperationalError):
            # two drivers creating it at once on PostgreSQL: the loser sees a duplicate; check again
            time.sleep(0.2)
            _meta.create_all(self.engine, checkfirst=True)

    def holder(self) -> Holder | None:
        """The current holder row (live or expired), or None."""
        self._create_table()
        with self.engine.connect() as c:
            row = c.execute(sa.select(_lease).where(_lease.c.study_name == self.study)).mappings().first()
        return None if row is None else Holder(**{k: row[k] for k in Holder.__dataclass_fields__})

    def acquire(self) -> Holder | None:
        """Take the lease: free, expired, or left by a dead process on this host.

        Returns:
            the previous holder when a stale lease was taken over, else None.
        Raises:
            LeaseHeld: a live driver holds it (the message names host, pid, since when).
        """
        self._create_table()
        host, pid, created = _this_process()
        hid = uuid.uuid4().hex
        with self.engine.begin() as c:
            now = _db_now(c)
            mine = dict(holder_id=hid, host=host, pid=pid, pid_created=created, started_at=now, renewed_at=now,
                        expires_at=now + self.ttl_s)
            try:
                with c.begin_nested():
                    c.execute(_lease.insert().values(study_name=self.study, **mine))
                self.holder_id = hid
                return None
            except IntegrityError:
                pass
            row = c.execute(sa.select(_lease).where(_lease.c.study_name == self.study)).mappings().first()
            old = None if row is None else Holder(**{k: row[k] for k in Holder.__dataclass_fields__})
            if old is not None and old.expires_at > now and not _holder_gone(old):
                raise LeaseHeld(self.study, old, now)
            # conditional on the row we judged stale: of two acquirers racing here, one wins
            cond = _lease.c.holder_id == old.holder_id if old else sa.false()
            n = c.execute(_lease.update().where(_lease.c.study_name == self.study, cond).values(**mine)).rowcount
        if n != 1:
            return self.acquire()  # someone else took it meanwhile: judge the new holder
        self.holder_id = hid
        log.warning("study %r: took over the stale lease of %s", self.study, old.describe(now))
        return old

    def renew(self) -> float:
        """Push the expiry ``ttl_s`` ahead.

        Returns:
            the new expiry (database clock).
        Raises:
            LeaseLost: the lease is no longer ours (taken over after it expired, or deleted).
        """
        with self.engine.begin() as c:
            now = _db_now(c)
            n = c.execute(_lease.update().where(_lease.c.study_name == self.study, _lease.c.holder_id == self.holder_id)
                          .values(renewed_at=now, expires_at=now + self.ttl_s)).rowcount
        if n != 1:
            raise LeaseLost(f"the lease of study {self.study!r} was taken over by another driver: "
                            f"it expired before this driver renewed it (ttl {self.ttl_s:g} s)")
        return now + self.ttl_s

    def release(self) -> bool:
        """Delete our lease row (stopping the keeper first). Returns False when it was not ours any more."""
        if self._keeper:
            self._keeper.stop()
            self._keeper = None
        if not self.holder_id:
            return False
        with self.engine.begin() as c:
            n = c.execute(_lease.delete().where(_lease.c.study_name == self.study,
                                                _lease.c.holder_id == self.holder_id)).rowcount
        self.holder_id = ""
        return n == 1

    def keep_alive(self, interval_s: float | None = None, on_lost: Callable[[str], None] | None = None) -> LeaseKeeper:
        """Start a daemon thread renewing the lease every ``interval_s`` s (default ``ttl_s / 4``)."""
        self._keeper = LeaseKeeper(self, interval_s or self.ttl_s / 4, on_lost)
        self._keeper.start()
        return self._keeper

    def __enter__(self) -> StudyLease:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class LeaseKeeper(threading.Thread):
    """Renews a :class:`StudyLease` in the background.

    A lock/busy error is retried for the store's budget (:func:`sweeps.store.retry.retrying`);
    another database error is retried at the next tick; when no renewal succeeded for ``ttl_s``
    (the lease may have been taken over) or the lease was taken over, ``lost`` is set and
    ``on_lost(reason)`` is called once: the driver must stop submitting and writing trials.
    """

    def __init__(self, lease: StudyLease, interval_s: float, on_lost: Callable[[str], None] | None):
        super().__init__(name=f"lease-{lease.study}", daemon=True)
        self.lease, self.interval_s, self.on_lost = lease, float(interval_s), on_lost
        self.lost = threading.Event()
        self.reason = ""
        self._stop_evt = threading.Event()

    def run(self) -> None:
        last_ok = time.monotonic()
        while not self._stop_evt.wait(self.interval_s):
            try:
                # a locked store is waited out like every store write; nobody can take the lease meanwhile
                retrying(self.lease.renew, f"renew the lease of study {self.lease.study!r}")
                last_ok = time.monotonic()
            except LeaseLost as e:
                self._lose(str(e))
                return
            except StoreWriteError as e:
                self._lose(f"store_unavailable: {e}")
                return
            except sa.exc.SQLAlchemyError as e:
                log.warning("study %r: lease renewal failed (%s); retrying", self.lease.study, brief(e))
                if time.monotonic() - last_ok > self.lease.ttl_s:
                    self._lose(f"the lease of study {self.lease.study!r} could not be renewed for "
                               f"{self.lease.ttl_s:g} s (database unreachable): another driver may have taken it")
                    return

    def _lose(self, reason: str) -> None:
        self.reason = reason
        log.error("%s", reason)
        try:
            if self.on_lost:
                self.on_lost(reason)
        finally:
            self.lost.set()  # last: whoever waits on it sees the callback's effects

    def stop(self) -> None:
        """Stop renewing (the lease stays until released or expired)."""
        self._stop_evt.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout=10)


def _finished_elsewhere(target: Any, trial: Any) -> bool:
    """Whether ``trial`` (a live Trial or number) of study ``target`` is finished in storage."""
    try:
        if isinstance(trial, optuna.trial.Trial):
            return trial.storage.get_trial(trial._trial_id).state.is_finished()
        if isinstance(target, optuna.Study) and isinstance(trial, int):
            return target.trials[trial].state.is_finished() if trial < len(target.trials) else False
    except Exception:  # noqa: BLE001 - a storage error here must not hide the original one
        return False
    return False


def write_unless_finished(fn: Callable[..., Any], *args: Any, what: str = "", **kwargs: Any) -> bool:
    """Call ``fn(*args, **kwargs)`` (``trial.set_user_attr``, ``trial.set_constraint``,
    ``study.tell``, ...) on a trial that may have been finished elsewhere.

    Returns:
        True when the write happened; False when the trial was already finished
        (``UpdateFinishedTrialError``, or ``study.tell``'s ``ValueError`` for a finished trial),
        logged as a warning naming ``what``.
    Raises:
        whatever else ``fn`` raises (a ValueError about a bad value is not swallowed).
    """
    try:
        fn(*args, **kwargs)
        return True
    except optuna.exceptions.UpdateFinishedTrialError as e:
        log.warning("skipped %s: %s (finished by another driver)", what or getattr(fn, "__name__", "write"), e)
        return False
    except ValueError as e:
        trial = args[0] if args else kwargs.get("trial")
        target = getattr(fn, "__self__", None)
        if trial is None or not _finished_elsewhere(target, trial):
            raise
        log.warning("skipped %s: %s (finished by another driver)", what or getattr(fn, "__name__", "write"), e)
        return False
