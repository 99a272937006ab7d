"""What the libraries print, by version.

Sources (read from upstream, not from rootrank): torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp and
the logs users pasted of torch 1.13 .. 2.7; torch/distributed/elastic (agent, multiprocessing api,
errors); NCCL src/debug.cc, init.cc, transport/net_ib.cc, misc/socket.cc (v2.14 .. v2.26); the NVIDIA
driver's Xid lines as kernel logs carry them; Slurm src/srun/launch.c, slurmstepd/req.c,
task_cgroup_memory.c; DeepSpeed utils/logging.py and launcher/launch.py; Megatron-LM training.py,
checkpointing.py, rerun_state_machine.py, core/utils.py (straggler detector).
"""

from __future__ import annotations

from lab.synth import clock
from lab.synth.cluster import Group, Host, Job

# ============================================================== torch C++ (glog-style) lines

# ProcessGroupNCCL.cpp line numbers by version (plausible, from the pasted logs)
_K = ("wd", "some", "avoid", "term", "exc", "tat", "hb", "stack", "dump", "first", "asyncx")
_LN = {v: dict(zip(_K, nums, strict=True)) for v, nums in {
    (1, 13): (737, 414, 414, 916, 0, 0, 0, 0, 0, 0, 0),
    (2, 0): (474, 488, 494, 915, 0, 0, 0, 0, 0, 0, 0),
    (2, 1): (475, 489, 495, 916, 0, 0, 0, 0, 0, 0, 0),
    (2, 2): (523, 537, 543, 1182, 0, 0, 0, 0, 0, 0, 506),
    (2, 3): (563, 577, 583, 1414, 1537, 1582, 1316, 0, 1153, 0, 542),
    (2, 4): (607, 621, 627, 1515, 1664, 1709, 1306, 0, 1604, 0, 586),
    (2, 5): (616, 630, 636, 1601, 1785, 1834, 1390, 0, 1700, 1794, 595),
    (2, 6): (629, 681, 695, 1895, 2168, 0, 1459, 667, 1746, 2106, 609),
    (2, 7): (632, 684, 698, 2033, 2204, 0, 1568, 670, 1987, 2732, 612),
}.items()}


def ln(job: Job, key: str) -> int:
    return _LN[job.tv][key]


def cpp(job: Job, r: int, h: Host, t: float, line: int, level: str = "E", file: str = "ProcessGroupNCCL.cpp") -> str:
    """The header torch's C++ logging puts on a line from rank r."""
    tv = job.tv
    if tv < (2, 2):
        return f"[{level} {file}:{line}] "
    if tv < (2, 4):
        return f"[rank{r}]:[{level} {file}:{line}] "
    return f"[rank{r}]:[{level}{clock.glog(job.local_t(h, t), nanos=True)} {file}:{line}] "


def pg(job: Job, g: Group, r: int) -> str:
    gr = g.rank_in(r)
    tv = job.tv
    if tv < (2, 3):
        return f"[Rank {gr}] "
    if tv < (2, 4):
        return f"[PG {g.pg_id} Rank {gr}] "
    desc = g.desc if (g.kind == "default" or job.pg_desc) else ""
    if tv < (2, 5):
        return f"[PG {g.pg_id} ({desc}) Rank {gr}] " if desc else f"[PG {g.pg_id} Rank {gr}] "
    return (f"[PG ID {g.pg_id} PG GUID {g.guid}({desc}) Rank {gr}] " if desc
            else f"[PG ID {g.pg_id} PG GUID {g.guid} Rank {gr}] ")


def work(job: Job, seq: int, op: str, numel: int, numel_out: int | None = None) -> str:
    if job.tv < (2, 0):
        return f"WorkNCCL(SeqNum={seq}, OpType={op}, Timeout(ms)={job.timeout_ms})"
    out = numel if numel_out is None else numel_out
    return f"WorkNCCL(SeqNum={seq}, OpType={op}, NumelIn={numel}, NumelOut={out}, Timeout(ms)={job.timeout_ms})"


