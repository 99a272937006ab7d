"""Property tests: no input makes the ingest functions fail with anything but DecodeError."""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from ingest.decoders import DecodeError, RawRecord, decode_value, to_event
from ingest.multiline import IdentityCarrier, split_glued
from ingest.prefixes import parse_prefixes

FUZZ = settings(max_examples=200, deadline=None, database=None)

# Fragments of real prefixes and forwarder keys, so the generators reach the interesting branches
# instead of only producing noise that falls through to plain text.
PREFIX_BITS = [
    "[rank3]:", "[default1]:", "[1,mpirank:2,algo-1]<stderr>:", "[1,4]<stdout>:", "[77] ", "[RANK 2] ",
    "[E321 02:07:08.408271257 x.cpp:1] ", "[2024-01-01 00:00:00,000] ", "[2024-01-01 00:00:00,000 E 1 2] a.cc:1: ",
    "[12/31/2025-23:59:59] [TRT-LLM] [RANK 0] [E] ", "[ 12.5] ", "[h:1 :0:2] ", "(Worker pid=1, ip=1.2.3.4) ",
    "(raylet) ", "(VllmWorker rank=1 pid=2) ", "2024-02-29T23:59:59.999999999Z ", "2022/03/21 15:13:18 ",
    "2023-04-29 06:01:12.977 ", "h:1:2 [0] ", "3: ", "E1206 18:44:12.715298 2606 f.py:1] ", "kernel: ",
    "svc  | ", "ERROR 11-08 11:01:29 [core.py:1] ", "May  1 12:00:00 h t[1]: ", "[INFO] ", "\x1b[31m",
    "[177/train/578 (pid 1)] ", "\r", "%|", "  what():  ", "[Mon Feb 30 10:00:00 2025] ", "99999999999: ",
]  # fmt: skip
lines = st.lists(st.sampled_from(PREFIX_BITS) | st.text(max_size=20), max_size=8).map("".join)

json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=30)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
FORWARDER_KEYS = [
    "log", "message", "MESSAGE", "msg", "@timestamp", "timestamp", "date", "time", "stream", "kubernetes", "host",
    "file", "filename", "@metadata", "agent", "ecs", "fields", "labels", "source", "lines", "v", "job_id", "rank",
    "local_rank", "pid", "attempt", "_PID", "_SOURCE_REALTIME_TIMESTAMP", "SYSLOG_IDENTIFIER", "source_type",
]  # fmt: skip
forwarder_objects = st.dictionaries(st.sampled_from(FORWARDER_KEYS), json_values, max_size=8)


def _decode(value: bytes) -> list[RawRecord] | DecodeError:
    try:
        records = decode_value(value, max_line_bytes=256)
    except DecodeError as exc:
        assert exc.reason and exc.reason.replace("_", "").isalpha()
        return exc
    for record in records:
        assert isinstance(record, RawRecord)
        assert isinstance(record.text, str) and record.text.strip()
        assert len(record.text.encode("utf-8", "surrogatepass")) <= 256
        to_event(record)  # every decoded record must also make a valid LogEvent
    return records


@FUZZ
@given(st.binary(max_size=400))
def test_decode_value_on_arbitrary_bytes(value: bytes) -> None:
    _decode(value)


@FUZZ
@given(forwarder_objects)
def test_decode_value_on_forwarder_shaped_json(obj: dict[str, Any]) -> None:
    try:
        value = orjson.dumps(obj, option=orjson.OPT_NON_STR_KEYS)
    except (orjson.JSONEncodeError, TypeError):
        return  # NaN/huge ints that JSON cannot carry
    _decode(value)


@FUZZ
@given(st.lists(lines, max_size=6).map("\n".join))
def test_decode_value_on_prefix_soup(text: str) -> None:
    _decode(text.encode("utf-8", "surrogatepass"))


@FUZZ
@given(st.lists(lines, min_size=1, max_size=12))
def test_prefix_parsing_and_carrying_never_fail(stream: list[str]) -> None:
    carrier = IdentityCarrier()
    for physical in stream:
        for line in split_glued(physical):
            ident = carrier.feed(line)
            direct = parse_prefixes(line)
            assert direct.text == ident.text
            assert ident.ts is None or ident.ts.utcoffset() is not None
            # prefixes are only ever removed from the front
            assert line.replace("\x1b", "").endswith(ident.text.replace("\x1b", "")) or "\x1b" in line
