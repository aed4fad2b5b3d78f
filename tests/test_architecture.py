"""The shape of the code: no import cycle among the project's modules (imports inside
functions count), no module in sweeps/ or tasks/ over 400 lines, no function over 80 lines,
and tasks/ (what runs on a GPU node) never imports the driver package sweeps/."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("sweeps", "tasks")
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 80


def _modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for pkg in PACKAGES:
        for p in sorted((ROOT / pkg).rglob("*.py")):
            rel = p.relative_to(ROOT).with_suffix("")
            parts = list(rel.parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = p
    return out


def _resolve(mod: str, node: ast.ImportFrom, is_pkg: bool) -> str:
    if not node.level:
        return node.module or ""
    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def import_graph() -> dict[str, set[str]]:
    """module -> project modules it imports anywhere in its body (functions included)."""
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(mod, node, path.name == "__init__.py")
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            for t in targets:
                # the longest project module that prefixes the import target
                parts = t.split(".")
                for i in range(len(parts), 0, -1):
                    cand = ".".join(parts[:i])
                    if cand in mods:
                        if cand != mod:
                            graph[mod].add(cand)
                        break
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a list of modules (first == last), or None."""
    color: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        color[m] = 1
        stack.append(m)
        for n in sorted(graph.get(m, ())):
            if color.get(n) == 1:
                return stack[stack.index(n):] + [n]
            if color.get(n) is None and (c := visit(n)):
                return c
        stack.pop()
        color[m] = 2
        return None

    for m in sorted(graph):
        if color.get(m) is None and (c := visit(m)):
            return c
    return None


def test_cycle_finder_finds_a_planted_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle_counting_imports_inside_functions():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_graph_counts_imports_made_inside_functions(tmp_path, monkeypatch):
    pkg = tmp_path / "sweeps"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from sweeps import b\n    return b\n")
    (pkg / "b.py").write_text("from . import a\n")
    (tmp_path / "tasks").mkdir()
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    graph = import_graph()
    assert "sweeps.b" in graph["sweeps.a"] and graph["sweeps.b"] == {"sweeps", "sweeps.a"}
    assert find_cycle(graph) == ["sweeps.a", "sweeps.b", "sweeps.a"]


def test_node_side_never_imports_the_driver():
    bad = {m: sorted(d for d in deps if d.split(".")[0] == "sweeps")
           for m, deps in import_graph().items() if m.split(".")[0] == "tasks"}
    bad = {m: d for m, d in bad.items() if d}
    assert not bad, f"tasks/ modules importing sweeps/: {bad}"


@pytest.mark.parametrize("pkg", PACKAGES)
def test_module_and_function_sizes(pkg):
    problems = []
    for path in sorted((ROOT / pkg).rglob("*.py")):
        text = path.read_text()
        n = len(text.splitlines())
        rel = path.relative_to(ROOT)
        if n > MAX_MODULE_LINES:
            problems.append(f"{rel}: {n} lines > {MAX_MODULE_LINES}")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    problems.append(f"{rel}:{node.lineno} {node.name}(): {length} lines > {MAX_FUNCTION_LINES}")
    assert not problems, "\n".join(problems)