def _frames(job: Job, kind: str, rng_hex: int) -> list[str]:
    lib = f"{job.site}/torch/lib"
    base = 0x7F0000000000 + (rng_hex % 0xFFFFFFFF) * 0x1000
    if kind == "timeout":
        names = [("c10::Error::Error(c10::SourceLocation, std::string) + 0x96", "libc10.so"),
                 (("c10d::ProcessGroupNCCL::WorkNCCL::checkTimeout(std::optional<std::chrono::duration<long, "
                  "std::ratio<1l, 1000l> > >) + 0x1d2"), "libtorch_cuda.so"),
                 ("c10d::ProcessGroupNCCL::watchdogHandler() + 0x233", "libtorch_cuda.so"),
                 ("c10d::ProcessGroupNCCL::ncclCommWatchdog() + 0x10c", "libtorch_cuda.so"),
                 ("<unknown function> + 0xdbbf4", "libstdc++.so.6"),
                 ("<unknown function> + 0x94ac3", "/lib/x86_64-linux-gnu/libc.so.6"),
                 ("clone + 0x44", "/lib/x86_64-linux-gnu/libc.so.6")]
    else:
        names = [("c10::Error::Error(c10::SourceLocation, std::string) + 0x96", "libc10.so"),
                 ("c10::detail::torchCheckFail(char const*, char const*, unsigned int, std::string const&) + 0x64",
                  "libc10.so"),
                 ("c10::cuda::c10_cuda_check_implementation(int, char const*, char const*, int, bool) + 0x118",
                  "libc10_cuda.so"),
                 ("c10d::ProcessGroupNCCL::WorkNCCL::finishedGPUExecutionInternal() const + 0x56",
                  "libtorch_cuda.so"),
                 ("c10d::ProcessGroupNCCL::WorkNCCL::isCompleted() + 0xa0", "libtorch_cuda.so"),
                 ("c10d::ProcessGroupNCCL::watchdogHandler() + 0x1da", "libtorch_cuda.so"),
                 ("c10d::ProcessGroupNCCL::ncclCommWatchdog() + 0x10c", "libtorch_cuda.so"),
                 ("<unknown function> + 0x94ac3", "/lib/x86_64-linux-gnu/libc.so.6")]
    out = []
    for i, (fn, so) in enumerate(names):
        path = so if so.startswith("/") else f"{lib}/{so}"
        out.append(f"frame #{i}: {fn} ({hex(base + i * 0x3a1c0)} in {path})")
    return out


def _exc_from(job: Job, what: str, line: int) -> str:
    src = "/pytorch/torch/csrc/distributed/c10d" if job.tv >= (2, 5) else "../torch/csrc/distributed/c10d"
    return f"Exception raised from {what} at {src}/ProcessGroupNCCL.cpp:{line} (most recent call first):"


def watchdog_timeout(job: Job, r: int, g: Group, t: float, seq: int, op: str, numel: int, ran_ms: int,
                     last_enq: int, last_done: int, with_stack: bool) -> list[str]:
    """What a rank prints when its watchdog times out a collective, then the abort."""
    h = job.host_of(r)
    L = _LN[job.tv]
    w = work(job, seq, op, numel)
    gr = g.rank_in(r)
    wd = f"[Rank {gr}] Watchdog caught collective operation timeout: {w} ran for {ran_ms} milliseconds before timing out."
    tv = job.tv
    out: list[str] = []
    if tv < (2, 0):
        out.append(cpp(job, r, h, t, L["wd"]) + wd)
        out.append(cpp(job, r, h, t, L["some"]) + "Some NCCL operations have failed or timed out. Due to the "
                   "asynchronous nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete "
                   "data. To avoid this inconsistency, we are taking the entire process down.")
        out += ["terminate called after throwing an instance of 'std::runtime_error'", f"  what():  {wd}"]
        return out
    if tv < (2, 2):
        out.append(cpp(job, r, h, t, L["wd"]) + wd)
        out.append(cpp(job, r, h, t, L["some"]) + "Some NCCL operations have failed or timed out. Due to the "
                   "asynchronous nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data.")
        out.append(cpp(job, r, h, t, L["avoid"]) + "To avoid data inconsistency, we are taking the entire process down.")
        term = f"[Rank {gr}] NCCL watchdog thread terminated with exception: {wd}"
        out.append(cpp(job, r, h, t + 0.001, L["term"]) + term)
        out += ["terminate called after throwing an instance of 'std::runtime_error'", f"  what():  {term}"]
        return out
    p = pg(job, g, r)
    out.append(cpp(job, r, h, t, L["wd"]) + wd)
    if L["exc"] and tv < (2, 6):
        out.append(cpp(job, r, h, t + 0.0005, L["exc"]) + p + f"Exception (either an error or timeout) detected by "
                   f"watchdog at work: {seq}, last enqueued NCCL work: {last_enq}, last completed NCCL work: {last_done}.")
        if L["tat"]:
            out.append(cpp(job, r, h, t + 0.0006, L["tat"]) + p + f"Timeout at NCCL work: {seq}, last enqueued NCCL "
                       f"work: {last_enq}, last completed NCCL work: {last_done}.")
    elif L["exc"]:
        out.append(cpp(job, r, h, t + 0.0005, L["exc"]) + p + f" failure detected by watchdog at work sequence id: "
                   f"{seq} PG status: last enqueued work: {last_enq}, last completed work: {last_done}")
        out.append(cpp(job, r, h, t + 0.0006, L["stack"]) + "Stack trace of the failed collective not found, "
                   "potentially because FlightRecorder is disabled. You can enable it by setting "
                   "TORCH_NCCL_TRACE_BUFFER_SIZE to a non-zero value.")
    rk = f"[Rank {gr}] " if tv >= (2, 4) else ""
    out.append(cpp(job, r, h, t + 0.0007, L["some"]) + rk + "Some NCCL operations have failed or timed out. Due to "
               "the asynchronous nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data.")
    out.append(cpp(job, r, h, t + 0.0008, L["avoid"]) + rk + "To avoid data inconsistency, we are taking the entire "
               "process down.")
    if tv < (2, 3):
        term = f"[Rank {gr}] NCCL watchdog thread terminated with exception: {wd}"
    else:
        term = p + f"Process group watchdog thread terminated with exception: {wd}"
    out.append(cpp(job, r, h, t + 0.004, L["term"]) + term)
    stack = [_exc_from(job, "checkTimeout", L["wd"] + 2), *_frames(job, "timeout", r * 7919), ""] if with_stack else []
    out += stack
    out.append("terminate called after throwing an instance of 'c10::DistBackendError'")
    out.append(f"  what():  {term}")
    out += stack
    return out


