"""The job: hosts, ranks, clocks, process groups, software versions.

Nothing here knows how a log is laid out or how a failure unfolds; it only says who runs where.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

# (torch, nccl, cuda, first day of the era as epoch seconds, last day)
_DAY = 86400
_ERAS = {
    "1.13": ("2.14.3", "11.7", 1669852800, 1688169600),   # 2022-12 .. 2023-07
    "2.0": ("2.14.3", "11.8", 1680307200, 1698796800),    # 2023-04 .. 2023-11
    "2.1": ("2.18.1", "12.1", 1698796800, 1711929600),    # 2023-11 .. 2024-04
    "2.2": ("2.19.3", "12.1", 1706745600, 1719792000),    # 2024-02 .. 2024-07
    "2.3": ("2.20.5", "12.1", 1714521600, 1727740800),    # 2024-05 .. 2024-10
    "2.4": ("2.20.5", "12.4", 1722470400, 1735689600),    # 2024-08 .. 2025-01
    "2.5": ("2.21.5", "12.4", 1730419200, 1743465600),    # 2024-11 .. 2025-04
    "2.6": ("2.21.5", "12.6", 1738368000, 1751328000),    # 2025-02 .. 2025-07
    "2.7": ("2.26.2", "12.8", 1746057600, 1759276800),    # 2025-05 .. 2025-10
}
TORCH_VERSIONS = tuple(_ERAS)

# GPU bus ids of common 8-GPU baseboards, by local rank.
_BUS = {
    "a100": ("07", "0f", "47", "4e", "87", "90", "b7", "bd"),
    "h100": ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db"),
    "pcie": ("1b", "1c", "3d", "3e", "88", "89", "b1", "b2"),
    "gb200": ("01", "02", "41", "42"),
}
_GPU_NAME = {"a100": "NVIDIA A100-SXM4-80GB", "h100": "NVIDIA H100 80GB HBM3",
             "pcie": "NVIDIA L40S", "gb200": "NVIDIA GB200"}
_GPU_MEM = {"a100": 79.15, "h100": 79.11, "pcie": 44.39, "gb200": 184.0}


@dataclass
class Host:
    name: str
    ip: str
    node_rank: int
    skew: float           # seconds this host's clock is ahead of true time
    uptime0: float        # kernel uptime at the job's t0 (dmesg's [ 12345.678901])
    agent_pid: int
    pod: str | None = None  # the container hostname when the job runs in Kubernetes


@dataclass
class Group:
    """One process group as a rank sees it."""
    kind: str       # default, tp, pp, dp
    pg_id: int      # torch's local PG id (same for every rank that holds this kind)
    guid: int       # distinct per group instance
    desc: str       # torch >= 2.4 group_desc
    ranks: list[int]
    nccl_comm: str = ""

    def rank_in(self, r: int) -> int:
        return self.ranks.index(r)


@dataclass
class Job:
    rng: random.Random
    name: str
    slurm_id: int
    world: int
    gpn: int
    gpu: str
    hosts: list[Host]             # index = node_rank
    torch: str
    nccl: str
    cuda: str
    t0: float                     # true epoch seconds of the job start
    tz: int                       # hours; app-level stamps are local time
    tp: int
    pp: int
    dp: int
    timeout_ms: int
    pids: list[int] = field(default_factory=list)
    ib: bool = True
    nccl_debug: bool = False
    pg_desc: bool = False         # subgroups carry a description (Megatron >= core 0.9 on torch >= 2.4)
    python: str = "3.10"
    site: str = "/usr/local/lib/python3.10/dist-packages"

    @property
    def tv(self) -> tuple[int, int]:
        """The torch version as a comparable tuple: (2, 4)."""
        a, b = self.torch.split(".")
        return int(a), int(b)

    @property
    def nv(self) -> tuple[int, int]:
        a, b, _ = self.nccl.split(".")
        return int(a), int(b)

    # ---- who runs where -------------------------------------------------------------------
    def host_of(self, r: int) -> Host:
        return self.hosts[r // self.gpn]

    def local(self, r: int) -> int:
        return r % self.gpn

    def ranks_on(self, h: Host) -> range:
        return range(h.node_rank * self.gpn, (h.node_rank + 1) * self.gpn)

    def bus(self, r: int) -> str:
        return _BUS[self.gpu][self.local(r)]

    @property
    def gpu_name(self) -> str:
        return _GPU_NAME[self.gpu]

    @property
    def gpu_mem(self) -> float:
        return _GPU_MEM[self.gpu]

    def me(self, h: Host) -> str:
        """The name the processes on `h` see as their own host name (the pod's, in Kubernetes)."""
        return h.pod or h.name

    # ---- clocks ------------------------------------------------------------------------------
    def local_t(self, h: Host, t: float) -> float:
        """What a local-time stamp printed on `h` at true time `t` says (as a naive epoch)."""
        return t + h.skew + self.tz * 3600

    def utc_t(self, h: Host, t: float) -> float:
        return t + h.skew

    # ---- Megatron-style coordinates: tp fastest, then dp, pp slowest ---------------------------
    def coords(self, r: int) -> tuple[int, int, int]:
        tp_i = r % self.tp
        dp_i = (r // self.tp) % self.dp
        pp_i = r // (self.tp * self.dp)
        return tp_i, dp_i, pp_i

    def groups(self, r: int) -> list[Group]:
        """The process groups rank r belongs to: the default one first."""
        tp_i, dp_i, pp_i = self.coords(r)
        out = [Group("default", 0, 0, "default_pg", list(range(self.world)))]
        n_tp = self.dp * self.pp
        tp_idx = dp_i + self.dp * pp_i
        if self.tp > 1:
            base = tp_idx * self.tp * 1
            out.append(Group("tp", 1, 1 + tp_idx, "TENSOR_MODEL_PARALLEL_GROUP",
                             [base + i for i in range(self.tp)]))
        if self.pp > 1:
            pp_idx = tp_i + self.tp * dp_i
            out.append(Group("pp", 2, 1 + n_tp + pp_idx, "PIPELINE_MODEL_PARALLEL_GROUP",
                             [tp_i + self.tp * (dp_i + self.dp * s) for s in range(self.pp)]))
        if self.dp > 1 and (self.tp > 1 or self.pp > 1):
            dp_idx = tp_i + self.tp * pp_i
            out.append(Group("dp", 3, 1 + 2 * n_tp + dp_idx, "DATA_PARALLEL_GROUP",
                             [tp_i + self.tp * (d + self.dp * pp_i) for d in range(self.dp)]))
        return out

    def group(self, r: int, kind: str) -> Group:
        for g in self.groups(r):
            if g.kind == kind:
                return g
        return self.groups(r)[0]

    @property
    def grad_kind(self) -> str:
        """The group the gradient reduction runs on."""
        return "dp" if self.dp > 1 and (self.tp > 1 or self.pp > 1) else "default"


# ---- host naming ---------------------------------------------------------------------------------

def _host_names(rng: random.Random, n: int, gpu: str) -> tuple[list[str], list[str], str]:
    """n host names (in the scheduler's order: Slurm's node list is numerically sorted) and their IPs."""
    scheme = rng.choice(["node", "gpu", "aws", "dgx", "rack", "a3"])
    pool = rng.randint(n, n * 3)
    nums = sorted(rng.sample(range(1, pool + 40), n))
    sub = rng.randint(0, 3)
    names: list[str] = []
    ips: list[str] = []
    for i, k in enumerate(nums):
        a, b = 10 + sub, (k // 250) + 1
        c = k % 250 + 2
        ip = f"10.{a}.{b}.{c}"
        if scheme == "node":
            name = f"node{k}"
        elif scheme == "gpu":
            name = f"gpu-{gpu}-{k:04d}"
        elif scheme == "aws":
            name = f"ip-10-{a}-{b}-{c}"
        elif scheme == "dgx":
            name = f"dgx-{gpu}-{k:02d}" if k < 100 else f"dgx-{gpu}-{k}"
        elif scheme == "rack":
            name = f"compute-{k // 16 + 1}-{k % 16}"
        else:
            name = f"a3mega-{k:04d}"
        names.append(name)
        ips.append(ip)
        del i
    return names, ips, scheme


def make_job(rng: random.Random, world: int, index: int, torch_v: str | None = None,
             start: float | None = None) -> Job:
    torch_v = torch_v or rng.choice(TORCH_VERSIONS)
    nccl, cuda, lo, hi = _ERAS[torch_v]
    if torch_v == "2.1" and rng.random() < 0.5:
        nccl = "2.18.6"
    gpu = rng.choice(["a100", "a100", "h100", "h100", "pcie"] + (["gb200"] if torch_v in ("2.6", "2.7") else []))
    gpn = 4 if gpu == "gb200" else 8
    n_hosts = world // gpn
    names, ips, _scheme = _host_names(rng, n_hosts, gpu)
    # Who is node_rank 0? Slurm's SLURM_NODEID follows the sorted node list; an elastic (c10d) rendezvous
    # hands out group ranks in arrival order.
    order = list(range(n_hosts))
    if rng.random() < 0.35:
        rng.shuffle(order)
    t0 = float(rng.randint(lo, hi - 2 * _DAY)) + rng.random()
    if start is not None:  # pinned: all jobs start within a day of `start`
        t0 = start + (t0 - lo) % _DAY  # no extra draw: the same jobs as without --start-date, other dates
    tz = rng.choice([0, 0, 0, -7, -5, 1, 8, 9])
    hosts: list[Host] = []
    skewed = set(rng.sample(range(n_hosts), k=min(n_hosts, rng.randint(1, 6))))
    for nr, idx in enumerate(order):
        skew = rng.choice([-1, 1]) * rng.uniform(2.0, 15.0) if idx in skewed else rng.gauss(0.0, 0.08)
        hosts.append(Host(names[idx], ips[idx], nr, skew, rng.uniform(2e4, 4e6), rng.randint(2000, 400000)))
    tp = rng.choice([1, 1, 2, 4, 8]) if gpn == 8 else rng.choice([1, 2, 4])
    pp = rng.choice([1, 1, 2, 4, 8])
    while world % (tp * pp):
        pp //= 2
    dp = world // (tp * pp)
    pids: list[int] = []
    for h in hosts:
        base = h.agent_pid + rng.randint(30, 400)
        pids.extend(base + i for i in range(gpn))
    old = torch_v in ("1.13", "2.0", "2.1", "2.2", "2.3")
    py = rng.choice(["3.8", "3.9", "3.10", "3.10", "3.11"] if old else ["3.10", "3.11", "3.12"])
    site = rng.choice([
        f"/usr/local/lib/python{py}/dist-packages",
        f"/opt/conda/lib/python{py}/site-packages",
        f"/home/svc-train/.venv/lib/python{py}/site-packages",
        "/usr/lib/python3/dist-packages" if py == "3.10" else f"/opt/conda/lib/python{py}/site-packages",
    ])
    timeout = rng.choice([600000, 600000, 1800000, 1800000, 900000, 3600000])
    if torch_v == "1.13" and rng.random() < 0.7:
        timeout = 1800000
    return Job(
        rng=rng, name=f"job{index:03d}", slurm_id=rng.randint(100000, 9999999), world=world, gpn=gpn, gpu=gpu,
        hosts=hosts, torch=torch_v, nccl=nccl, cuda=cuda, t0=t0, tz=tz, tp=tp, pp=pp, dp=dp, timeout_ms=timeout,
        pids=pids, ib=rng.random() < 0.8, nccl_debug=rng.random() < 0.45, python=py, site=site,
        pg_desc=rng.random() < 0.5,
    )
