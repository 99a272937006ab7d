"""The correlation engine: signals in, incidents out. Pure: no I/O, the clock is passed in."""

from correlator.diagnosis.engine.core import Engine
from correlator.diagnosis.engine.incident import incident_id
from correlator.diagnosis.engine.state import JobState
from correlator.diagnosis.engine.timeline import estimate_host_offsets

__all__ = ["Engine", "JobState", "estimate_host_offsets", "incident_id"]