def dump_signal(job: Job, r: int, g: Group, t: float, source: str, last_enq: int, last_done: int) -> list[str]:
    """torch >= 2.5: a rank told (by its own watchdog or through the store) to dump its flight recorder."""
    h = job.host_of(r)
    L = _LN[job.tv]
    p = pg(job, g, r)
    out = []
    if source == "this local rank" and L["first"]:
        out.append(cpp(job, r, h, t, L["first"]) + p + "First PG on this rank to signal dumping.")
    out.append(cpp(job, r, h, t + 0.3, L["dump"]) + p + f"Received a dump signal due to a collective timeout from "
               f"{source} and we will try our best to dump the debug info. Last enqueued NCCL work: {last_enq}, last "
               f"completed NCCL work: {last_done}.This is most likely caused by incorrect usages of collectives, "
               "e.g., wrong sizes used across ranks, the order of collectives is not same for all ranks or the "
               "scheduled collective, for some reason, didn't run. Additionally, this can be caused by GIL deadlock "
               "or other reasons such as network errors or bugs in the communications library (e.g. NCCL), etc. ")
    return out


def heartbeat(job: Job, r: int, g: Group, t: float, n_work: int) -> list[str]:
    """torch 2.3 .. 2.5: the heartbeat monitor kills a process whose watchdog is stuck."""
    h = job.host_of(r)
    L = _LN[job.tv]
    p = pg(job, g, r)
    secs = 480 if job.tv >= (2, 4) else 600
    return [
        cpp(job, r, h, t, L["hb"]) + p + "Heartbeat monitor timed out! Process will be terminated after dumping "
        f"debug info. workMetaList_.size()={n_work}",
        cpp(job, r, h, t, L["dump"]) + p + "ProcessGroupNCCL preparing to dump debug info.",
        cpp(job, r, h, t + 1.0, L["dump"] + 16, level="F") + p + p + f"ProcessGroupNCCL's watchdog got stuck for "
        f"{secs} seconds without making progress in monitoring enqueued collectives. This typically indicates a "
        "NCCL/CUDA API hang blocking the watchdog, and could be triggered by another thread holding the GIL inside "
        "a CUDA api, or other deadlock-prone behaviors.If you suspect the watchdog is not actually stuck and a "
        "longer timeout would help, you can either increase the timeout (TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC) to a "
        "larger value or disable the heartbeat monitor (TORCH_NCCL_ENABLE_MONITORING=0).If either of aforementioned "
        "helps, feel free to file an issue to PyTorch about the short timeout or false positive abort; otherwise, "
        "please attempt to debug the hang. ",
    ]


def nccl_version_str(job: Job) -> str:
    return f"NCCL version {job.nccl}"


