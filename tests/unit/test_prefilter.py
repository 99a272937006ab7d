"""The raw screen of one-line JSON values (correlator/diagnosis/prefilter.py): it may only ever save work.

Every test compares the match role's output with the screen on and off over the same batch: the same
signals, the same counts. The screen decodes fewer values; nothing it skips could have given a signal.
"""

from __future__ import annotations

import random
from typing import Any

import orjson
import pytest

from correlator.diagnosis.patterns import json_string_edges
from correlator.diagnosis.prefilter import JsonScreen, one_line_json
from correlator.diagnosis.rules import load_ruleset
from correlator.diagnosis.signals import SignalExtractor
from correlator.stream.agents.match import MatchProcessor, RawMessage, signal_to_bytes


@pytest.fixture(scope="module")
def extractor() -> SignalExtractor:
    return SignalExtractor(load_ruleset())


def fluent_bit(text: str, host: str, at: float, **extra: Any) -> bytes:
    """Fluent Bit's kafka output, `Format json`, tail input: the line keeps its newline."""
    return orjson.dumps({"@timestamp": at, "log": text + "\n", "stream": "stderr", "hostname": host, **extra})


def vector(text: str, host: str, at: str) -> bytes:
    """Vector's kafka sink, json codec, file source: keys in order, no newline in `message`."""
    return orjson.dumps({"file": "/var/log/train/worker.log", "host": host, "job_id": "llm-7b", "message": text,
                         "source_type": "file", "timestamp": at})


def filebeat(text: str, host: str, offset: int) -> bytes:
    return orjson.dumps({"@timestamp": "2026-12-03T05:59:58.123Z", "@metadata": {"beat": "filebeat"},
                         "message": text, "log": {"offset": offset, "file": {"path": f"/logs/llm-7b/{host}.log"}},
                         "host": {"name": host}, "fields": {"job_id": "llm-7b"}})


def outputs(extractor: SignalExtractor, values: list[bytes], *, screen: bool) -> tuple[list[bytes], int, int, int]:
    processor = MatchProcessor(extractor, prefilter=screen)
    messages = [RawMessage(v, "rootrank.logs", 0, i, 1_764_741_600.0) for i, v in enumerate(values)]
    out = processor.process(messages)
    return sorted(signal_to_bytes(s) for s in out.signals), out.processed, out.lines, len(out.dead_letters)


def same_with_and_without_screen(extractor: SignalExtractor, values: list[bytes]) -> list[bytes]:
    plain = outputs(extractor, values, screen=False)
    screened = outputs(extractor, values, screen=True)
    assert screened[0] == plain[0]
    assert screened[1:] == plain[1:]  # processed, lines, dead letters
    return screened[0]


def test_anchors_also_accept_a_json_string_edge() -> None:
    start, end = rb'(?:^|"|\\n)', rb'(?:$|(?:\\n)*")'
    assert json_string_edges(rb"^\s*Killed\s*$") == start + rb"\s*Killed\s*" + end
    # a routine marker's "to the line's end" goes (it is reported where it ends, in the text), a `$`
    # after `[^\n]*` reaches the value's end as it is; inside a class `^` negates and `$` is a literal;
    # escaped anchors are literals
    assert json_string_edges(rb"(?:a|b)[^\n]*$") == rb"(?:a|b)"
    assert json_string_edges(b"(?:a|b)[^\n]*$") == b"(?:a|b)"
    assert json_string_edges(rb"a[^\n]*$b") == rb"a[^\n]*$b"
    assert json_string_edges(rb"a\$[]^$]") == rb"a\$[]^$]"
    assert json_string_edges(rb"[[:alpha:]^]+^x") == rb"[[:alpha:]^]+" + start + b"x"


