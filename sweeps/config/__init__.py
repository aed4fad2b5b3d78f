"""The sweep configuration: Hydra config -> a validated SweepSpec (search space, objective, bench,
backend and emulator overrides). The ground floor above ``sweeps.errors``: imports nothing else of
``sweeps``."""