def remote_error(job: Job, r: int, g: Group, t: float, seq: int, op: str, numel: int, peer: Host,
                 port: int, transport: str) -> list[str]:
    """A rank whose NCCL connection to a dead peer breaks: NCCL's WARN, then torch's abort."""
    h = job.host_of(r)
    L = _LN[job.tv]
    gr = g.rank_in(r)
    me = job.me(h)
    pid = job.pids[r]
    tid = pid + 30 + r % 7
    if transport == "ib":
        if job.nv >= (2, 19):
            last = (f"NET/IB : Got completion from peer {peer.ip}<{port}> with status=12 opcode=0 len=0 vendor err 129 "
                    f"(Recv) localGid ::ffff:{h.ip} remoteGids::ffff:{peer.ip}")
        else:
            last = f"NET/IB : Got completion from peer {peer.ip}<{port}> with error 12, opcode 0, len 0, vendor err 129"
        warn = nccl_warn(job, h, r, t - 0.002, "transport/net_ib.cc", 1909 if job.nv >= (2, 21) else 1295, last)
    else:
        peer_name = job.me(peer)
        last = (f"socketProgress: Connection closed by remote peer {peer_name}<{port}>" if job.nv >= (2, 19)
                else f"Net : Connection closed by remote peer {peer.ip}<{port}>")
        warn = nccl_warn(job, h, r, t - 0.002, "misc/socket.cc", 50 if job.nv >= (2, 19) else 486, last)
    err = f"NCCL error: remote process exited or there was a network error, NCCL version {job.nccl}"
    tail = ["ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.",
            "Last error:", last]
    out = list(warn)
    if job.nccl_debug:
        out.append(f"{me}:{pid}:{tid} [{job.local(r)}] NCCL INFO [Service thread] Connection closed by localRank "
                   f"{(job.local(r) + 1) % job.gpn}")
    tv = job.tv
    if tv < (2, 0):
        out.append(cpp(job, r, h, t, L["some"]) + "Some NCCL operations have failed or timed out. Due to the "
                   "asynchronous nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete "
                   "data. To avoid this inconsistency, we are taking the entire process down.")
        out += ["terminate called after throwing an instance of 'std::runtime_error'", f"  what():  {err}", *tail]
        return out
    if tv < (2, 2):
        out.append(cpp(job, r, h, t, L["some"]) + "Some NCCL operations have failed or timed out. Due to the "
                   "asynchronous nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data.")
        out.append(cpp(job, r, h, t, L["avoid"]) + "To avoid data inconsistency, we are taking the entire process down.")
        term = f"[Rank {gr}] NCCL watchdog thread terminated with exception: {err}"
        out += [cpp(job, r, h, t, L["term"]) + term, *tail,
                "terminate called after throwing an instance of 'std::runtime_error'", f"  what():  {term}", *tail]
        return out
    p = pg(job, g, r)
    w = work(job, seq, op, numel)
    out.append(cpp(job, r, h, t, L["asyncx"]) + f"[Rank {gr}] Collective {w} raised the following async exception: "
               f"{err}")
    out += tail
    if L["exc"] and tv < (2, 6):
        out.append(cpp(job, r, h, t, L["exc"]) + p + f"Exception (either an error or timeout) detected by watchdog at "
                   f"work: {seq}, last enqueued NCCL work: {seq}, last completed NCCL work: {seq - 1}.")
    elif L["exc"]:
        out.append(cpp(job, r, h, t, L["exc"]) + p + f" failure detected by watchdog at work sequence id: {seq} PG "
                   f"status: last enqueued work: {seq}, last completed work: {seq - 1}")
    rk = f"[Rank {gr}] " if tv >= (2, 4) else ""
    out.append(cpp(job, r, h, t, L["some"]) + rk + "Some NCCL operations have failed or timed out. Due to the "
               "asynchronous nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data.")
    out.append(cpp(job, r, h, t, L["avoid"]) + rk + "To avoid data inconsistency, we are taking the entire process down.")
    term = (f"[Rank {gr}] NCCL watchdog thread terminated with exception: {err}" if tv < (2, 3)
            else p + f"Process group watchdog thread terminated with exception: {err}")
    out += [cpp(job, r, h, t + 0.002, L["term"]) + term, *tail,
            "terminate called after throwing an instance of 'c10::DistBackendError'", f"  what():  {term}", *tail]
    return out


