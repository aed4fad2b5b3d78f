"""The package Ray ships to a node (``sweeps.run.ray_auth.code_runtime_env``: the checkout less
``CODE_EXCLUDES``) imports and runs a trial's code by itself: what the excludes leave out (tests,
benchmarks, docs, the failure corpus's parts) is never needed on a node."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pathspec

from sweeps.run.ray_auth import CODE_EXCLUDES
from tests.conftest import REPO

PROBE = """
import json, sys
import tasks.remote, tasks.failures, tasks.failure_corpus  # what run_trial imports, and the corpus module
from tasks.failures import classify
c = classify("RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB", 1, "startup")
print(json.dumps({"tasks": tasks.__file__, "parts": list(tasks.failure_corpus.PARTS), "class": c.failure_class}))
"""


def shipped_files() -> list[str]:
    """What Ray packs for a node: the tracked files of the checkout (Ray honours .gitignore) less
    CODE_EXCLUDES, matched as Ray matches them (pathspec's gitwildmatch); paths relative to REPO."""
    skip = pathspec.PathSpec.from_lines("gitwildmatch", CODE_EXCLUDES)
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    return [f for f in files.split("\0") if f and not skip.match_file(f) and (REPO / f).is_file()]


def _shipped_copy(dest: Path) -> Path:
    for f in shipped_files():
        (dest / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / f, dest / f)
    return dest


def test_the_package_a_node_receives_imports_and_classifies_without_the_corpus_parts(tmp_path):
    pkg = _shipped_copy(tmp_path / "pkg")
    assert not (pkg / "tasks" / "failure_corpus" / "dev").exists() and (pkg / "tasks" / "failure_corpus" / "__init__.py").exists()
    assert not (pkg / "tests").exists() and not (pkg / "benchmarks").exists()
    r = subprocess.run([sys.executable, "-c", PROBE], cwd=pkg, capture_output=True, text=True, timeout=120,
                       env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(pkg), "HOME": str(tmp_path)})
    assert r.returncode == 0, r.stderr[-3000:]
    import json

    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["tasks"].startswith(str(pkg)) and out["parts"] == [] and out["class"] == "cuda_oom_runtime", out
