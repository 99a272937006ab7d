"""Kafka message value -> RawRecords -> LogEvent, for whatever forwarder sent it, with no config.

`decode_value` recognises, in this order: Fluent Bit JSON, Vector JSON, Filebeat JSON,
rootrank's own batch JSON (ingest/ship/wire_format.py), rsyslog text (RSYSLOG_FileFormat,
RSYSLOG_TraditionalFileFormat, RFC 5424), and plain text; one module each here, the choice in
`dispatch`. A value may also hold several JSON records, as JSON lines or as a JSON array of
objects. It is on the hot path of the streaming worker, so it uses orjson and plain dataclasses,
and never raises anything but `DecodeError` (whose `reason` goes to the dead-letter topic).
"""

from ingest.decoders.dispatch import decode_lines, decode_value
from ingest.decoders.events import job_id_for, to_event
from ingest.decoders.records import DecodedLines, DecodeError, RawRecord

__all__ = ["DecodeError", "DecodedLines", "RawRecord", "decode_lines", "decode_value", "job_id_for", "to_event"]
