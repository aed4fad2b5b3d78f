"""The searcher and the runner as parts: one failure-rule path, one backend-kind check, and
the runner's own bookkeeping of launches in flight."""

from __future__ import annotations

import inspect

import pytest
from pydantic import AfterValidator

from sweeps.config.spec import BackendConfig, ConfigError, load_spec
from sweeps.run.executor import InProcessExecutor
from sweeps.run.runner import Runner
from sweeps.search.searcher import Searcher
from tasks.backends import check_kind
from tasks.types import BenchSpec, Timeouts, TrialSpec
from tests.conftest import compose_cfg


def test_learning_a_rule_takes_no_unused_retried_flag():
    """A retried launch and a first one learn the same rule: ``learn`` has no ``retried`` flag to ignore."""
    assert list(inspect.signature(Searcher.learn).parameters) == ["self", "number", "params", "res"]


def test_backend_kind_is_checked_by_check_kind_itself():
    """``backend.kind`` is validated by :func:`tasks.backends.check_kind`, not by a copy of it."""
    assert any(isinstance(m, AfterValidator) and m.func is check_kind
               for m in BackendConfig.model_fields["kind"].metadata)
    with pytest.raises(ConfigError, match=r"backend\.kind.*unknown backend kind 'nope'; available: .*instant"):
        load_spec(compose_cfg(["backend.kind=nope"]))


def test_runner_hands_back_each_launch_with_its_item_and_cancels_none_after_take(tmp_path):
    spec = load_spec(compose_cfg(["backend=instant"]))
    from sweeps.run.preflight import emulator_profile

    runner: Runner[str] = Runner(InProcessExecutor(str(tmp_path)), emulator_profile(spec), retries_transient=1)
    assert runner.slots == 1 and runner.has_room()
    from tasks.backends import get_backend

    params = dict(spec.sweep.baseline)
    argv, env, _ = get_backend("instant").render(params, spec.node.model_dump(), spec.model.model_dump(),
                                                 spec.backend.model_dump())
    ts = TrialSpec(sweep="s", trial_number=0, params=params, argv=argv, env=env, backend="instant", gpus=8,
                   bench=BenchSpec(output_len=8, repeats=1), timeouts=Timeouts())
    h = runner.submit(ts, "s/0/1/0", "baseline")
    assert not runner.has_room() and list(runner.inflight.values()) == ["baseline"]
    (ready,) = runner.wait(timeout=1.0)
    item, res = runner.take(ready)
    assert (item, ready) == ("baseline", h) and res.status == "ok" and not runner.inflight
    assert runner.retry_reason(res, 1) is None and runner.wait(timeout=0.1) == []


class _Clocked:
    """An executor whose launches finish at set times (s after submit); ``cancel`` is recorded."""

    def __init__(self, finish_after: list[float]):
        self.finish_after, self.cancelled, self.slots = list(finish_after), [], len(finish_after)

    def submit(self, spec, profile):
        import time

        return (len(self.finish_after), time.monotonic() + self.finish_after.pop(0))

    def wait(self, handles, timeout):
        import time

        end = time.monotonic() + timeout
        while True:
            ready = [h for h in handles if h[1] <= time.monotonic()]
            if ready or time.monotonic() >= end:
                return ready[:1]
            time.sleep(0.01)

    def cancel(self, handle):
        self.cancelled.append(handle)


@pytest.mark.parametrize("grace_s, cancelled", [(0.0, 2), (0.6, 1)])
def test_cancel_all_spares_the_launches_that_finish_within_the_grace(grace_s, cancelled):
    """A stop's grace lets a launch that is finishing anyway finish uncancelled (a cancel crossing
    a task's completion crashes Ray's driver); the ones still running after it are cancelled."""
    ex = _Clocked([0.2, 60.0])
    runner: Runner[str] = Runner(ex, None, retries_transient=0)
    ts = TrialSpec(sweep="s", trial_number=0, params={}, argv=["true"], env={}, backend="instant", gpus=8,
                   bench=BenchSpec(output_len=8, repeats=1), timeouts=Timeouts())
    quick, slow = runner.submit(ts, "s/0/1/0", "quick"), runner.submit(ts, "s/1/1/0", "slow")
    assert runner.cancel_all(grace_s=grace_s) == cancelled
    assert ex.cancelled == ([quick, slow] if cancelled == 2 else [slow])
    assert sorted(runner.inflight.values()) == ["quick", "slow"]  # still there until taken or dropped


def test_the_drivers_own_raylet_dying_stops_the_sweep_and_a_lost_node_does_not():
    """LocalRayletDiedError (the driver's Ray node is gone) is a sweep-level stop: every later
    launch would fail at once and spend the budget. A worker node's death stays a trial's
    infra failure, retried elsewhere."""
    from ray.exceptions import LocalRayletDiedError, NodeDiedError

    from sweeps.run.cluster import RayUnavailable
    from sweeps.run.executor import collect

    class Raising:
        def __init__(self, e):
            self.e = e

        def result(self, handle):
            raise self.e

    with pytest.raises(RayUnavailable, match="raylet is gone"):
        collect(Raising(LocalRayletDiedError()), object())
    res = collect(Raising(NodeDiedError("node 1 died")), object())
    assert res.status == "infra_error"


def test_a_probe_that_reports_while_the_sweep_stops_is_re_queued_not_kept_as_the_trial():
    """A stopping sweep keeps the result of a trial that finished ok while it drained, never a
    probe's: a probe is only the first step of its trial (an ok probe kept would be a trial with no
    tok/s that counts against the budget and is never benchmarked); a re-question's probe is its
    whole trial and is kept."""
    import dataclasses

    import optuna

    from sweeps.run.runner import InFlight
    from sweeps.search.loop import kept_on_interrupt
    from sweeps.search.probes import A_REQUESTION
    from tasks.types import TrialResult

    study = optuna.create_study()
    ts = TrialSpec(sweep="s", trial_number=0, params={}, argv=["x"], env={}, backend="instant", gpus=8,
                   bench=BenchSpec(output_len=8, repeats=1), timeouts=Timeouts())
    ok, failed = TrialResult(status="ok"), TrialResult(status="failed", failure_class="server_crash")
    full = InFlight(study.ask(), {}, ts, 1)
    probe = InFlight(study.ask(), {}, dataclasses.replace(ts, probe=True), 1)
    requestion = study.ask()
    requestion.set_user_attr(A_REQUESTION, {"rule": 1})
    reprobe = InFlight(requestion, {}, dataclasses.replace(ts, probe=True), 1)
    assert kept_on_interrupt(full, ok) and not kept_on_interrupt(full, failed)
    assert not kept_on_interrupt(probe, ok)
    assert kept_on_interrupt(reprobe, ok)
