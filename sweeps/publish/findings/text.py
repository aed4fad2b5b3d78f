"""Small markdown formatting helpers shared by the findings sections."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any


def fmt(v: float | None, nd: int = 1) -> str:
    """``v`` with ``nd`` decimals, or an en dash when missing or not finite."""
    return "–" if v is None or not math.isfinite(v) else f"{v:.{nd}f}"


def cell(s: Any) -> str:
    """``s`` as one markdown table cell (pipes escaped, one line)."""
    return str(s).replace("|", "\\|").replace("\n", " ")


def cfg(params: Mapping[str, Any]) -> str:
    """``k=v, k=v`` in the params' order."""
    return ", ".join(f"{k}={v}" for k, v in params.items())


def trials(ns: Iterable[int], limit: int = 12) -> str:
    """``t1, t4, ...`` (sorted, unique, at most ``limit`` then "(+N more)")."""
    ns = sorted(set(ns))
    s = ", ".join(f"t{n}" for n in ns[:limit])
    return s + (f" (+{len(ns) - limit} more)" if len(ns) > limit else "")


def code(s: str) -> str:
    """``s`` as inline code on one line (double backticks when it holds a backtick)."""
    s = s.replace("\n", " ")
    tick = "``" if "`" in s else "`"
    return f"{tick}{s}{tick}"


def row(cells: Iterable[Any]) -> str:
    """One markdown table row."""
    return "| " + " | ".join(cell(x) for x in cells) + " |"