def test_only_plain_one_line_json_is_screened() -> None:
    assert one_line_json(fluent_bit("[rank3]: step 12 loss 2.1", "gpu-node-001", 1.0))
    assert not one_line_json(b"[rank3]: step 12 loss 2.1")  # plain text: decoded as it always was
    assert not one_line_json(fluent_bit('[rank3]: KeyError: "model.layers.0"', "h", 1.0))  # \" escape
    assert not one_line_json(fluent_bit("\x1b[31mERROR\x1b[0m", "h", 1.0))  # \u001b escape
    assert not one_line_json(fluent_bit("a\tb", "h", 1.0))  # \t escape
    assert not one_line_json(b'{"rootrank": 1, "lines": []}')  # a shipped batch holds many lines


def test_escaped_failures_are_found(extractor: SignalExtractor) -> None:
    """A failure behind colour codes, quotes, a tab, or on a continuation line of a multi-line record."""
    host = "gpu-node-004"
    values = [
        fluent_bit("[rank37]: \x1b[31mtorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. "
                   "GPU 5 has a total capacity of 79.11 GiB of which 1.02 GiB is free.\x1b[0m", host, 10.0),
        fluent_bit('[rank12]: KeyError: "model.layers.31.mlp.down_proj.weight"', host, 11.0),
        fluent_bit("Traceback (most recent call last):\n  File \"train.py\", line 88, in <module>\n"
                   "RuntimeError: CUDA error: an illegal memory access was encountered", host, 12.0),
        fluent_bit("/var/spool/slurmd/job1234/slurm_script: line 12:  4242 Killed\n", host, 13.0),
        fluent_bit("Segmentation fault", "gpu-node-009", 14.0),  # `^...$` rule, text between quotes
        vector("Segmentation fault", "gpu-node-010", "2026-12-03T06:00:01Z"),  # no newline: `$` is the quote
        fluent_bit("watchdog\ttimeout", host, 15.0),
    ]
    signals = same_with_and_without_screen(extractor, values)
    by_class: dict[str, set[str]] = {}
    for signal in map(orjson.loads, signals):
        by_class.setdefault(signal["class"], set()).add(signal.get("host"))
    assert {"cuda_oom", "cuda_illegal_memory_access", "python_exception"} <= set(by_class), by_class
    assert by_class["process_crash_signal"] >= {"gpu-node-009", "gpu-node-010"}


def training_batch(extractor: SignalExtractor, n: int, seed: int) -> list[bytes]:
    """Metric and progress lines from 16 ranks on 4 hosts, chatter, and a failure now and then, in the three
    forwarders' shapes: the routine winners (latest progress, largest and smallest metric per stream)
    must come out as they do when every value is decoded."""
    rng = random.Random(seed)
    failures = [line for lr in load_ruleset().rules if lr.rule.kind == "signature" for line in lr.rule.examples.match]
    routine = [
        "[rank{r}]:{{'loss': {loss:.4f}, 'grad_norm': {g:.4f}, 'learning_rate': 2.9e-04, 'epoch': 0.41}}",
        ("[rank{r}]: iteration {s:>8}/  500000 | consumed samples: {cs:>10} | elapsed time per iteration (ms): 1432.1"
        " | learning rate: 2.9E-04 | global batch size:   512 | lm loss: {loss:.6E} | loss scale: 1.0 |"
        " grad norm: {g:.3f} | number of skipped iterations:   0 | number of nan iterations:   0 |"),
        "[rank{r}]: {p:>2}%|###       | {s}/10000 [25:11<3:04:52,  1.26s/it]",
        ("[rank{r}]:[2026-12-03 05:41:07,114] [INFO] [logging.py:96:log_dist] [Rank {r}] step={s}, skipped=0,"
        " lr=[0.00029], mom=[(0.9, 0.95)]"),
    ]
    chatter = [
        "[rank{r}]:gpu-node-00{h}:31{r:02d}:32{r:02d} [{g8}] NCCL INFO Channel 03/24 : {r}[{g8}] -> {r1}[{g8}] via P2P/IPC",
        "[rank{r}]:INFO:torch.distributed.elastic.agent.server.api:[default] Starting worker group",
    ]
    values: list[bytes] = []
    for i in range(n):
        r = rng.randrange(16)
        h = r // 4
        fields = {"r": r, "r1": (r + 1) % 16, "h": h, "g8": r % 8, "s": i // 16, "cs": i * 32, "p": i % 100,
                  "loss": rng.random() * 3 if rng.random() > 0.01 else float("nan"), "g": rng.random() * 2}
        u = rng.random()
        text = (rng.choice(failures) if u < 0.01 else
                rng.choice(routine).format(**fields) if u < 0.6 else rng.choice(chatter).format(**fields))
        shape = i % 3
        if shape == 0:
            values.append(fluent_bit(text, f"gpu-node-00{h}", 1_764_741_000 + i * 0.01, job_id="llm-7b"))
        elif shape == 1:
            values.append(vector(text, f"gpu-node-00{h}", f"2026-12-03T06:00:{i % 60:02d}.{i:06d}Z"))
        else:
            values.append(filebeat(text, f"gpu-node-00{h}", i * 180))
    return values


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_screen_changes_nothing_on_a_training_batch(extractor: SignalExtractor, seed: int) -> None:
    values = training_batch(extractor, 900, seed)
    signals = same_with_and_without_screen(extractor, values)
    assert any(orjson.loads(s).get("fields", {}).get("metric") is not None for s in signals)
    screened = JsonScreen(extractor.matcher, max_value_bytes=1 << 22).screen(values)
    # it saves work: most values are read without being decoded
    assert screened.skipped > len(values) // 2
    assert len(screened.decode) + screened.skipped == len(values)


