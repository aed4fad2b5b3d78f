"""``python -m sweeps.rules``: list, explain and forget failure rules (see :func:`sweeps.rules.store.main`)."""

from sweeps.rules.store import main

raise SystemExit(main())
