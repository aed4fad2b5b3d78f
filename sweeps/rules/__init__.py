"""Failure knowledge: learned failure rules (the rules store), what a rule matches on, and the
shipped public dead ends (``conf/knowledge/``). ``python -m sweeps.rules`` is its CLI."""
