"""docs/architecture.md names only what exists: every dotted ``sweeps.``/``tasks.`` name in
backticks imports (a module, or an attribute of one), every path exists, and its floor table
lists the floors tests/test_architecture.py enforces, in order."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

from tests.test_architecture import FLOORS

DOC = Path(__file__).resolve().parent.parent / "docs" / "architecture.md"


def _resolves(name: str) -> bool:
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def test_every_dotted_name_in_the_map_exists():
    text = DOC.read_text()
    names = set(re.findall(r"\b((?:sweeps|tasks)(?:\.[A-Za-z_]\w*)+)", text))
    missing = sorted(n for n in names if not _resolves(n))
    assert not missing, f"docs/architecture.md names what does not exist: {missing}"


def test_every_path_in_the_map_exists():
    root = DOC.parent.parent
    paths = set(re.findall(r"`((?:sweeps|tasks|conf|tests)/[\w/.<>-]+)`", DOC.read_text()))
    missing = sorted(p for p in paths if "<" not in p and not (root / p.rstrip("/")).exists())
    assert not missing, f"docs/architecture.md names paths that do not exist: {missing}"


def test_the_floor_table_is_the_enforced_order():
    rows = re.findall(r"^\| `(\w+)(?:/|\.py)` \|", DOC.read_text(), re.M)
    assert tuple(rows) == FLOORS
