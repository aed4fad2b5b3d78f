"""tasks.stats.percentile: the one percentile helper of the benchmark client and the instant model."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tasks.stats import percentile


@given(st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=50), st.floats(0.0, 1.0))
def test_matches_numpy_linear(xs, q):
    assert percentile(xs, q) == pytest.approx(float(np.percentile(xs, q * 100)), rel=1e-9, abs=1e-6)


def test_edges():
    assert math.isnan(percentile([], 0.5)) and percentile([], 0.99, empty=0.0) == 0.0
    assert percentile([3.0, 1.0, 2.0], 0.5) == 2.0 and percentile([1.0, 2.0], 0.99) == pytest.approx(1.99)
    with pytest.raises(ValueError, match="q=1.5"):
        percentile([1.0], 1.5)
