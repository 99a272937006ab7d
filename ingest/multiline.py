"""Lines that are not one record each: glued progress bars, interleaved writes, continuations.

A physical line is not always one log record. tqdm redraws its bar with `\\r` and the next
record lands glued behind the last redraw; two processes writing `  what():  ` at once
interleave; and a traceback's frames, a C++ backtrace or NCCL's `Last error:` detail carry no
prefix of their own although they belong to the prefixed record above them.
`split_glued` repairs the first two; `IdentityCarrier` gives continuation lines the identity
of the record they continue, per stream.
"""

from __future__ import annotations

import re
from dataclasses import replace
from enum import Enum

from ingest.prefixes import Identity, parse_prefixes

__all__ = ["IdentityCarrier", "is_continuation", "lookback_needs", "split_glued"]

# tqdm with a total: "Epoch 0:   6%|██   | 32040/500150 [6:28:43<94:39:17,  1.37it/s, loss=2.6]"
_TQDM_BAR = re.compile(
    r"\d{1,3}%\|[^|\n]*\|[^\[\n]*\[(?:\d+:)?\d+:\d+<(?:(?:\d+:)?\d+:\d+|\?)(?:,[^\]\n]*)?\]"
    # tqdm without a total: "1234it [00:10, 123.45it/s]"
    r"|\d+(?:\.\d+)?[kMG]?(?:it|B) \[(?:\d+:)?\d+:\d+(?:,[^\]\n]*)?\]"
)
_WHAT_REPEATED = re.compile(r"what\(\):\s+(?:what\(\):\s+)+")


def _split_segment(segment: str, out: list[str]) -> None:
    """Append `segment` to `out`, cut after any progress bar that has text glued behind it."""
    rest = segment
    while True:
        m = _TQDM_BAR.search(rest)
        if m is None:
            break
        tail = rest[m.end() :]
        if not tail.strip():
            break
        out.append(rest[: m.end()])
        rest = tail.lstrip(" ")
    out.append(rest)


def _is_bar_only(segment: str) -> bool:
    m = _TQDM_BAR.search(segment)
    return m is not None and not segment[m.end() :].strip()


def split_glued(line: str) -> list[str]:
    """Split one physical line into the records glued together in it.

    - `\\r` redraws: each redraw is a segment; a run of bar-only redraws keeps only its last
      state (the bar as the terminal finally showed it).
    - a tqdm bar with a record glued right behind it -> the bar, then the record.
    - interleaved `  what():    what():  msg` -> `  what():  msg`.
    Empty segments are dropped; a line without any of these comes back as `[line]`.
    """
    if (
        "\r" not in line
        and "\n" not in line
        and "|" not in line
        and "it [" not in line
        and "what():" not in line
    ):
        return [line]
    if "what():" in line:
        line = _WHAT_REPEATED.sub("what():  ", line)
    segments = re.split(r"\r\n?|\n", line) if ("\r" in line or "\n" in line) else [line]
    out: list[str] = []
    for segment in segments:
        if not segment.strip():
            continue
        if out and _is_bar_only(out[-1]) and _is_bar_only(segment):
            out[-1] = segment  # a later redraw of the same bar replaces the earlier one
            continue
        _split_segment(segment, out)
    return out


# Lines that continue the record above them. Indentation covers Python frames and code lines,
# carets, the UCX/NVRM wrapped lines and `  what():`; the rest are well-known continuation
# forms of PyTorch, NCCL, UCX and TensorRT-LLM error reports.
_CONTINUATION = re.compile(
    r"[ \t]+\S"
    r"|frame #\d+: "
    r"|Exception raised from "
    r"|Last error:"
    r"|[\^~]{3,}\s*$"
    r"|\d+\s+0x[0-9a-fA-F]+ "
    r"|=+ backtrace"
    r"|[=\-]{5,}\s*$"
    r"|The above exception was the direct cause of the following exception"
    r"|During handling of the above exception, another exception occurred"
    r"|CUDA kernel errors might be asynchronously reported"
    r"|For debugging consider passing CUDA_LAUNCH_BLOCKING"
    r"|Compile with `TORCH_USE_CUDA_DSA`"
    r"|nccl[A-Z]\w*Error: "
)


