"""A server helper that leaves the tree and session (setsid + double fork) is found by the
launch's ``SERVESWEEP_TRIAL`` marker and torn down with the trial."""

from __future__ import annotations

import pytest

from tests.procs import trial_processes
from tests.test_faults import _run, base  # noqa: F401 - base is the module's fixture

pytestmark = pytest.mark.slow  # ~6 s: one real emulated server launch


def test_detached_helper_does_not_survive_teardown(base, tmp_path):  # noqa: F811
    res, _, w = _run(base, tmp_path, "detach_helper")
    assert res.status == "ok", (res.failure_class, res.failure_signature, res.log_tail[-1500:])
    # the watcher saw server + 2 ranks + the detached grandchild (in its own session)
    assert len(w.seen) >= 4, w.seen
    assert w.survivors() == [], w.survivors()
    assert trial_processes(tmp_path) == []
