"""Running trials: Ray start/join, the executor (submit/wait/retry), preflight of stores and
engines, study ownership, store set-up, graceful stops and the per-trial progress display."""
