"""The upgrade story (README): the campaign sweep on the emulated node, then
``sweep=recheck source=eagle3_allreduce node=rtx_pro_6000x8_upgraded``: the recheck runs on the
upgraded profile's fingerprint and its findings say which dead ends the upgrade fixed (none:
conf/node/rtx_pro_6000x8_upgraded.yaml cites why each still fails) and whether EAGLE-3 now
beats the baseline."""

from __future__ import annotations

import re
import shutil

import pytest

from sweeps.app.inprocess import InProcessDriver, run_in_process
from sweeps.app.recheck import FIXED, STILL_DEGRADED, STILL_FAILING, RecheckDriver, recheck
from sweeps.config.spec import load_spec
from tests.conftest import compose_cfg

SOURCE = ["backend=instant", "sweep=eagle3_allreduce", "sweep.budget.trials=12", "sweep.budget.wall_time_s=null"]


class _InProcessRecheck(RecheckDriver, InProcessDriver):
    """The recheck driver with the in-process executor (no Ray)."""


def _stores(store) -> list[str]:
    return [f"tracking.store_dir={store}", f"tracking.findings_dir={store / 'findings'}"]


@pytest.fixture(scope="module")
def story(tmp_path_factory):
    root = tmp_path_factory.mktemp("upgrade")
    store = root / "store"
    src = run_in_process(load_spec(compose_cfg([*SOURCE, *_stores(store)])))
    spec = load_spec(compose_cfg([*SOURCE[:2], "sweep=recheck", "source=eagle3_allreduce",
                                  "node=rtx_pro_6000x8_upgraded", *_stores(store)]))
    drv = recheck(spec, _InProcessRecheck)
    yield store, src, drv
    shutil.rmtree(root, ignore_errors=True)


def test_recheck_runs_on_the_upgraded_fingerprint(story):
    _, src, drv = story
    assert drv.fingerprint != src.fingerprint
    assert drv.fingerprint["flashinfer"] == "0.7.2" and drv.fingerprint["cuda"] == "13.0"


def test_no_dead_end_fixed_and_the_findings_say_so(story):
    store, _, drv = story
    outs = [o for o in drv.outcomes() if o.dead_end.kind != "canary"]
    assert {o.dead_end.failure_class for o in outs} >= {
        "flashinfer_allreduce_fusion_unsupported_arch", "torch_symm_mem_unsupported",
        "nccl_env_algo_proto_invalid", "moe_ep_a2a_config_error"}
    # (a silently replaced all-reduce path ran again on the replacement: still degraded, not failing)
    assert all(o.outcome == (STILL_DEGRADED if o.dead_end.failure_class == "allreduce_path_degraded" else STILL_FAILING)
               for o in outs), [(o.dead_end.label, o.outcome) for o in outs]
    assert not any(o.outcome == FIXED for o in drv.outcomes())
    report = (store / "findings" / f"{drv.study_name}.md").read_text()
    assert "Dead ends fixed by the upgrade: none." in report


def test_findings_say_whether_eagle3_beats_the_baseline(story):
    store, _, drv = story
    canary = {o.dead_end.label: o for o in drv.outcomes() if o.dead_end.kind == "canary"}
    base = canary["baseline"]
    spec = canary.get("best speculative") or canary["best"]
    assert spec.dead_end.params["speculative"] == "eagle3" and base.value and spec.value
    report = (store / "findings" / f"{drv.study_name}.md").read_text()
    m = re.search(r"Speculative decoding \(source trial (\d+)\) vs the baseline now: ([\d.]+) vs ([\d.]+) tok/s = "
                  r"([\d.]+)x: (beats|does not beat) the baseline\.", report)
    assert m, report
    assert int(m.group(1)) == spec.dead_end.source_trial
    assert float(m.group(2)) == pytest.approx(spec.value, abs=0.06)
    assert float(m.group(3)) == pytest.approx(base.value, abs=0.06)
    assert (m.group(5) == "beats") == (spec.value > base.value)
