"""The job's layout: hosts, their clock skew, and the ranks on them (pid, local rank, GPU, PCI bus)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

_BUS_IDS = ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db")


@dataclass(frozen=True)
class Process:
    rank: int
    host: str
    host_index: int
    local_rank: int
    pid: int
    bus: str

    @property
    def gpu(self) -> str:
        return str(self.local_rank)


@dataclass
class Host:
    name: str
    index: int
    skew: float
    agent_pid: int
    procs: list[Process] = field(default_factory=list)



def lay_out_hosts(rng: random.Random, *, world_size: int, hosts: int, skew_max_s: float) -> list[Host]:
    """`world_size` ranks spread evenly over `hosts` in rank order; each host's clock is off by up to
    +-skew_max_s."""
    per_host = world_size // hosts
    width = max(2, len(str(hosts - 1)))
    out: list[Host] = []
    for h in range(hosts):
        skew = 0.0 if skew_max_s <= 0 else round(rng.uniform(-skew_max_s, skew_max_s), 3)
        agent_pid = rng.randint(2_000, 90_000)
        host = Host(name=f"node{h:0{width}d}", index=h, skew=skew, agent_pid=agent_pid)
        for lr in range(per_host):
            bus = _BUS_IDS[lr] if lr < len(_BUS_IDS) else f"{0x10 + lr * 0x11 & 0xff:02x}"
            host.procs.append(Process(h * per_host + lr, host.name, h, lr, agent_pid + 24 + lr, bus))
        out.append(host)
    return out
