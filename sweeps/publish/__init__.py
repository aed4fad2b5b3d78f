"""What a sweep tells people: MLflow sync of the parent run, the findings document, plots, the
recheck report and the deployable command. Never decides what to launch."""
