"""Sweeps on a Ray cluster (``ray.address=<addr>``): a ``ray.cluster_utils.Cluster`` with two
fake 8-GPU nodes, started by this test; each sweep's driver runs in a subprocess (one
``ray.init`` per process) that joins it.

Token authentication (Ray >= 2.59 enables it by default for local clusters): the driver
subprocess needs the cluster's token. Ray reads it from ``RAY_AUTH_TOKEN``, then
``RAY_AUTH_TOKEN_PATH``, then ``~/.ray/auth_token``; the head started here writes the
default file and the subprocess inherits ``HOME``, so nothing else is needed on one machine.

Checked: TP=4 trials pack two per 8-GPU node and spread over both nodes (each result
records its node and 4 GPU ids); pinning by a custom resource keeps every trial on the
node that has it; a resource no node has is refused at once; removing a node mid-trial is
an infrastructure failure, the trial re-runs on the other node and the sweep finishes.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import optuna
import psutil
import pytest

from sweeps.store import records
from tests.conftest import REPO
from tests.procs import trial_processes
from tests.waiting import wait_for

pytestmark = pytest.mark.slow

ray_cluster_utils = pytest.importorskip("ray.cluster_utils")

EMU = ["backend.emulator.time_scale=0.002", "bench.repeats=2", "bench.warmup_output_len=4"]
# TP=4 needs a model whose experts fit 4 x 96 GB: a quarter of Kimi-K2.5's 384 experts
TP4 = ["backend.tp_size=4", "model.emulator.num_experts=96"]
MB = 1024 * 1024


@pytest.fixture(scope="module")
def cluster():
    c = ray_cluster_utils.Cluster(
        initialize_head=True,
        head_node_args={"num_gpus": 8, "num_cpus": 2, "object_store_memory": 80 * MB, "include_dashboard": False},
    )
    b = c.add_node(num_gpus=8, num_cpus=1, resources={"pool_b": 8}, object_store_memory=80 * MB)
    c.wait_for_nodes()
    try:
        yield c, c.head_node.node_id, b
    finally:
        c.shutdown()


def _cmd(addr: str, store: Path, extra: list[str]) -> list[str]:
    return [sys.executable, str(REPO / "run_sweep.py"), "sweep=smoke", f"ray.address={addr}",
            f"tracking.store_dir={store}", f"tracking.findings_dir={store / 'findings'}", *extra]


def _sweep(addr: str, store: Path, extra: list[str], timeout: float = 240) -> subprocess.CompletedProcess:
    r = subprocess.run(_cmd(addr, store, extra), cwd=str(store.parent), capture_output=True, text=True,
                       timeout=timeout)
    return r


def _study(store: Path) -> optuna.Study:
    return optuna.load_study(study_name="smoke", storage=f"sqlite:///{store / 'optuna.db'}")


def _records(store: Path) -> list[records.TrialRecord]:
    study = _study(store)
    return records.load_records(study)


def _result(store: Path, number: int) -> dict:
    return json.loads((records.trial_dir(store, "smoke", number) / "result.json").read_text())


def _node_id(rec_node: str) -> str:
    return rec_node.rsplit("/", 1)[-1]


def test_tp4_trials_pack_two_per_node_and_spread(cluster, tmp_path):
    c, head_id, b = cluster
    store = tmp_path / "store"
    r = _sweep(c.address, store, [*EMU, *TP4, "bench.output_len=64", "sweep.budget.trials=4"])
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    assert "4 trial slot(s) over 2 node(s)" in out  # 2 nodes x (8 GPUs // TP 4)
    launched = [x for x in _records(store) if x.launched]
    assert len(launched) >= 4
    nodes = {_node_id(x.node) for x in launched}
    assert nodes == {head_id[:12], b.node_id[:12]}, nodes
    for x in launched:
        gpus = _result(store, x.number)["gpu_ids"]
        assert len(set(gpus)) == 4 and set(gpus) <= set(range(8)), (x.number, gpus)


def test_pinning_by_custom_resource(cluster, tmp_path):
    c, head_id, b = cluster
    store = tmp_path / "store"
    r = _sweep(c.address, store, ["backend=instant", *TP4, "sweep.budget.trials=4", "+ray.resources.pool_b=1"])
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    assert "2 trial slot(s) over 1 node(s)" in out  # only node b has pool_b; 8 GPUs // 4
    launched = [x for x in _records(store) if x.launched]
    assert launched and {_node_id(x.node) for x in launched} == {b.node_id[:12]}


def test_a_resource_no_node_has_is_refused(cluster, tmp_path):
    c, _, _ = cluster
    t0 = time.monotonic()
    r = _sweep(c.address, tmp_path / "store", ["backend=instant", "+ray.resources.pool_z=1"], timeout=120)
    assert r.returncode == 1
    assert "no node of the Ray cluster can run a trial" in r.stderr and "pool_z=1" in r.stderr, r.stderr[-2000:]
    assert time.monotonic() - t0 < 90  # refused, not queued forever


def _running(store: Path) -> int:
    try:
        with sqlite3.connect(str(store / "optuna.db"), timeout=1) as con:
            return con.execute("select count(*) from trials where state='RUNNING'").fetchone()[0]
    except sqlite3.Error:
        return 0


def _servers(store: Path) -> list[psutil.Process]:
    return trial_processes(store)


def test_node_removed_mid_trial_reruns_elsewhere(cluster, tmp_path):
    """Runs last: it removes node b. Two TP=8 trials run, one per node; b goes away."""
    c, head_id, b = cluster
    store = tmp_path / "store"
    log = tmp_path / "sweep.log"
    with open(log, "w") as f:
        # full launches only (no level seeded, so no probe: a probe is over before b can go)
        full_only = ["sweep.params.allreduce.choices=[nccl]", "sweep.seed_each_level_of=[]"]
        proc = subprocess.Popen(_cmd(c.address, store, [*EMU, *full_only, "bench.output_len=300", "sweep.budget.trials=3"]),
                                cwd=str(tmp_path), stdout=f, stderr=subprocess.STDOUT)
    try:
        def two_serving() -> bool:
            assert proc.poll() is None, log.read_text()[-3000:]
            servers = {p.pid for p in _servers(store) if "tasks.emulator.server" in " ".join(p.cmdline())}
            return _running(store) >= 2 and len(servers) >= 2

        # two trials running with their servers up: one of them is on b (each holds 8 GPUs)
        wait_for(two_serving, 180, what=lambda: log.read_text()[-3000:])
        c.remove_node(b)
        proc.wait(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    out = log.read_text()
    assert proc.returncode == 0, out[-4000:]
    assert "infrastructure failure (node_lost)" in out, out[-4000:]
    recs = _records(store)
    assert not [x for x in recs if x.state == "RUNNING"]
    # the lost launch may have been the trial's probe launch (dummy weights) or its full launch
    probes = {t.number: t.user_attrs.get("probe") or {} for t in _study(store).get_trials(deepcopy=False)}
    retried = [x for x in recs if x.attempts >= 2 or probes[x.number].get("attempts", 1) >= 2]
    assert retried, [(x.number, x.attempts, x.status, probes[x.number]) for x in recs]
    for x in retried:  # re-ran on the surviving node and finished as a normal trial
        assert _node_id(x.node) == head_id[:12] and x.status in ("ok", "failed"), x
        d = records.trial_dir(store, "smoke", x.number)
        assert (d / "server.attempt1.log").exists() or (d / "server.probe.attempt1.log").exists(), sorted(d.iterdir())
    wait_for(lambda: _servers(store) == [], 20, what="the trials' servers to exit")
