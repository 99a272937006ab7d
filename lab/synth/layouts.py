"""How clusters lay a job's output out on disk.

Records (see sim.py) go to files by who wrote them; within a file, lines are in the order they were
*written* (a block-buffered stdout reaches the file late), and each line gets the prefixes the capture
adds: torchrun's --tee ([default3]:), srun -l's task label, pdsh's host, OpenMPI's --tag-output,
kubectl's --timestamps.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from lab.synth import clock
from lab.synth.cluster import Job
from lab.synth.sim import Profile, Rec

# layout -> launchers it fits
LAYOUTS = {
    "per_rank": ("torchrun", "srun", "deepspeed", "mpirun"),
    "host_console": ("torchrun", "deepspeed"),
    "slurm_single": ("srun",),
    "logdir": ("torchrun",),
    "k8s": ("k8s",),
    "interleaved": ("torchrun", "deepspeed", "mpirun"),
}
RANK_NAMES = ("flat4", "hostdir", "worker", "train", "slurm_t")


def write(out: Path, job: Job, prof: Profile, recs: list[Rec], variant: str, host_names: list[list[str]]) -> int:
    """Writes the job's files under `out`; returns the number of lines written."""
    files: dict[str, list[tuple[float, int, str]]] = defaultdict(list)
    w = len(str(job.world - 1))
    wn = len(str(len(job.hosts) - 1))
    slurm_out = f"slurm-{job.slurm_id}.out"
    kdir = variant.split("+")[1] if "+" in variant else "kernel"

    def hname(attempt: int, nr: int) -> str:
        return host_names[min(attempt, len(host_names) - 1)][nr]

    def kernel_file(attempt: int, nr: int) -> str:
        hn = hname(attempt, nr)
        return {"kernel": f"kernel/{hn}.log", "dmesg": f"dmesg/dmesg-{hn}.txt",
                "syslog": f"syslog/{hn}/kern.log", "journal": f"nodes/{hn}/journal-k.log"}[kdir]

    def tee(r: int) -> str:
        return f"[{prof.role}{job.local(r)}]:" if prof.tee else ""

    base = variant.split("+")[0]
    for tw, n, nr, r, kind, err, lines, attempt in recs:
        if not lines:
            continue
        h = job.hosts[nr]
        if kind == "kernel":
            for i, ln in enumerate(lines):
                files[kernel_file(attempt, nr)].append((tw, n * 1000 + i, ln))
            continue
        if kind in ("srun", "head"):
            target = {"k8s": "launcher/launcher.log", "interleaved": "combined.log"}.get(prof.layout, slurm_out)
            if prof.launcher == "deepspeed" and prof.layout != "interleaved":
                target = "deepspeed_launcher.log"
            for i, ln in enumerate(lines):
                files[target].append((tw, n * 1000 + i, ln))
            continue
        if kind == "stepd":
            target = slurm_out if prof.layout != "interleaved" else "combined.log"
            pre = f"{nr:>{wn}}: " if prof.layout == "slurm_single" and prof.per_node_srun and base == "label" else ""
            for i, ln in enumerate(lines):
                files[target].append((tw, n * 1000 + i, pre + ln))
            continue
        hn = hname(attempt, nr)
        if prof.layout == "per_rank":
            if kind == "agent":
                target = {"torchrun": f"launcher/{hn}.log", "deepspeed": f"launcher/{hn}.log"}.get(
                    prof.launcher, slurm_out)
                pre = ""
            else:
                target = {"flat4": f"rank_{r:04d}.log", "hostdir": f"logs/{hn}/rank{r}.out",
                          "worker": f"worker-{r}.log", "train": f"train-{r}.txt",
                          "slurm_t": f"logs/{job.slurm_id}/{r}.out"}[base]
                pre = ""
        elif prof.layout == "host_console":
            target = {"byname": f"{hn}.log", "byindex": f"node-{nr:03d}.log",
                      "nested": f"console/{hn}/stdout.txt"}[base]
            pre = tee(r) if kind == "rank" else ""
        elif prof.layout == "slurm_single":
            target = slurm_out
            if prof.per_node_srun:
                lab = f"{nr:>{wn}}: " if base == "label" else ""
                pre = lab + (tee(r) if kind == "rank" else "")
            else:
                pre = f"{r:>{w}}: " if base == "label" else ""
        elif prof.layout == "logdir":
            if kind == "agent":
                target = f"{hn}/torchrun.log"
            else:
                rid = f"{job.slurm_id}_{(job.slurm_id * 7919 + nr * 104729 + attempt) % 0xffffff:06x}"
                target = (f"{hn}/torchelastic/{rid}/attempt_{attempt}/{job.local(r)}/"
                          f"{'stderr' if err else 'stdout'}.log")
            pre = ""
        elif prof.layout == "k8s":
            target = f"pods/{job.name}-{'master' if nr == 0 else 'worker'}-{0 if nr == 0 else nr - 1}.log"
            pre = tee(r) if kind == "rank" else ""
            for i, ln in enumerate(lines):
                stamp = clock.rfc3339_nano_utc(job.utc_t(h, tw) + i * 1e-6)
                files[target].append((tw, n * 1000 + i, f"{stamp} {pre}{ln}"))
            continue
        else:  # interleaved
            target = "combined.log"
            if base == "mpi":
                pre = f"[1,{r}]<{'stderr' if err else 'stdout'}>:" if kind == "rank" else ""
            elif base == "pdsh":
                pre = f"{hn}: "
            elif base == "agg":
                for i, ln in enumerate(lines):
                    stamp = clock.rfc3339_nano_utc(job.utc_t(h, tw) + i * 1e-6)
                    files[target].append((tw, n * 1000 + i, f"{stamp} {hn} {ln}"))
                continue
            else:
                pre = ""
        for i, ln in enumerate(lines):
            files[target].append((tw, n * 1000 + i, pre + ln))
    total = 0
    for name, entries in files.items():
        entries.sort()
        p = out / name
        p.parent.mkdir(parents=True, exist_ok=True)
        with open(p, "w", encoding="utf-8") as fh:
            fh.write("\n".join(e[2] for e in entries))
            fh.write("\n")
        total += len(entries)
    return total


def variants(layout: str) -> tuple[str, ...]:
    return {
        "per_rank": RANK_NAMES,
        "host_console": ("byname", "byindex", "nested"),
        "slurm_single": ("label", "label", "nolabel"),
        "logdir": ("tree",),
        "k8s": ("pods",),
        "interleaved": ("mpi", "pdsh", "agg", "none"),
    }[layout]
