"""Who a signal is about, when its own line does not say: the job's identity tables, then launchers' reports.

- NCCL's init line ties host:pid and the GPU's bus id to the rank (job-wide communicator only), so a
  kernel Xid line that names a PCI bus id on a host maps to the rank that used that GPU there.
- A line naming rank, host and local rank together ties that host's local rank to the rank.
- Launchers report which process failed (torchelastic's "failed (exitcode: N) local_rank: K (pid: P)" and
  its summary, mpirun's "process rank N with PID P on node H"). That is evidence, not truth: it fills the
  who of a failure line that names nobody, when exactly one process was reported failed; torchelastic's
  "Root Cause (first observed failure)" is the first *exit* it saw, often a victim, so a report never
  replaces the identity a cause line gives.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from correlator.diagnosis.engine.facts import JobFacts, normalize_bus_id
from correlator.diagnosis.engine.keys import node_of
from correlator.diagnosis.models import Signal

WHO = ("rank", "local_rank", "host", "pid", "gpu")


class IdentityResolver:
    """Global ranks for lines that name only a local rank, a pid or a GPU on their node, from one job's facts.

    In order: a line that tied the same node and local rank or pid to a rank; a launcher's report that tied
    the pid to a local rank; the node's base rank (torchrun, mp.spawn and srun's block distribution give a
    node's processes consecutive ranks, so one tie on a node, rank minus local rank, places all of them);
    the one block of ranks no other node holds (world size / processes per node blocks, every other node's
    base known); on a job of one launcher whose lines tie no local rank to another rank, the local rank
    itself. Last, with no tie anywhere, nodes in the order of their names hold consecutive blocks: what
    static rendezvous and Slurm's node lists give, a guess the incident says it made.
    """

    def __init__(self, facts: JobFacts) -> None:
        self.facts = facts
        self.bases: dict[str, int] = {}
        self.guessed: set[str] = set()
        self._place_nodes()
        self._hosts_of: dict[int, set[str]] = {}
        for key, rank in facts.identity.items():
            node = key.rpartition("|")[0]
            if node and not node.startswith("f:") and key not in facts.conflicts:
                self._hosts_of.setdefault(rank, set()).add(node)

    def host_of(self, rank: int) -> str | None:
        """The host a global rank ran on, when a line tied it to one (one host only)."""
        hosts = self._hosts_of.get(rank)
        return next(iter(hosts)) if hosts is not None and len(hosts) == 1 else None

    def rank_of(self, node: str, local: int | None, pid: int | None) -> int | None:
        facts = self.facts
        keys = []
        if pid is not None:
            keys.append(f"{node}|p{pid}")
            if local is None:
                local = facts.local_of.get(f"{node}|p{pid}")
        if local is not None:
            keys.append(f"{node}|l{local}")
        for key in keys:
            if key in facts.identity and key not in facts.conflicts:
                return facts.identity[key]
        if local is None:
            return None
        base = self.bases.get(node)
        if base is not None:
            return base + local
        return local if self.single_launcher() else None

    def single_launcher(self) -> bool:
        """One launcher numbers every process of the job: one node wrote local ranks or pids (or only files
        with no host name did, a console and a --log-dir tree of the same machine, and the world when known is
        no larger than their local ranks), and no line tied a local rank to another rank."""
        facts = self.facts
        if not facts.nodes or not facts.local_is_rank or facts.conflicts:
            return False
        named = [n for n in facts.nodes if not n.startswith("f:")]
        if len(named) > 1 or (named and len(facts.nodes) > 1):
            return False
        if len(facts.nodes) == 1:
            # One node in all the logs: its launcher numbered the job unless a line tied one of its local ranks
            # to another rank (then these are one node's logs of several). Neither a world size larger than
            # the local ranks seen nor higher ranks named say otherwise: a launcher's lines name only the
            # local ranks that failed, and a peer's line may name any rank.
            return True
        highest = max(facts.nodes.values())
        return facts.world_size is None or highest < 0 or facts.world_size <= highest + 1

    def _place_nodes(self) -> None:
        facts = self.facts
        offsets: dict[str, set[int]] = {}
        for key, rank in facts.identity.items():
            node, _, who = key.rpartition("|")
            if who[:1] == "l" and who[1:].isdigit() and key not in facts.conflicts:
                offsets.setdefault(node, set()).add(rank - int(who[1:]))
        self.bases = {node: next(iter(found)) for node, found in offsets.items() if len(found) == 1}
        if self.single_launcher():
            return
        # Nodes of one kind only: hosts, or files with no host name (a host's console and its --log-dir tree
        # are one machine's; blocks are not shared out between them).
        named = [n for n in facts.nodes if not n.startswith("f:")]
        nodes = sorted(named or facts.nodes, key=_natural)
        if len(nodes) < 2 or (named and len(named) != len(facts.nodes)):
            return
        size = max(facts.nodes[n] for n in nodes) + 1
        if size < 1 or any(base % size for base in self.bases.values()):
            return  # not blocks of one size: nothing to infer
        world = facts.world_size or size * len(nodes)
        if world != size * len(nodes):
            return
        free = sorted(set(range(0, world, size)) - set(self.bases.values()))
        unknown = [n for n in nodes if n not in self.bases]
        if len(unknown) != len(free) or not unknown:
            return
        known_order = [self.bases[n] for n in nodes if n in self.bases]
        if len(unknown) > 1 and known_order != sorted(known_order):
            return  # the names' order is not the ranks' order here: no guess
        for node, base in zip(unknown, free, strict=True):
            self.bases[node] = base
            if len(unknown) > 1:
                self.guessed.add(node)


def _natural(name: str) -> tuple[object, ...]:
    """Names in their natural order: node2 before node10."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name))


