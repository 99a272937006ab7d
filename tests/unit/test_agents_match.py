"""The match role's batch processing: raw values in, signals and dead letters out."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

import orjson
import pytest

from correlator.diagnosis.matcher import Matcher
from correlator.diagnosis.models import Signal
from correlator.diagnosis.rules import load_ruleset
from correlator.diagnosis.signals import SignalExtractor
from correlator.stream.agents.correlate import decode_signal_messages
from correlator.stream.agents.match import (
    MatchProcessor,
    RawMessage,
    signal_messages,
    signal_to_bytes,
)
from ingest.ship.wire_format import encode_batch

OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a total capacity of 79.14 GiB"


@pytest.fixture(scope="module")
def extractor() -> SignalExtractor:
    ruleset = load_ruleset()
    return SignalExtractor(ruleset, Matcher(ruleset))


@dataclass
class Record:
    key: bytes | None
    value: bytes


def _run_batch(extractor: SignalExtractor, values: list[bytes],
               **processor_kw: Any) -> tuple[list[dict[str, int]], list[Record], list[Record]]:
    """One batch through the match role's processing, and the records LogBatchReader sends for it
    (correlator/stream/agents/match_batches.py; its Kafka side is tested in tests/integration)."""
    processor = MatchProcessor(extractor, **processor_kw)
    out = processor.process([RawMessage(v, "rootrank.logs", 0, i) for i, v in enumerate(values)])
    summary = {"read": len(values), "processed": out.processed, "deadletter": len(out.dead_letters),
               "lines": out.lines, "signals": len(out.signals)}
    signals = [Record(key, value) for key, value in signal_messages(out.signals)]
    dead = [Record(None, orjson.dumps(letter)) for letter in out.dead_letters]
    return [summary], signals, dead


def test_good_values_become_signals_keyed_by_job(extractor: SignalExtractor) -> None:
    values = [
        encode_batch([(1773480413.0, "stderr", "step 10 loss 2.31"), (1773480414.0, "stderr", f"[rank3]: {OOM}")],
                     job_id="llama-7", host="node-a"),
        orjson.dumps({"log": f"[rank5]: {OOM}\n", "stream": "stderr", "time": "2026-03-14T09:26:53.1Z",
                      "kubernetes": {"pod_name": "llama-7-worker-1", "host": "node-b",
                                     "labels": {"training.kubeflow.org/job-name": "llama-7"}}}),
        b"plain text line with nothing in it",
    ]
    summaries, signals, dead = _run_batch(extractor, values)
    # One record per job and batch: the job's signals as a JSON list (a lone signal as itself).
    parsed = [d.signal for e in signals for d in decode_signal_messages(e.key, e.value)]
    assert len(signals) == 1 and all(isinstance(s, Signal) for s in parsed)
    assert summaries == [{"read": 3, "processed": 3, "deadletter": 0, "lines": 4, "signals": len(parsed)}]
    assert dead == []
    # Matched lines, plus whatever progress facts the rule library takes from the chatter.
    assert {(s.job_id, s.rank, s.host, s.class_) for s in parsed if s.kind == "match"} == {
        ("llama-7", 3, "node-a", "cuda_oom"), ("llama-7", 5, "node-b", "cuda_oom")}
    assert all(e.key == b"llama-7" for e in signals)


def test_bad_values_are_dead_lettered_with_reason_and_raw_bytes(extractor: SignalExtractor) -> None:
    bad = {
        "empty": b"",
        "not_utf8": b"[rank1]: CUDA out of memory. Tried to allocate \xff\xfe bytes",
        "bad_json": b'{"log": "[rank2]: truncated json',
        "too_large": b"x" * (1024 * 1024 + 1),
    }
    good = [f"[rank0]: {OOM}".encode()]
    summaries, signals, dead = _run_batch(extractor, [*bad.values(), *good], max_value_bytes=1024 * 1024)
    (summary,) = summaries
    # Every value is counted once: processed + dead-lettered = read.
    assert summary["read"] == 5 and summary["processed"] == 1 and summary["deadletter"] == 4
    letters = [orjson.loads(e.value) for e in dead]
    assert [letter["reason"] for letter in letters] == list(bad)
    for letter, raw in zip(letters, bad.values(), strict=True):
        assert base64.b64decode(letter["raw_b64"]) == raw
        assert letter["size"] == len(raw) and letter["raw_truncated"] is False
        assert {"topic", "partition", "offset"} <= letter.keys()
    assert [Signal.model_validate_json(e.value).rank for e in signals] == [0]


def test_invalid_utf8_can_be_decoded_with_replacement(extractor: SignalExtractor) -> None:
    processor = MatchProcessor(extractor, invalid_utf8="replace")
    out = processor.process([RawMessage(b"[rank1]: \xff " + OOM.encode(), "rootrank.logs", 0, 7)])
    assert out.processed == 1 and not out.dead_letters
    assert [s.rank for s in out.signals] == [1]


def test_lines_of_one_message_keep_their_order(extractor: SignalExtractor) -> None:
    value = encode_batch([(None, None, f"[rank{r}]: {OOM}") for r in range(3)], job_id="j")
    out = MatchProcessor(extractor).process([RawMessage(value, "rootrank.logs", 0, 42)])
    orders = [s.order for s in sorted(out.signals, key=lambda s: s.rank or 0)]
    assert orders == sorted(orders) and len(set(orders)) == 3


def test_dead_letter_raw_bytes_are_capped_to_fit_a_message(extractor: SignalExtractor) -> None:
    processor = MatchProcessor(extractor, max_value_bytes=100, deadletter_max_raw_bytes=150)
    out = processor.process([RawMessage(b"y" * 400, "rootrank.logs", 2, 9)])
    (letter,) = out.dead_letters
    assert letter["reason"] == "too_large" and letter["size"] == 400 and letter["raw_truncated"] is True
    assert base64.b64decode(letter["raw_b64"]) == b"y" * 150


def test_signal_records_group_a_jobs_signals_and_keep_replay_digests(extractor: SignalExtractor) -> None:
    value = encode_batch([(None, None, f"[rank{r}]: {OOM}") for r in range(3)], job_id="j")
    other = encode_batch([(None, None, f"[rank7]: {OOM}")], job_id="k")
    out = MatchProcessor(extractor).process([RawMessage(value, "rootrank.logs", 0, 1), RawMessage(other, "rootrank.logs", 0, 2)])
    records = signal_messages(out.signals)
    assert [key for key, _ in records] == [b"j", b"k"]
    assert isinstance(orjson.loads(records[0][1]), list) and isinstance(orjson.loads(records[1][1]), dict)
    listed = [d for key, value in records for d in decode_signal_messages(key, value)]
    assert [d.signal for d in listed] == out.signals
    # The same signals sent one by one (as a replay after a crash might) have the same digests.
    alone = [decode_signal_messages(s.job_id.encode(), signal_to_bytes(s))[0] for s in out.signals]
    assert [d.digest for d in alone] == [d.digest for d in listed]
    # A record too big for one message is split, in order.
    split = signal_messages(out.signals, max_bytes=1)
    assert [d.signal for key, value in split for d in decode_signal_messages(key, value)] == out.signals


def test_job_entry_dict_is_the_state_dump_also_when_reused(extractor: SignalExtractor) -> None:
    from correlator.stream.agents.correlate import JobEntry

    values = [encode_batch([(1773480400.0 + i, "stderr", f"[rank{r}]: step {i} loss 2.3 grad_norm {i}.5") for r in range(4)]
                           + [(1773480400.0 + i, "stderr", f"[rank{i}]: {OOM}")], job_id="j", offset=i * 5)
              for i in range(3)]
    entry = JobEntry.from_dict("j", None)
    for i, value in enumerate(values):
        out = MatchProcessor(extractor).process([RawMessage(value, "rootrank.logs", 0, i)])
        for key, record in signal_messages(out.signals):
            for decoded in decode_signal_messages(key, record):
                entry.state.add(decoded.signal, 100.0 + i)
        data = entry.to_dict()
        assert data["state"] == entry.state.model_dump(mode="json", by_alias=True)
        assert list(data["state"]) == list(entry.state.model_dump(mode="json", by_alias=True))
    assert JobEntry.from_dict("j", data).state.model_dump() == entry.state.model_dump()


def test_a_shipped_batch_with_invalid_utf8_is_dead_lettered_or_replaced_as_asked(extractor: SignalExtractor) -> None:
    """A shipped batch holding an invalid byte is a `not_utf8` dead letter by default, and is decoded with
    U+FFFD with invalid_utf8="replace" (its good lines still count)."""
    value = encode_batch([(None, None, "[rank0]: step 3 loss 2.1"), (None, None, f"[rank1]: {OOM} @@")],
                         job_id="j").replace(b"@@", b"\xff\xfe")
    message = RawMessage(value, "rootrank.logs", 0, 3)
    out = MatchProcessor(extractor).process([message])
    assert [letter["reason"] for letter in out.dead_letters] == ["not_utf8"] and out.processed == 0
    out = MatchProcessor(extractor, invalid_utf8="replace").process([message])
    assert not out.dead_letters and out.processed == 1
    assert [s.rank for s in out.signals if s.kind == "match"] == [1]