def cuda_error_in_watchdog(job: Job, r: int, g: Group, t: float, msg: str) -> list[str]:
    """A CUDA error the NCCL watchdog hits while polling its work (the GPU is gone or faulted)."""
    h = job.host_of(r)
    L = _LN[job.tv]
    p = pg(job, g, r)
    body = [f"CUDA error: {msg}",
            ("CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below "
            "might be incorrect."),
            "For debugging consider passing CUDA_LAUNCH_BLOCKING=1"]
    if job.tv >= (2, 1):
        body.append("Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.")
    body.append("")
    src = "/pytorch/c10/cuda/CUDAException.cpp:43" if job.tv >= (2, 5) else "../c10/cuda/CUDAException.cpp:43"
    stack = [f"Exception raised from c10_cuda_check_implementation at {src} (most recent call first):",
             *_frames(job, "cuda", r * 104729), ""]
    if job.tv < (2, 2):
        term = f"[Rank {g.rank_in(r)}] NCCL watchdog thread terminated with exception: " + body[0]
        return [cpp(job, r, h, t, L["term"]) + term, *body[1:], *stack,
                "terminate called after throwing an instance of 'std::runtime_error'", f"  what():  {term}", *body[1:]]
    if job.tv < (2, 3):
        term = f"[Rank {g.rank_in(r)}] NCCL watchdog thread terminated with exception: " + body[0]
    else:
        term = p + "Process group watchdog thread terminated with exception: " + body[0]
    return [cpp(job, r, h, t, L["term"]) + term, *body[1:], *stack,
            "terminate called after throwing an instance of 'c10::DistBackendError'", f"  what():  {term}",
            *body[1:], *stack]


def torch_warning(job: Job, r: int, t: float, text: str, file: str, line: int) -> str:
    h = job.host_of(r)
    return cpp(job, r, h, t, line, level="W", file=file) + f"Warning: {text}"


# ============================================================== python tracebacks

def py_traceback(job: Job, r: int, frames: list[tuple[str, int, str, str]], exc: list[str],
                 prefix_rank: bool | None = None) -> list[str]:
    """frames: (file, line, function, source). Python >= 3.11 adds caret lines under some calls."""
    out = ["Traceback (most recent call last):"]
    carets = job.python in ("3.11", "3.12")
    for f, lno, fn, src in frames:
        out.append(f'  File "{f}", line {lno}, in {fn}')
        out.append(f"    {src}")
        if carets and "(" in src and len(src) < 90 and lno % 3 == 0:
            out.append("    " + " " * (len(src) - len(src.lstrip())) + "^" * min(len(src.strip()), 60))
    out += exc
    if prefix_rank is None:
        prefix_rank = job.tv >= (2, 2)
    if prefix_rank:
        return [f"[rank{r}]: {x}" for x in out]
    return out


def train_frames(job: Job, script: str, tail: list[tuple[str, int, str, str]]) -> list[tuple[str, int, str, str]]:
    return [(script, 412, "<module>", "main()"), (script, 371, "main", "train(args, model, optimizer, loader)"),
            *tail]


def oom_message(job: Job, r: int, alloc_gib: float, free_mib: float) -> list[str]:
    """torch.OutOfMemoryError / torch.cuda.OutOfMemoryError / RuntimeError: CUDA out of memory, by version."""
    dev = job.local(r)
    total = job.gpu_mem
    used = total - free_mib / 1024
    alloc = used - job.rng.uniform(0.5, 3.0)
    reserved_un = job.rng.uniform(0.2, 2.5)
    tv = job.tv
    if tv < (2, 0):
        return [(f"RuntimeError: CUDA out of memory. Tried to allocate {alloc_gib:.2f} GiB (GPU {dev}; {total:.2f} GiB "
                f"total capacity; {alloc:.2f} GiB already allocated; {free_mib:.2f} MiB free; {alloc + reserved_un:.2f} "
                "GiB reserved in total by PyTorch) If reserved memory is >> allocated memory try setting "
                "max_split_size_mb to avoid fragmentation.  See documentation for Memory Management and "
                "PYTORCH_CUDA_ALLOC_CONF")]
    if tv < (2, 1):
        return [(f"torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate {alloc_gib:.2f} GiB (GPU {dev}; "
                f"{total:.2f} GiB total capacity; {alloc:.2f} GiB already allocated; {free_mib:.2f} MiB free; "
                f"{alloc + reserved_un:.2f} GiB reserved in total by PyTorch) If reserved memory is >> allocated memory "
                "try setting max_split_size_mb to avoid fragmentation.  See documentation for Memory Management and "
                "PYTORCH_CUDA_ALLOC_CONF")]
    cap = "capacty" if tv < (2, 2) else "capacity"
    name = "torch.cuda.OutOfMemoryError" if tv < (2, 5) else "torch.OutOfMemoryError"
    hint = ("If reserved but unallocated memory is large try setting max_split_size_mb to avoid fragmentation.  "
            "See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF" if tv < (2, 2) else
            "If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
            "to avoid fragmentation.  See documentation for Memory Management  "
            "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)")
    return [(f"{name}: CUDA out of memory. Tried to allocate {alloc_gib:.2f} GiB. GPU {dev} has a total {cap} of "
            f"{total:.2f} GiB of which {free_mib:.2f} MiB is free. Including non-PyTorch memory, this process has "
            f"{used:.2f} GiB memory in use. Of the allocated memory {alloc:.2f} GiB is allocated by PyTorch, and "
            f"{reserved_un * 1024:.2f} MiB is reserved by PyTorch but unallocated. {hint}")]


