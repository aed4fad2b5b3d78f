"""The shape of the code: no import cycle among the project's modules (imports inside
functions count); sweeps/ is built in floors (errors -> config -> store -> rules -> run ->
search -> publish -> app), each importing only floors below it, at most 8 deep; tasks/ (what runs
on a GPU node) never imports the driver package sweeps/; and tasks/backends/ is the only place
that names a backend kind (everything else reads the Backend's declarations). Module and function
sizes are not checked: a size is a smell to look at, never a reason to squeeze a docstring."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("sweeps", "tasks")
#: The floors of sweeps/, lowest first: a module may import its own floor and those below.
FLOORS = ("errors", "config", "store", "rules", "run", "search", "publish", "app")
#: Command-line entry points at the top of sweeps/: they may import any floor; nothing imports them.
ENTRY_POINTS = ("sweeps.report", "sweeps.ui")
MAX_FLOORS = 8


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


def floor_of(mod: str) -> str | None:
    """The floor of a sweeps/ module (``sweeps.store.study`` -> ``store``); None for the package
    itself and the entry points."""
    parts = mod.split(".")
    if parts[0] != "sweeps" or len(parts) == 1 or mod in ENTRY_POINTS:
        return None
    return parts[1]


def floor_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """floor -> the floors its modules import (itself excluded)."""
    out: dict[str, set[str]] = {}
    for mod, deps in graph.items():
        if (f := floor_of(mod)) is None:
            continue
        out.setdefault(f, set()).update(g for d in deps if (g := floor_of(d)) not in (None, f))
    return out


def depth(graph: dict[str, set[str]]) -> int:
    """The number of floors on the longest import chain of an acyclic ``graph`` (a lone node is 1)."""
    memo: dict[str, int] = {}

    def d(n: str) -> int:
        if n not in memo:
            memo[n] = 1 + max((d(m) for m in graph.get(n, ())), default=0)
        return memo[n]

    return max((d(n) for n in graph), default=0)


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """``a -> b`` for every import of a higher floor, or of an entry point, by a sweeps/ module."""
    bad = []
    for mod, deps in sorted(graph.items()):
        if (f := floor_of(mod)) is None:
            continue
        for dep in sorted(deps):
            g = floor_of(dep)
            if dep in ENTRY_POINTS or (g is not None and FLOORS.index(g) > FLOORS.index(f)):
                bad.append(f"{mod} -> {dep}")
    return bad


def test_every_sweeps_module_has_a_floor():
    mods = [m for m in import_graph() if m.split(".")[0] == "sweeps" and m != "sweeps" and m not in ENTRY_POINTS]
    stray = [m for m in mods if floor_of(m) not in FLOORS]
    assert not stray, f"modules outside the floors {FLOORS}: {stray} (move each to the floor it belongs to)"


def test_no_floor_imports_a_floor_above_it():
    assert not upward_imports(import_graph()), "\n".join(upward_imports(import_graph()))


def test_import_depth_is_at_most_eight_floors():
    fg = floor_graph(import_graph())
    assert find_cycle(fg) is None
    assert depth(fg) <= MAX_FLOORS, f"{depth(fg)} floors: {fg}"


def test_layering_checks_find_a_planted_upward_import():
    graph = {"sweeps.config.spec": {"sweeps.search.loop"}, "sweeps.search.loop": {"sweeps.config.spec"},
             "sweeps.store.study": {"sweeps.report"}}
    assert upward_imports(graph) == ["sweeps.config.spec -> sweeps.search.loop", "sweeps.store.study -> sweeps.report"]
    assert depth({"a": {"b"}, "b": {"c"}, "c": set()}) == 3


#: Where a backend kind's name may appear outside tasks/backends/ as a string literal, and
#: why it is not a question "which backend is it?" (file or folder -> (literals, reason)).
KIND_LITERALS_ALLOWED: dict[str, tuple[frozenset[str], str]] = {
    "tasks/emulator/": (frozenset({"sglang"}), "the emulated engine itself: it speaks SGLang's flags and API"),
    "tasks/load_client.py": (frozenset({"sglang"}), "the name of SGLang's native HTTP API (Api), not a backend"),
    "tasks/bench_cli.py": (frozenset({"sglang"}), "the --api choice naming that HTTP API"),
    "tasks/fingerprint.py": (frozenset({"sglang", "vllm"}), "fingerprint fields named after the engines' packages "
                             "(the node side cannot ask the backends: tasks.backends.base imports it)"),
    "tasks/types.py": (frozenset({"emulated"}), "TrialSpec's default backend kind (a dataclass default)"),
    "tasks/failure_corpus/": (frozenset({"sglang", "vllm"}), "the engine a public corpus log came from (data "
                              "vocabulary of the corpus entries, not a backend kind)"),
}


def kind_literals(kinds: set[str]) -> list[tuple[str, int, str]]:
    """``(path, line, literal)`` of every string constant equal to a backend kind in sweeps/ and
    tasks/, outside tasks/backends/ (f-string pieces and docstrings count as constants)."""
    out = []
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith("tasks/backends/"):
                continue
            for node in ast.walk(ast.parse(path.read_text(), rel)):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in kinds:
                    out.append((rel, node.lineno, node.value))
    return out


def _allowed(rel: str, literal: str) -> bool:
    return any((rel == where or (where.endswith("/") and rel.startswith(where))) and literal in lits
               for where, (lits, _) in KIND_LITERALS_ALLOWED.items())


def test_only_tasks_backends_names_a_backend_kind():
    """A new engine is one module in tasks/backends/ and one conf/backend/*.yaml: no table or
    ``if kind == ...`` elsewhere (the engine name, emulation, version field, probe support and
    metrics are the Backend's declarations)."""
    from tasks.backends import available_backends

    kinds = set(available_backends())
    assert {"sglang", "vllm", "emulated", "instant"} <= kinds
    hits = kind_literals(kinds)
    bad = [f"{rel}:{line}: {lit!r}" for rel, line, lit in hits if not _allowed(rel, lit)]
    assert not bad, "backend-kind literals outside tasks/backends/ (ask the Backend instead):\n" + "\n".join(bad)
    stale = [w for w, (lits, _) in KIND_LITERALS_ALLOWED.items()
             if not any(_allowed(rel, lit) and (rel == w or rel.startswith(w)) for rel, _, lit in hits)]
    assert not stale, f"allowed places that no longer name a kind (drop them): {stale}"


def test_kind_literal_finder_sees_a_planted_table(tmp_path, monkeypatch):
    (tmp_path / "sweeps").mkdir()
    (tmp_path / "tasks" / "backends").mkdir(parents=True)
    (tmp_path / "sweeps" / "x.py").write_text('EMULATED = {"emulated", "instant"}\nok = f"emulated {1}"\n')
    (tmp_path / "tasks" / "backends" / "y.py").write_text('kind = "emulated"\n')
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert sorted(kind_literals({"emulated", "instant"})) == [("sweeps/x.py", 1, "emulated"),
                                                              ("sweeps/x.py", 1, "instant")]


def test_modules_are_imported_under_names_not_letters():
    """``import x as R`` makes a reader look up what ``R`` is; a module keeps its name (or a longer one)."""
    short = []
    for mod, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                short += [f"{mod}: {a.name} as {a.asname}" for a in node.names
                          if a.asname and len(a.asname) <= 2 and a.asname.isupper()]
    assert not short, short
