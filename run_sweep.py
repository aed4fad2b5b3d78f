"""servesweep entry point: compose the Hydra config, hand it to the driver, exit with its code.

    python run_sweep.py                                   # the default campaign, emulated node
    python run_sweep.py sweep=smoke bench.repeats=5
    python run_sweep.py backend=sglang dry_run=true       # render + validate, launch nothing

The only place a sweep exits the process: an error of one of :mod:`sweeps.errors`' kinds is
printed as one line and becomes the exit code of :data:`sweeps.errors.EXIT_CODES` (the README's
"Exit codes" table); anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
import yaml
from omegaconf import DictConfig

CONF = Path(__file__).resolve().parent / "conf"


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> float | tuple[float | None, ...] | None:
    from sweeps.app.cli_errors import yaml_error_line
    from sweeps.app.driver import run
    from sweeps.app.logs import details
    from sweeps.errors import EXIT_CONFIG, EXIT_ERROR, EXIT_NOTHING_MEASURED, SweepError, exit_code

    try:
        return run(cfg)
    except yaml.MarkedYAMLError as e:  # a data file under conf/ read after composition
        print(f"servesweep: {yaml_error_line(e)} (the YAML does not parse; nothing was started)", file=sys.stderr)
        sys.exit(EXIT_CONFIG)
    except BaseException as e:
        code = exit_code(e)
        if code is None:
            raise
        if str(e):  # a sweep that ran (a store that failed under it too) points at its driver log
            ran = code in (EXIT_ERROR, EXIT_NOTHING_MEASURED) or isinstance(e, SweepError)
            print(f"servesweep: {e}{details() if ran else ''}", file=sys.stderr)
        sys.exit(code)


if __name__ == "__main__":
    from sweeps.app.cli_errors import precheck
    from sweeps.errors import EXIT_CONFIG

    problem = precheck(CONF, sys.argv[1:])
    if problem:
        print(problem, file=sys.stderr)
        sys.exit(EXIT_CONFIG)
    main()
