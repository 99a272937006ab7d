"""Failure lines taken from the rule library's own examples: stripped of the identity and time they carried,
then given the simulated process's."""

from __future__ import annotations

import re
from dataclasses import dataclass

from correlator.diagnosis.rules import Rule
from correlator.tooling.simulate.job import Process
from ingest.prefixes import parse_prefixes

_LEADING_TS = [
    # rsyslog / ISO, python logging
    re.compile(r"^\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?\s*(?:-\s+)?(?:\S+\s+kernel:\s*)?"),
    # syslog traditional: "Dec  6 18:44:10 node04 kernel: "
    re.compile(r"^[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \S+ (?:kernel: )?"),
    # dmesg: "[12345.678901] " and "[Fri Dec  6 18:44:10 2024] "
    re.compile(r"^\[\s*\d+\.\d+\]\s*"),
    re.compile(r"^\[[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \d{4}\]\s*"),
    re.compile(r"^kernel:\s*"),
]
# python logging's "LEVEL - logger - " / "logger - LEVEL - " / "[LEVEL] " header once the time is gone
_PYLOG_HEADER = re.compile(
    r"^(?:\[?(?P<a>DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\]?\s*[-:|]\s*(?:[\w.]+\s*[-:|]\s+)?"
    r"|[\w.]+\s+-\s+(?P<b>DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\s+-\s+)"
)
_GLOG = re.compile(r"^\[?(?P<level>[IWEF])\d{3,4} \d\d:\d\d:\d\d\.\d+(?: +\d+)? (?P<srcloc>[^\]\s]+:\d+)\]\s?")
_RANK_PREFIX = re.compile(
    r"^(?:\[(?:rank|default)\d+\]:\s?|\[\d+,mpirank:\d+,[^\]]*\]<\w+>:\s?|\d+:\s(?=\S)"
    r"|\((?:\w+ )?(?:pid|rank)=[^)]*\)\s*|\S+:\d+:\d+ \[\d+\] )"
)
KERNEL_HINT = re.compile(r"NVRM:|\bkernel:|Out of memory: Killed process|oom-kill|oom_reaper|\bmlx5_core\b|\bpcieport\b|AER:")
# Lines the launcher (torchrun agent, deepspeed launcher) writes about a worker, not the worker itself.
LAUNCHER_LINE = re.compile(r"^\[launch\.py:\d+:\w+\]|^\[\d+\] \[launch\.py|sigkill_handler")
NCCL_LOG = re.compile(r"^NCCL (?:WARN|INFO|ERROR)\b")
EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Interrupt|Exit)\b:?")


@dataclass(frozen=True)
class FailureText:
    """One failure line, stripped of the identity and time it carried in the rule's example."""

    text: str
    kernel: bool
    glog_level: str | None = None
    glog_srcloc: str | None = None
    pylog_level: str | None = None  # the example came through python logging at this level (I/W/E/F)


def strip_identity(line: str) -> str:
    """The line without identity prefixes: the ingest parser's, then the writers' prefixes examples carry."""
    line = parse_prefixes(line).text
    # What the shared parser leaves as message text but examples carry as a writer's prefix.
    for _ in range(4):
        m = _RANK_PREFIX.match(line)
        if not m:
            break
        line = line[m.end() :]
    return line


def split_example(line: str) -> FailureText:
    kernel = bool(KERNEL_HINT.search(line))
    text = line.strip()
    level = srcloc = None
    # Own patterns first: a torch/glog header's level and source location are kept for re-rendering,
    # and the shared prefix parser would consume them.
    changed = True
    while changed:
        changed = False
        for pattern in (_RANK_PREFIX, *_LEADING_TS):
            m = pattern.match(text)
            if m and m.end() > 0:
                text, changed = text[m.end() :], True
        m = _GLOG.match(text)
        if m:
            level, srcloc = m.group("level"), m.group("srcloc")
            text, changed = text[m.end() :], True
    text = strip_identity(text)
    pylog = None
    if not kernel and (m3 := _PYLOG_HEADER.match(text)) and m3.end() < len(text):
        name = m3["a"] or m3["b"]
        pylog = {"DEBUG": "I", "INFO": "I", "WARNING": "W", "WARN": "W", "ERROR": "E", "CRITICAL": "F"}[name]
        text = text[m3.end() :]
    return FailureText(text=text.strip(), kernel=kernel, glog_level=level, glog_srcloc=srcloc, pylog_level=pylog)


def replace_group(text: str, rule: Rule, name: str, value: str) -> str:
    """`text` with the first match of the rule's named group `name` replaced by `value`."""
    for pattern in [*rule.extract, *rule.patterns]:
        try:
            m = re.search(pattern, text, re.IGNORECASE if rule.caseless else 0)
        except re.error:
            continue
        if m and m.groupdict().get(name) is not None:
            start, end = m.span(name)
            return text[:start] + value + text[end:]
    return text


def blames_another_rank(text: str, rule: Rule) -> bool:
    """Whether the rule reads, from this line, a rank other than the writer's as the culprit (`blame_rank`)."""
    for pattern in [*rule.patterns, *rule.extract]:
        try:
            m = re.search(pattern, text, re.IGNORECASE if rule.caseless else 0)
        except re.error:
            continue
        if m and m.groupdict().get("blame_rank") is not None:
            return True
    return False


def substitute_identity(text: str, rule: Rule, proc: Process, blamed: Process | None = None) -> str:
    """Put the simulated process's identity where the rule extracts rank/local_rank/gpu/pid
    (and `blamed`'s rank where it extracts the rank the line blames)."""
    values = {"rank": str(proc.rank), "local_rank": str(proc.local_rank), "pid": str(proc.pid)}
    if blamed is not None:
        values["blame_rank"] = str(blamed.rank)
    spans: list[tuple[int, int, str]] = []
    for pattern in [*rule.patterns, *rule.extract]:
        try:
            compiled = re.compile(pattern, re.IGNORECASE if rule.caseless else 0)
        except re.error:
            continue
        m = compiled.search(text)
        if not m:
            continue
        for name in compiled.groupindex:
            start, end = m.span(name)
            if start < 0:
                continue
            current = m.group(name)
            if name in values and current.isdigit():
                spans.append((start, end, values[name]))
            elif name == "gpu" and current.isdigit():
                spans.append((start, end, proc.gpu))
    spans.sort()
    out, pos = [], 0
    for start, end, value in spans:
        if start < pos:
            continue
        out.append(text[pos:start])
        out.append(value)
        pos = end
    out.append(text[pos:])
    result = "".join(out)
    if KERNEL_HINT.search(result):
        # Kernel lines name the process and device by pid and PCI address, not by rank.
        result = re.sub(r"\bpid=\d+", f"pid={proc.pid}", result)
        result = re.sub(r"Killed process \d+", f"Killed process {proc.pid}", result)
        result = re.sub(r"\b(PCI:)?0000:[0-9a-fA-F]{2}:00\b", lambda m: f"{m[1] or ''}0000:{proc.bus}:00", result)
    return result

