"""The sweep the entry points run: the loop of :mod:`sweeps.search.loop` with its publisher."""

from __future__ import annotations

from sweeps.publish.outputs import Publisher
from sweeps.search.loop import SweepLoop


class Driver(SweepLoop):
    """A :class:`~sweeps.search.loop.SweepLoop` publishing through
    :class:`~sweeps.publish.outputs.Publisher` (trial files, MLflow, findings, progress)."""

    def make_publisher(self) -> Publisher:
        """Trial files, MLflow, findings and progress, per ``track``/``findings``/``quiet``."""
        return Publisher(self.spec, self.study_name, track=self.track, findings=self.findings, quiet=self.quiet)
