"""Turn whatever a log forwarder sends into `LogEvent`s: decoders, identity prefixes, timestamps, shipper."""

from ingest.event import LogEvent

__all__ = ["LogEvent"]