def test_a_mixed_batch_screens_the_json_and_decodes_the_rest(extractor: SignalExtractor) -> None:
    values = [fluent_bit("[rank1]: step 3 loss 2.0", "gpu-node-001", 1.0),
              b"[rank2]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB",
              b"", fluent_bit("[rank3]: \x1b[1mNCCL watchdog\x1b[0m", "gpu-node-001", 2.0),
              b"\xff\xfe not utf-8", vector("[rank4]: hello", "gpu-node-002", "2026-12-03T06:00:00Z")]
    same_with_and_without_screen(extractor, values)
    screened = JsonScreen(extractor.matcher, max_value_bytes=1 << 22).screen(values)
    assert {1, 2, 3, 4} <= set(screened.decode)  # plain text, empty, escaped, invalid UTF-8: decoded


def test_a_shipped_batch_among_one_line_values_is_decoded(extractor: SignalExtractor) -> None:
    """`rootrank ship` sends many lines in one JSON value: it must never be counted as one skipped line."""
    from ingest.ship.wire_format import encode_batch

    shipped = encode_batch([(1_764_741_000.0 + i, "stdout", f"[rank{i % 8}]: step {i} tokens/s 41234")
                            for i in range(40)], job_id="llm-7b", host="gpu-node-003")
    assert b"\\" not in shipped.replace(b"\\n", b"")  # the batch path, not the escaped value's one
    values = [fluent_bit(f"[rank{i}]: NCCL INFO Connected all rings", "gpu-node-001", 1.0 + i) for i in range(4)]
    values.insert(2, shipped)
    plain = outputs(extractor, values, screen=False)
    assert plain[2] == 44  # lines: 4 one-line values and the batch's 40
    same_with_and_without_screen(extractor, values)
    screened = JsonScreen(extractor.matcher, max_value_bytes=1 << 22).screen(values)
    assert 2 in screened.decode


def test_a_line_with_two_metrics_gives_one_signal_as_any_other_line(extractor: SignalExtractor) -> None:
    """One line is one failure (`best_hits_per_line`): a Megatron step line matches both the parameter-norm
    and the grad-norm metric rules, and only the better rule's signal comes out, on the folded routine
    path of `from_texts` as on the ordinary one."""
    line = (" iteration     3100/  200000 | lm loss: 2.011E+00 | params norm: 412.551 | grad norm: 0.377 |"
            " number of skipped iterations:   0 |")
    signals = outputs(extractor, [vector(line, "gpu-node-000", "2026-12-03T06:00:00Z")], screen=False)[0]
    metrics = [s for s in map(orjson.loads, signals) if "metric" in s.get("fields", {})]
    assert len(metrics) == 1, [m["rule_id"] for m in metrics]