# ============================================================== torch.distributed.elastic (torchrun)

def elastic(job: Job, h: Host, t: float, level: str, module: str, line: int, msg: str) -> str:
    """One line of the elastic agent, in the logging style of the job's torch version.

    module: dotted, e.g. torch.distributed.elastic.multiprocessing.api
    """
    tv = job.tv
    lvl = {"E": "ERROR", "W": "WARNING", "I": "INFO"}[level]
    if tv < (2, 1):
        return f"{lvl}:{module}:{msg}"
    if tv < (2, 3):
        return f"[{clock.py_asctime(job.local_t(h, t))}] {module}: [{lvl}] {msg}"
    path = module.replace(".", "/") + ".py"
    if tv < (2, 5):
        tid = 139700000000000 + h.agent_pid * 3
        return f"{level}{clock.glog(job.local_t(h, t))} {tid} {path}:{line}] {msg}"
    return f"{level}{clock.glog_ms(job.local_t(h, t))} {h.agent_pid} {path}:{line}] {msg}"


MP_API = "torch.distributed.elastic.multiprocessing.api"
AGENT_API = "torch.distributed.elastic.agent.server.api"


def elastic_failed(job: Job, h: Host, t: float, local: int, pid: int, code: int) -> str:
    return elastic(job, h, t, "E", MP_API, {(2, 3): 826, (2, 4): 833}.get(job.tv, 869),
                   f"failed (exitcode: {code}) local_rank: {local} (pid: {pid}) of binary: {job.site.split('/lib/')[0]}"
                   f"/bin/python{job.python}")


def elastic_sigterm(job: Job, h: Host, t: float, pid: int, sig: str = "SIGTERM") -> str:
    return elastic(job, h, t, "W", MP_API, {(2, 3): 850, (2, 4): 858}.get(job.tv, 897),
                   f"Sending process {pid} closing signal {sig}")


def _sig_name(code: int) -> str:
    return {-9: "SIGKILL", -6: "SIGABRT", -11: "SIGSEGV", -15: "SIGTERM", -7: "SIGBUS"}.get(code, f"SIG{-code}")


def child_failed(job: Job, h: Host, t: float, script: str, root: tuple[int, int, int, int, float],
                 others: list[tuple[int, int, int, int, float]], error_file: str | None = None) -> list[str]:
    """The ChildFailedError block torchrun prints when its worker group fails.

    root/others: (global rank, local rank, exit code, pid, true time of the failure)
    """
    py = f"{job.site.split('/lib/')[0]}/bin/torchrun"
    site = job.site
    out = [
        "Traceback (most recent call last):",
        f'  File "{py}", line 8, in <module>',
        "    sys.exit(main())",
        f'  File "{site}/torch/distributed/elastic/multiprocessing/errors/__init__.py", line 346, in wrapper',
        "    return f(*args, **kwargs)",
        f'  File "{site}/torch/distributed/run.py", line 794, in main',
        "    run(args)",
        f'  File "{site}/torch/distributed/run.py", line 785, in run',
        "    elastic_launch(",
        f'  File "{site}/torch/distributed/launcher/api.py", line 134, in __call__',
        "    return launch_agent(self._config, self._entrypoint, list(args))",
        f'  File "{site}/torch/distributed/launcher/api.py", line 250, in launch_agent',
        "    raise ChildFailedError(",
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
        "=" * 60,
        f"{script} FAILED",
        "-" * 60,
        "Failures:",
    ]
    hostname = job.me(h)

    def entry(i: int, e: tuple[int, int, int, int, float], ef: str | None) -> list[str]:
        rank, local, code, pid, tt = e
        tb = (f"Signal {-code} ({_sig_name(code)}) received by PID {pid}" if code < 0 else
              ("To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html" if not ef else
               "Traceback (most recent call last):"))
        return [f"[{i}]:", f"  time      : {clock.elastic_summary(job.local_t(h, tt))}", f"  host      : {hostname}",
                f"  rank      : {rank} (local_rank: {local})", f"  exitcode  : {code} (pid: {pid})",
                f"  error_file: {ef or '<N/A>'}", f"  traceback : {tb}"]

    if not others:
        out.append("  <NO_OTHER_FAILURES>")
    for i, e in enumerate(others, start=1):
        out += entry(i, e, None)
    out += ["-" * 60, "Root Cause (first observed failure):", *entry(0, root, error_file), "=" * 60]
    return out


