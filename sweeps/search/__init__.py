"""Deciding what to launch: the sweep loop (ask -> gates -> untried draw -> probes -> tell),
confirmation of the winner, and the serving-under-load objectives."""
