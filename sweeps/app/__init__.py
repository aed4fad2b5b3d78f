"""The applications composed from the floors below: ``run`` (a sweep or a recheck), the dry run,
the in-process loop, the pre-launch estimate and the one-line CLI errors."""