def elastic_signal_exception(job: Job, h: Host, t: float, sig: int) -> list[str]:
    site = job.site
    name = {15: "SIGTERM", 2: "SIGINT", 1: "SIGHUP"}[sig]
    head = ([elastic(job, h, t, "W", AGENT_API, 705, f"Received {sig} death signal, shutting down workers")]
            if job.tv < (2, 4) else
            [elastic(job, h, t, "W", AGENT_API, 719, f"Received Signals.{name} death signal, shutting down workers")])
    return [
        *head,
        "Traceback (most recent call last):",
        f'  File "{site}/torch/distributed/run.py", line 785, in run',
        "    elastic_launch(",
        f'  File "{site}/torch/distributed/launcher/api.py", line 255, in launch_agent',
        "    result = agent.run()",
        f'  File "{site}/torch/distributed/elastic/multiprocessing/api.py", line 62, in _terminate_process_handler',
        "    raise SignalException(f\"Process {os.getpid()} got signal: {sigval}\", sigval=sigval)",
        f"torch.distributed.elastic.multiprocessing.api.SignalException: Process {h.agent_pid} got signal: {sig}",
    ]


def rdzv_result(job: Job, h: Host, t: float, restart: int, master: Host) -> list[str]:
    ranks = list(job.ranks_on(h))
    return [
        elastic(job, h, t, "I", AGENT_API, 568, "[default] Rendezvous complete for workers. Result:"),
        f"  restart_count={restart}",
        f"  master_addr={job.me(master)}",
        "  master_port=29500",
        f"  group_rank={h.node_rank}",
        f"  group_world_size={len(job.hosts)}",
        f"  local_ranks={list(range(job.gpn))}",
        f"  role_ranks={ranks}",
        f"  global_ranks={ranks}",
        f"  role_world_sizes={[job.world] * job.gpn}",
        f"  global_world_sizes={[job.world] * job.gpn}",
        "",
    ]


# ============================================================== NCCL

def nccl_info(job: Job, h: Host, r: int, text: str) -> str:
    pid = job.pids[r]
    return f"{job.me(h)}:{pid}:{pid} [{job.local(r)}] NCCL INFO {text}"


def nccl_warn(job: Job, h: Host, r: int, t: float, file: str, line: int, text: str) -> list[str]:
    pid = job.pids[r]
    tid = pid + 40 + r % 5
    head = f"{job.me(h)}:{pid}:{tid} [{job.local(r)}] {file}:{line} NCCL WARN {text}"
    if job.nv >= (2, 23):
        return [f"[{clock.seconds(job.local_t(h, t))}] {head}"]
    if job.nv < (2, 19):
        return ["", head]  # the WARN format of those releases starts with a newline
    return [head]


def nccl_init(job: Job, h: Host, r: int, groups: list[Group]) -> list[str]:
    pid = job.pids[r]
    me = job.me(h)
    out = []
    if r == 0:
        out.append(f"{me}:{pid}:{pid} [0] NCCL INFO {nccl_version_str(job)}+cuda{job.cuda}")
    iface = "ib0" if job.ib else "eth0"
    out.append(nccl_info(job, h, r, f"Bootstrap : Using {iface}:{h.ip}<0>"))
    if job.ib:
        nics = " ".join(f"[{i}]mlx5_{i}:1/IB" for i in range(job.gpn))
        out.append(nccl_info(job, h, r, f"NET/IB : Using {nics} ; OOB {iface}:{h.ip}<0>"))
    else:
        out.append(nccl_info(job, h, r, f"NET/Socket : Using [0]{iface}:{h.ip}<0>"))
    bus = job.bus(r)
    for g in groups:
        cid = ((g.guid * 0x9E3779B97F4A7C15 + g.pg_id * 0x632BE5AB + job.slurm_id) & 0xFFFFFFFFFFFFFFF) | 0x100000000000000
        comm = 0x55D000000000 + (r * 0x1F3 + g.pg_id * 0x71) * 0x10
        fn = "ncclCommInitRank " if job.nv >= (2, 21) else ""
        out.append(nccl_info(job, h, r, f"{fn}comm {hex(comm)} rank {g.rank_in(r)} nranks {len(g.ranks)} cudaDev "
                             f"{job.local(r)} nvmlDev {job.local(r)} busId {bus}000 commId {hex(cid)} - Init COMPLETE"))
    return out


