"""The study lease (``sweeps.store.lease``) on SQLite and on a real PostgreSQL 15 (tests.team):
two acquirers, expiry takeover, renewal, release, a dead holder on this host, a race of
processes for a stale lease, and guarded writes to trials finished elsewhere."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import time

import optuna
import pytest
import sqlalchemy as sa

from sweeps.store import lease
from tests.conftest import REPO
from tests.team import PG_BIN, Postgres

optuna.logging.set_verbosity(optuna.logging.ERROR)


@pytest.fixture(scope="module")
def pg():
    if not (PG_BIN / "postgres").exists():
        pytest.skip("PostgreSQL 15 not installed (scripts/ci_team_setup.sh)")
    p = Postgres()
    try:
        yield p.start()
    finally:
        p.stop()


_n = iter(range(10_000))


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'optuna.db'}"
    return request.getfixturevalue("pg").url()


@pytest.fixture
def study_name() -> str:
    return f"s{next(_n)}-{time.monotonic_ns()}"


def test_a_second_acquirer_is_refused_naming_the_holder(url, study_name):
    a = lease.StudyLease(url, study_name)
    assert a.acquire() is None
    with pytest.raises(lease.LeaseHeld) as e:
        lease.StudyLease(url, study_name).acquire()
    h = e.value.holder
    assert h.holder_id == a.holder_id
    msg = str(e.value)
    assert f"pid {os.getpid()}" in msg and socket.gethostname() in msg and " since 20" in msg and "expires in" in msg
    # another study is independent
    other = lease.StudyLease(url, study_name + "-other")
    assert other.acquire() is None
    assert a.release() and other.release()


def test_release_lets_the_next_driver_in(url, study_name):
    a = lease.StudyLease(url, study_name)
    a.acquire()
    assert a.release()
    b = lease.StudyLease(url, study_name)
    assert b.acquire() is None
    assert not a.release()  # not ours any more: the new holder's row stays
    assert lease.StudyLease(url, study_name).holder().holder_id == b.holder_id
    b.release()
    assert lease.StudyLease(url, study_name).holder() is None


def _foreign(monkeypatch):
    """Make the next acquire look like it comes from a live process on another machine."""
    monkeypatch.setattr(lease, "_this_process", lambda: ("gpu-host-b", 4242, 1.0))


def test_expired_lease_is_taken_over_and_the_old_holder_learns_it(url, study_name, monkeypatch):
    a = lease.StudyLease(url, study_name, ttl_s=0.5)
    with monkeypatch.context() as m:
        _foreign(m)
        a.acquire()
    with pytest.raises(lease.LeaseHeld, match="host gpu-host-b pid 4242"):
        lease.StudyLease(url, study_name).acquire()  # another host: its pid is not checked locally
    time.sleep(0.7)
    b = lease.StudyLease(url, study_name)
    old = b.acquire()
    assert old is not None and (old.host, old.pid) == ("gpu-host-b", 4242)
    with pytest.raises(lease.LeaseLost, match="taken over"):
        a.renew()
    assert not a.release()
    assert b.holder().holder_id == b.holder_id
    b.release()


def test_renewal_keeps_a_short_lease_alive(url, study_name):
    a = lease.StudyLease(url, study_name, ttl_s=0.8)
    a.acquire()
    first = a.holder().expires_at
    keeper = a.keep_alive(interval_s=0.15)
    time.sleep(1.6)  # two TTLs
    with pytest.raises(lease.LeaseHeld):
        lease.StudyLease(url, study_name).acquire()
    assert a.holder().expires_at > first + 0.6
    assert not keeper.lost.is_set()
    assert a.release()
    assert not keeper.is_alive()


def test_keeper_reports_a_takeover(url, study_name):
    a = lease.StudyLease(url, study_name, ttl_s=5)
    a.acquire()
    reasons: list[str] = []
    keeper = a.keep_alive(interval_s=0.1, on_lost=reasons.append)
    with a.engine.begin() as c:  # what a takeover does to the row
        c.execute(sa.text(f"UPDATE {lease.TABLE} SET holder_id = 'someone-else' WHERE study_name = :s"), {"s": study_name})
    assert keeper.lost.wait(5)
    assert reasons and "taken over" in reasons[0]
    assert not a.release()


def test_a_dead_holder_on_this_host_is_taken_over_at_once(url, study_name):
    code = ("import os, sys; from sweeps.store.lease import StudyLease; "
            "l = StudyLease(sys.argv[1], sys.argv[2], ttl_s=600); l.acquire(); print(os.getpid()); os._exit(0)")
    r = subprocess.run([sys.executable, "-c", code, url, study_name], capture_output=True, text=True, cwd=str(REPO),
                       timeout=60)
    assert r.returncode == 0, r.stderr
    dead_pid = int(r.stdout.strip())
    b = lease.StudyLease(url, study_name)
    old = b.acquire()  # 600 s TTL left, but its process is gone
    assert old is not None and old.pid == dead_pid
    b.release()


def test_processes_racing_for_a_stale_lease_one_wins(url, study_name, monkeypatch):
    with monkeypatch.context() as m:
        _foreign(m)
        lease.StudyLease(url, study_name, ttl_s=0.2).acquire()
    time.sleep(0.4)
    code = ("import sys, time; from sweeps.store.lease import StudyLease, LeaseHeld\n"
            "l = StudyLease(sys.argv[1], sys.argv[2], ttl_s=600); l.holder()\n"
            "time.sleep(max(0, float(sys.argv[3]) - time.time()))\n"
            "try:\n    l.acquire(); print('won')\nexcept LeaseHeld:\n    print('held')\n")
    go = str(time.time() + 3)
    procs = [subprocess.Popen([sys.executable, "-c", code, url, study_name, go], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, cwd=str(REPO)) for _ in range(3)]
    outs = [p.communicate(timeout=90) for p in procs]
    results = sorted(o.strip() for o, _ in outs)
    assert results == ["held", "held", "won"], outs


def test_bad_ttl_is_refused(tmp_path):
    with pytest.raises(ValueError, match="ttl_s"):
        lease.StudyLease(f"sqlite:///{tmp_path / 'x.db'}", "s", ttl_s=0)


def test_guarded_writes_to_a_trial_finished_elsewhere(url, study_name, caplog):
    study = optuna.create_study(study_name=study_name, storage=url)
    live, done = study.ask(), study.ask()
    other = optuna.load_study(study_name=study_name, storage=url)  # the other driver
    other.tell(done.number, state=optuna.trial.TrialState.FAIL)
    with caplog.at_level(logging.WARNING, logger="servesweep"):
        assert not lease.write_unless_finished(done.set_user_attr, "k", 1, what="trial 1 attr")
        assert not lease.write_unless_finished(done.set_constraint, "feasible", 1.0, what="trial 1 constraint")
        assert not lease.write_unless_finished(study.tell, done, 1.0, what="trial 1 tell")
        assert not lease.write_unless_finished(study.tell, done.number, state=optuna.trial.TrialState.PRUNED)
    assert "trial 1 tell" in caplog.text and "finished by another driver" in caplog.text
    assert lease.write_unless_finished(live.set_user_attr, "k", 2)
    assert lease.write_unless_finished(live.set_constraint, "feasible", 0.0)
    with pytest.raises(ValueError):  # a bad value on a live trial is a bug, not a race
        lease.write_unless_finished(study.tell, live, state=optuna.trial.TrialState.RUNNING)
    assert lease.write_unless_finished(study.tell, live, 3.0)
    t = optuna.load_study(study_name=study_name, storage=url).trials
    assert t[0].value == 3.0 and t[0].user_attrs == {"k": 2} and t[1].state == optuna.trial.TrialState.FAIL
    assert "k" not in t[1].user_attrs
