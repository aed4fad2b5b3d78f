"""The ``detach_helper`` fault: a helper that leaves the server's tree and session.

Forks, the child calls ``setsid()`` and forks again, the intermediate exits: the grandchild
is reparented to PID 1 (or a subreaper), in its own session and process group, and holds a
listening socket while it sleeps, like a real server's stray compile/cache helper.
"""

from __future__ import annotations

import os
import socket
import time


def main() -> None:
    """Detach a sleeping grandchild (600 s) holding a socket on 127.0.0.1; return at once."""
    if os.fork() > 0:
        return
    os.setsid()
    if os.fork() > 0:
        os._exit(0)
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    time.sleep(600)
    os._exit(0)


if __name__ == "__main__":
    main()