def is_continuation(line: str) -> bool:
    """True when `line` (without prefixes) continues the previous record of its stream.

    Terminal hard-wraps (a line cut at the terminal width) are not detected: nothing in the
    fragment says it is one.
    """
    return _CONTINUATION.match(line) is not None


# The exception line that ends a Python traceback: "RuntimeError: ...", "torch.x.ChildFailedError:",
# "KeyboardInterrupt". Only taken as a continuation right after the frames.
_EXCEPTION_LINE = re.compile(r"[A-Za-z_][\w.]*(?::|\s*$)")


class _State(Enum):
    NONE = 0
    TRACEBACK = 1  # inside "Traceback (most recent call last):" frames
    DETAIL = 2  # the next line is the detail of the line before ("Last error:")
    CHAIN = 3  # "The above exception was ..." : the next Traceback belongs to the same record


def _state_after(text: str, previous: _State) -> _State:
    stripped = text.lstrip()
    if stripped.startswith("Traceback (most recent call last)"):
        return _State.TRACEBACK
    if previous is _State.TRACEBACK and text[:1] in (" ", "\t", "^", "~"):
        return _State.TRACEBACK
    if stripped.startswith("Last error:"):
        return _State.DETAIL
    if stripped.startswith(("The above exception was", "During handling of the above")):
        return _State.CHAIN
    return _State.NONE


class IdentityCarrier:
    """Per-stream identity: prefixed lines set it, continuation lines inherit it.

    `feed` each line of one stream (one file, one container stream) in order. A line without
    identity of its own that continues the record above (frames, backtraces, `Last error:`
    details, the exception line right after a traceback) inherits rank, local_rank, host, pid
    and GPU of that record. Any other line without identity ends the record.
    The year of the last dated timestamp completes later year-less ones (glog, vLLM).
    """

    __slots__ = ("_carried", "_state", "_year")

    def __init__(self, *, year: int | None = None) -> None:
        self._carried: Identity | None = None
        self._state = _State.NONE
        self._year = year

    def reset(self) -> None:
        self._carried = None
        self._state = _State.NONE

    def feed(self, line: str) -> Identity:
        ident = parse_prefixes(line, year=self._year)
        if ident.ts is not None and ident.ts_has_date:
            self._year = ident.ts.year
        text = ident.text
        if ident.has_identity():
            self._carried = ident
            self._state = _state_after(text, self._state)
            return ident
        if not text.strip():
            return ident  # blank lines separate the parts of a chained traceback: neutral
        state = self._state
        continues = (
            is_continuation(text)
            or state is _State.DETAIL
            or (state is _State.TRACEBACK and _EXCEPTION_LINE.match(text) is not None)
            or (state is _State.CHAIN and text.startswith("Traceback"))
        )
        carried = self._carried
        if continues and carried is not None:
            ident = replace(
                ident,
                rank=carried.rank,
                local_rank=carried.local_rank,
                host=carried.host,
                pid=carried.pid,
                gpu=carried.gpu,
            )
        elif not continues:
            self._carried = None
        self._state = _state_after(text, state)
        return ident


def lookback_needs(before: list[str]) -> list[str]:
    """Of the lines before a point of a file (in file order, the closest last), those a line after that
    point may take its time or its owner from (correlator/diagnosis/framing.py looks back at most
    len(before) lines): back to the closest line with a time of its own, and back through the lines
    that continue a record to the line naming its writer. A look back that would find neither there
    finds nothing in fewer lines either, so those are left out. Usually the last line or two; a shipped
    batch carries them as its context."""
    need = len(before)
    for at in range(len(before) - 1, -1, -1):  # the closest timed line
        if parse_prefixes(before[at]).ts is not None:
            need = at
            break
    for at in range(len(before) - 1, -1, -1):  # the record the next lines may continue, and its writer
        line = before[at]
        if not line.strip():
            break
        ident = parse_prefixes(line)
        if ident.has_identity():
            need = min(need, at)
            break
        if not (is_continuation(line) or is_continuation(ident.text)):
            break
    return before[need:]
