"""Secrets out of Hydra's run directory.

Hydra writes the composed config and the command-line overrides of every run to
``<hydra.run.dir>/.hydra/{config,overrides,hydra}.yaml`` before the job starts. A secret set
where the README says to set it (``backend.env.SGLANG_API_KEY=...``) would sit there in plain
text next to the driver log. :func:`redact_run_dir` rewrites those files with every
secret-looking value masked (names kept, :func:`tasks.redact.is_secret_name` decides), so what
stays on disk tells what ran without what it was allowed to read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tasks.redact import MASK, is_secret_name, redact_text

HYDRA_FILES = ("config.yaml", "overrides.yaml", "hydra.yaml")


def masked_override(s: str) -> str:
    """``+backend.env.SGLANG_API_KEY=abc`` -> ``+backend.env.SGLANG_API_KEY=***``; other text
    through :func:`redact_text` (an ``env`` list, a URL with a password)."""
    name, eq, _ = s.partition("=")
    if eq and is_secret_name(name.lstrip("+~").rsplit(".", 1)[-1]):
        return f"{name}={MASK}"
    return redact_text(s)


def _masked(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: (MASK if isinstance(k, str) and is_secret_name(k) and v not in (None, "") else _masked(v))
                for k, v in node.items()}
    if isinstance(node, list):
        return [_masked(v) for v in node]
    if isinstance(node, str):
        return masked_override(node)
    return node


def redact_run_dir(hydra_dir: Path) -> list[Path]:
    """Mask secret values in Hydra's files of one run (``<run dir>/.hydra``), in place.

    Args:
        hydra_dir: the ``.hydra`` directory Hydra wrote (absent when ``hydra.output_subdir``
            is null: nothing to do).
    Returns:
        The files rewritten (those whose text changed).
    Raises:
        OSError: a file could not be rewritten (the caller logs it; the sweep goes on).
    """
    changed = []
    for name in HYDRA_FILES:
        p = hydra_dir / name
        if not p.is_file():
            continue
        text = p.read_text()
        masked = yaml.safe_dump(_masked(yaml.safe_load(text)), sort_keys=False, allow_unicode=True)
        if masked != yaml.safe_dump(yaml.safe_load(text), sort_keys=False, allow_unicode=True):
            tmp = p.with_name(p.name + ".tmp")
            tmp.write_text(masked)
            tmp.replace(p)
            changed.append(p)
    return changed
