"""servesweep entry point: compose the Hydra config, hand it to the driver.

    python run_sweep.py                                   # the default campaign, emulated node
    python run_sweep.py sweep=smoke bench.repeats=5
    python run_sweep.py backend=sglang dry_run=true       # render + validate, launch nothing
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> float | None:
    from sweeps.driver import run

    return run(cfg)


if __name__ == "__main__":
    main()
