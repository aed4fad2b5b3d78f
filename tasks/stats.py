"""Small statistics shared by the benchmark client and the instant model."""

from __future__ import annotations

import math
from collections.abc import Iterable


def percentile(values: Iterable[float], q: float, empty: float = math.nan) -> float:
    """The ``q`` quantile (0 <= q <= 1) of ``values`` with linear interpolation between the
    closest ranks (numpy's default ``"linear"`` method); ``empty`` when there are no values.

    Raises:
        ValueError: ``q`` outside [0, 1].
    """
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile q={q} must be in [0, 1]")
    xs = sorted(values)
    if not xs:
        return empty
    k = (len(xs) - 1) * q
    lo = math.floor(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)
