"""Shared fixtures: composed configs (Hydra compose API) and per-test stores."""

from __future__ import annotations

import os
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


@pytest.fixture
def store_overrides(tmp_path: Path) -> list[str]:
    """Overrides that put every store (MLflow, Optuna, rules, findings) under tmp_path."""
    return [f"tracking.store_dir={tmp_path / 'store'}", f"tracking.findings_dir={tmp_path / 'findings'}"]


@pytest.fixture(autouse=True)
def _no_user_site(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    monkeypatch.setenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    os.environ.setdefault("PYTHONHASHSEED", "0")
