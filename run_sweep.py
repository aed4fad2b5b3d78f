"""servesweep entry point: compose the Hydra config, hand it to the driver.

    python run_sweep.py                                   # the default campaign, emulated node
    python run_sweep.py sweep=smoke bench.repeats=5
    python run_sweep.py backend=sglang dry_run=true       # render + validate, launch nothing
"""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
import yaml
from omegaconf import DictConfig

CONF = Path(__file__).resolve().parent / "conf"


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> float | None:
    from sweeps.cli_errors import EXIT_CONFIG, yaml_error_line
    from sweeps.driver import run

    try:
        return run(cfg)
    except yaml.MarkedYAMLError as e:  # a data file under conf/ read after composition
        print(f"servesweep: {yaml_error_line(e)} (the YAML does not parse; nothing was started)", file=sys.stderr)
        sys.exit(EXIT_CONFIG)


if __name__ == "__main__":
    from sweeps.cli_errors import EXIT_CONFIG, precheck

    problem = precheck(CONF, sys.argv[1:])
    if problem:
        print(problem, file=sys.stderr)
        sys.exit(EXIT_CONFIG)
    main()