# ============================================================== kernel

def kernel_line(job: Job, h: Host, t: float, style: str, msg: str) -> str:
    up = h.uptime0 + (t - job.t0)
    if style == "dmesg":
        return f"[{up:12.6f}] {msg}"
    if style == "dmesg-T":
        return f"[{clock.ctime(job.local_t(h, t))}] {msg}"
    if style == "kern.log":
        return f"{clock.syslog(job.local_t(h, t))} {h.name} kernel: [{up:12.6f}] {msg}"
    return f"{clock.iso_local(job.local_t(h, t), job.tz)} {h.name} kernel: {msg}"  # journalctl -o short-iso-precise


def xid(job: Job, r: int, code: int, pid: int | None) -> str:
    bus = job.bus(r)
    new = job.tv >= (2, 1)
    who = f"pid={pid}, name=python{job.python}, " if pid and new else ("pid='<unknown>', name=<unknown>, " if new else "")
    text = {
        79: "GPU has fallen off the bus.",
        48: "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 6, "
            "subpartition 0.",
        63: "Row Remapper: New row (0x00000000000a3b1e) was marked for remapping, reset gpu to activate.",
        94: "Contained: SM (0x1). RST: No, D-RST: No",
        95: "Uncontained: FBHUB. RST: Yes, D-RST: No",
        13: "Graphics SM Warp Exception on (GPC 2, TPC 1, SM 0): Out Of Range Address",
        31: "Ch 00000008, intr 10000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f2c_4a000000. Fault is "
            "of type FAULT_PDE ACCESS_TYPE_VIRT_READ",
        74: "NVLink: fatal error detected on link 4(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)",
    }[code]
    return f"NVRM: Xid (PCI:0000:{bus}:00): {code}, {who}{text}"


def oom_killer(job: Job, r: int, pid: int, cgroup: bool) -> list[str]:
    rss = job.rng.randint(90, 240) * 1024 * 1024
    name = f"python{job.python}" if job.rng.random() < 0.5 else "python"
    out = [f"{name} invoked oom-killer: gfp_mask=0x100cca(GFP_HIGHUSER_MOVABLE), order=0, oom_score_adj=0",
           f"CPU: {job.local(r) * 12 + 3} PID: {pid} Comm: {name} Not tainted 5.15.0-105-generic #115-Ubuntu"]
    if cgroup:
        memcg = f"/slurm/uid_1000/job_{job.slurm_id}/step_0"
        out.append(f"oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=step_0,mems_allowed=0-1,oom_memcg="
                   f"{memcg},task_memcg={memcg}/task_{job.local(r)},task={name},pid={pid},uid=1000")
        head = "Memory cgroup out of memory: Killed process"
    else:
        out.append(f"oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0-1,global_oom,"
                   f"task_memcg=/system.slice/slurmd.service,task={name},pid={pid},uid=1000")
        head = "Out of memory: Killed process"
    out.append(f"{head} {pid} ({name}) total-vm:{rss + 40_000_000}kB, anon-rss:{rss}kB, file-rss:102400kB, "
               f"shmem-rss:8192kB, UID:1000 pgtables:{rss // 2000}kB oom_score_adj:0")
    return out


# ============================================================== Slurm

def srun_tasks(ranks: list[int]) -> str:
    if len(ranks) == 1:
        return f"task {ranks[0]}"
    rs = sorted(ranks)
    parts = []
    a = b = rs[0]
    for x in rs[1:]:
        if x == b + 1:
            b = x
            continue
        parts.append(f"{a}-{b}" if a != b else str(a))
        a = b = x
    parts.append(f"{a}-{b}" if a != b else str(a))
    return "tasks " + ",".join(parts)


def stepd_cancelled(job: Job, h: Host, t: float, step: str, reason: str | None) -> str:
    when = clock.slurm(job.local_t(h, t))
    if reason is None:
        return f"slurmstepd: error: *** {step} ON {h.name} CANCELLED AT {when} ***"
    return f"slurmstepd: error: *** {step} ON {h.name} CANCELLED AT {when} {reason} ***"
