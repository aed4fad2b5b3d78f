"""Shared fixtures: composed configs (Hydra compose API) and per-test stores."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

REPO = Path(__file__).resolve().parent.parent
CONF = REPO / "conf"


def compose_cfg(overrides: list[str] | None = None):
    """Compose the primary config with ``overrides`` (Hydra compose API, no cwd change)."""
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            return compose("config", overrides=overrides or [])
    finally:
        GlobalHydra.instance().clear()


# the classifier tool's cache of corpus decisive lines (tasks.failures._cache_path): one per test
# session, never the user's own (subprocesses of the tool inherit it)
os.environ.setdefault("SERVESWEEP_CACHE_DIR", tempfile.mkdtemp(prefix="servesweep-test-cache-"))


@pytest.fixture
def store_overrides(tmp_path: Path) -> list[str]:
    """Overrides that put every store (MLflow, Optuna, rules, findings) under tmp_path."""
    return [f"tracking.store_dir={tmp_path / 'store'}", f"tracking.findings_dir={tmp_path / 'findings'}"]


@pytest.fixture(autouse=True)
def _no_user_site(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    monkeypatch.setenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    os.environ.setdefault("PYTHONHASHSEED", "0")


#: slow modules that each keep the machine's cores busy for minutes (a real vLLM on CPU, 42
#: drivers on one Ray head, SGLang's and vLLM's own clients at 8-64 streams, a bench_serving
#: agreement at 5 %): under ``make test-slow``'s two workers they run one after another on one
#: worker, never two at once
HEAVY_SLOW_MODULES = frozenset({"test_vllm_real", "test_vllm_goodput", "test_vllm_client_agreement",
                                "test_store_faults_slow", "test_contract_clients", "test_emulator_batching"})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Put each slow test in an ``xdist_group`` (pytest-xdist's ``--dist loadgroup``): its
    module's name, so a module's tests share one worker, its module-scoped fixtures (the team
    stack, the Ray head) and their order; the modules of :data:`HEAVY_SLOW_MODULES` share one
    group. Without ``-n`` the marks change nothing."""
    for item in items:
        if item.get_closest_marker("slow") is None:
            continue
        module = item.module.__name__.rsplit(".", 1)[-1] if item.module is not None else item.nodeid
        item.add_marker(pytest.mark.xdist_group("heavy" if module in HEAVY_SLOW_MODULES else module))