def fill_identity(signal: Signal, resolver: IdentityResolver) -> Signal:
    """The signal with its global rank when its line names only a local rank, a pid or a GPU on its node, and
    the job's identity tables place it (`IdentityResolver`; a kernel Xid line's bus id through NCCL's init
    lines); and with its host when it names a rank that a line tied to one host."""
    if signal.rank is not None:
        if signal.host is None and (host := resolver.host_of(signal.rank)) is not None:
            return signal.model_copy(update={"host": host})
        return signal
    node = node_of(signal)
    local = signal.local_rank
    if local is None and signal.gpu is not None and signal.gpu.isdigit():
        local = int(signal.gpu)  # a device index: torchrun and the DeepSpeed launcher give local rank N device N
    rank = resolver.rank_of(node, local, signal.pid)
    if rank is None and signal.host and signal.gpu and ":" in signal.gpu:
        rank = resolver.facts.identity.get(f"{node}|b{normalize_bus_id(signal.gpu)}")
    return signal if rank is None else signal.model_copy(update={"rank": rank})


def is_failure_report(signal: Signal, tags: frozenset[str] = frozenset()) -> bool:
    """A launcher's line about one process that exited with an error or on a signal (not the SIGTERM the
    launcher itself sent while tearing the others down), or a line of its failure summary (`tags` of the
    rule: `failure-report`)."""
    if "failure-report" in tags:
        return True
    code = signal.fields.get("exitcode")
    if isinstance(code, int):
        return code not in (0, -15, 143)
    sig = signal.fields.get("signal")
    return isinstance(sig, (int, str)) and str(sig) not in ("15", "SIGTERM", "")


def named_by_reports(primary: Signal, reports: Sequence[Signal]) -> tuple[Signal, str]:
    """The primary with who-fields filled from the launchers' reports, when they name exactly one process
    consistent with what the primary says; and a note for the incident's reason ('' if nothing was used)."""
    if all(getattr(primary, f) is not None for f in WHO if f != "gpu"):
        return primary, ""
    consistent = [r for r in reports if r is not primary and _consistent(primary, r)]
    if not consistent or not all(_consistent(a, b) for a in consistent for b in consistent):
        return primary, ""  # none, or reports of two different processes: they do not say who
    # The lines of one summary (host, rank, exit code and pid on lines of their own) tell one process.
    told = {f: next((getattr(r, f) for r in consistent if getattr(r, f) is not None), None) for f in WHO}
    update = {f: v for f, v in told.items() if getattr(primary, f) is None and v is not None}
    if not update:
        return primary, ""
    rules = ", ".join(sorted({r.rule_id for r in consistent}))
    return primary.model_copy(update=update), f"who failed from the launcher's report ({rules})"


def _consistent(a: Signal, b: Signal) -> bool:
    for field in WHO:
        va, vb = getattr(a, field), getattr(b, field)
        if va is not None and vb is not None and va != vb:
            return False
    return True


def corroborated(primary: Signal, matches: Sequence[Signal]) -> Signal:
    """Fill who-fields the initiating line lacks from the next line of the same class that has them.

    "Unexpected bus error encountered in worker" names nobody; the "DataLoader worker (pid 325) is
    killed by signal: Bus error" line right after it names the process.
    """
    if all(getattr(primary, f) is not None for f in WHO):
        return primary
    for s in matches:
        # Only the same file tells the same failure twice: another host's line lends no identity.
        if s is primary or s.class_ != primary.class_ or s.file != primary.file or s.order < primary.order:
            continue
        if not _consistent(primary, s):
            continue  # a different process: not the same failure told twice
        update = {f: getattr(s, f) for f in WHO if getattr(primary, f) is None and getattr(s, f) is not None}
        if update:
            return primary.model_copy(update=update)
    return primary
