"""Stand-in for one SGLang TP-rank/scheduler process: sleeps until killed.

Started by ``tasks.emulator.server`` in the server's process group. It does not watch its
parent: like SGLang's ranks it survives the launcher's death (orphaned), so teardown code
must kill the whole tree/group. ``--ignore-sigterm`` makes it ignore SIGTERM (fault
``ignore_sigterm``): only SIGKILL stops it then.

Usage: ``python -m tasks.emulator.rank --rank 3 [--ignore-sigterm]``
"""

from __future__ import annotations

import argparse
import signal
import time


def main(argv: list[str] | None = None) -> None:
    """Parse ``--rank``/``--ignore-sigterm`` and sleep forever."""
    ap = argparse.ArgumentParser(prog="tasks.emulator.rank")
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--ignore-sigterm", action="store_true")
    args = ap.parse_args(argv)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)   # parent/terminal going away must not kill us
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if args.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
