"""``bench.max_repeat_cv`` reaches the node and decides when repeats are too spread to trust."""

from __future__ import annotations

from sweeps.config.spec import load_spec
from tasks.backends.sglang.client import RequestRecord
from tasks.quality import UNSTABLE, tag_quality
from tests.conftest import compose_cfg


def _records(rates):
    """Single-stream records (as tasks.backends.sglang.client.RequestRecord.to_dict) decoding at ``rates`` tok/s."""
    out = []
    for r in rates:
        rec = RequestRecord(t_send=0.0, chunk_times=[0.1 + i / r for i in range(9)], chunk_tokens=list(range(1, 10)),
                            completion_tokens=9)
        out.append(rec.to_dict())
    return out


def test_max_repeat_cv_reaches_the_bench_spec():
    assert load_spec(compose_cfg([])).bench_spec().max_repeat_cv == 0.10
    assert load_spec(compose_cfg(["bench.max_repeat_cv=0.3"])).bench_spec().max_repeat_cv == 0.3


def test_the_threshold_decides_unstable():
    recs = _records([80.0, 100.0, 120.0])  # cv ~0.2
    for max_cv, unstable in ((0.1, True), (0.5, False)):
        metrics, tags = {}, []
        tag_quality(metrics, recs, tags, max_cv=max_cv)
        assert (UNSTABLE in tags) is unstable, (max_cv, metrics)
