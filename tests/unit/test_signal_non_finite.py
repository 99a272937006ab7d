"""A non-finite value (a loss of nan, an infinite grad norm) is what the engine looks for, and JSON has no
number for it: orjson writes null, which reads back as no value at all and fails the signal's schema. It
travels as the name pydantic gives it ("NaN", "Infinity") and reads back as the float, through the signals
topic and through the job state the correlate role stores. (Off: the fields serialized as they are -> the
signal comes back without its value, or not at all.)"""

from __future__ import annotations

import math

import orjson

from correlator.diagnosis.engine import JobState
from correlator.diagnosis.models import Signal
from correlator.stream.agents.correlate import JobEntry, decode_signal_messages
from correlator.stream.agents.match import signal_messages

NAN_LOSS = Signal(job_id="j", rule_id="loss-nan-detected", class_="loss_nan", rank=3,
                  line="FloatingPointError: Non-finite loss nan at step 9, stopping",
                  fields={"loss": math.nan, "grad_norm": -math.inf, "step": 9, "note": "NaN-safe"})


def _same(a: Signal, b: Signal) -> bool:
    fa, fb = a.fields, b.fields
    return a.model_copy(update={"fields": {}}) == b.model_copy(update={"fields": {}}) and fa.keys() == fb.keys() and all(
        (isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y)) or x == y
        for x, y in ((fa[k], fb[k]) for k in fa))


def test_a_non_finite_field_crosses_the_signals_topic() -> None:
    [(key, value)] = signal_messages([NAN_LOSS, NAN_LOSS.model_copy(update={"rank": 1})])
    decoded = decode_signal_messages(key, value)
    assert [d.signal is not None for d in decoded] == [True, True]
    assert decoded[0].signal is not None and _same(decoded[0].signal, NAN_LOSS)
    assert decoded[0].signal.fields["grad_norm"] == -math.inf


def test_a_non_finite_field_survives_the_stored_job_state() -> None:
    state = JobState(job_id="j")
    state.add(NAN_LOSS)
    stored = orjson.dumps(JobEntry(state=state).to_dict())
    restored = JobState.model_validate(orjson.loads(stored)["state"])
    [signal] = [s for s in restored.signals if s.rule_id == "loss-nan-detected"]
    assert _same(signal, NAN_LOSS)
