"""The shipped block of ``python -m sweeps.rules list``: public knowledge (conf/knowledge/*.yaml)
that applies to a node, shown apart from the rules learned in the rules database.

A shipped entry is not a skip: on a matching node it sends a config to a probe launch first
(sweeps/search/probes.py), and the probe's outcome becomes a learned rule (or a cleared marker).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
NODE_DIR = REPO_ROOT / "conf" / "node"


def node_conf(name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(node conf, its fingerprint) of ``conf/node/<name>.yaml`` (fingerprint: ``emulator.fingerprint``).

    Raises:
        FileNotFoundError: no such node profile.
    """
    path = NODE_DIR / f"{name}.yaml"
    if not path.is_file():
        known = ", ".join(sorted(q.stem for q in NODE_DIR.glob("*.yaml")))
        raise FileNotFoundError(f"--node {name}: no such node profile {path}; the profiles are: {known}")
    node = yaml.safe_load(path.read_text()) or {}
    return node, dict((node.get("emulator") or {}).get("fingerprint") or node.get("fingerprint") or {})


def shipped_lines(node_name: str | None) -> list[str]:
    """The shipped block: a header naming the node and its fingerprint, then one
    tab-separated row per entry (all entries when ``node_name`` is None)."""
    from sweeps.rules.knowledge import for_stack, load_knowledge

    if node_name is None:
        entries, head = list(load_knowledge()), "# shipped (conf/knowledge): every entry (--node NAME: those for one node)"
    else:
        node, fp = node_conf(node_name)
        entries = for_stack(fp, node)
        fp_text = ", ".join(f"{k}={v}" for k, v in sorted(fp.items()))
        head = f"# shipped (conf/knowledge) for node {node_name} [{fp_text}]: {len(entries)} entries"
    lines = [head, "id\tclass\tknobs\tsource\tfixed_by\tfile"]
    for e in entries:
        r = e.rule_row()
        knobs = ",".join(f"{k}={'|'.join(map(str, v))}" for k, v in r["knobs"].items())
        lines.append(f"{r['id']}\t{r['failure_class']}\t{knobs}\t{r['source']}\t{'; '.join(r['fixed_by']) or '-'}\t"
                     f"{Path(r['file']).name}")
    return lines
