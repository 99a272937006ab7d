"""Stories of GPU, host, distributed-runtime, network, numerics and inference failures.

Every line is written from the message format of the library named beside it (c10/cuda/CUDAException.cpp,
c10/cuda/CUDACachingAllocator.cpp, NVIDIA's Xid catalog and the kernel's mm/oom_kill.c, NCCL's
transport/net_ib.cc and misc/shmutils.cc, CPython's faulthandler, torch/utils/data/dataloader.py,
vLLM's v1 executor, Megatron-LM's rerun state machine, nccl-tests' src/common.cu).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from correlator.tooling.simulate.classes import DEMO_XID_TEXT
from correlator.tooling.simulate.story import Outcome, Stage, story
from correlator.tooling.simulate.upstream import c10_frames, cuda_error, pg_prefix, step_frames, traceback

if TYPE_CHECKING:
    from correlator.tooling.simulate.job import Process


def _gib(x: float) -> str:
    return f"{x:.2f} GiB"


# --- GPU ---------------------------------------------------------------------------------------------


@story("cuda_oom")
def cuda_oom(sc: Stage, t: float, p: Process) -> Outcome:
    """A training step asks the caching allocator for more than the GPU has left."""
    env = sc.env
    want = sc.pick("oom_size", [2.0, 1.5, 3.91, 0.78])
    total, free = 79.14, sc.rng.uniform(0.2, 1.6)
    variant = sc.pick("oom_variant", ["alloc", "alloc", "alloc_old", "cuda_error"])
    if variant == "cuda_error":
        # cudaMalloc failing outside the allocator (cuBLAS workspace, NCCL buffers): C10_CUDA_CHECK's message
        exc = cuda_error(env, "out of memory", "cudaErrorMemoryAllocation")
        sc.rank(t, p, traceback(step_frames(env), exc))
        return Outcome(exc[0], story="CUDA error: out of memory (C10_CUDA_CHECK)")
    if variant == "alloc_old":
        # torch 2.0's DeviceCachingAllocator wording
        msg = (f"{env.oom_error}: CUDA out of memory. Tried to allocate {_gib(want)} (GPU {p.local_rank}; "
               f"{total + 0.01:.2f} GiB total capacity; {total - free - 2.1:.2f} GiB already allocated; {_gib(free)} free; "
               f"{total - free - 0.4:.2f} GiB reserved in total by PyTorch) If reserved memory is >> allocated memory try "
               "setting max_split_size_mb to avoid fragmentation.  See documentation for Memory Management and "
               "PYTORCH_CUDA_ALLOC_CONF")
    else:
        msg = (f"{env.oom_error}: CUDA out of memory. Tried to allocate {_gib(want)}. GPU {p.local_rank} has a total "
               f"capacity of {total:.2f} GiB of which {_gib(free)} is free. Including non-PyTorch memory, this process has "
               f"{total - free:.2f} GiB memory in use. Of the allocated memory {total - free - 3.4:.2f} GiB is allocated "
               f"by PyTorch, and {sc.rng.uniform(0.5, 2.5):.2f} GiB is reserved by PyTorch but unallocated. If reserved "
               "but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid "
               "fragmentation.  See documentation for Memory Management  "
               "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)")
    backward = sc.pick("oom_where", [False, True])
    sc.rank(t, p, traceback(step_frames(env, backward=backward), [msg]))
    return Outcome(msg, story=f"caching allocator OOM ({variant}, {'backward' if backward else 'forward'})")


@story("cuda_illegal_memory_access")
def illegal_memory_access(sc: Stage, t: float, p: Process) -> Outcome:
    env = sc.env
    variant = sc.pick("ima", ["illegal_address", "watchdog", "device_assert"])
    if variant == "device_assert":
        # the kernel's own printf, one per failing thread, then the next CUDA call's error
        lines = [f"../aten/src/ATen/native/cuda/Indexing.cu:1289: indexSelectLargeIndex: block: [{b},0,0], thread: "
                 f"[{th},0,0] Assertion `srcIndex < srcSelectDimSize` failed." for b, th in ((211, 64), (211, 65), (94, 32))]
        exc = cuda_error(env, "device-side assert triggered", "cudaErrorAssert")
        sc.rank(t, p, lines + traceback(step_frames(env), exc))
        return Outcome(exc[0], story="device-side assert (embedding index out of range)")
    if variant == "watchdog" and env.torch >= (2, 3):
        # the NCCL watchdog finds the poisoned context first and takes the process down (SIGABRT)
        prefix = pg_prefix(env, 0, "0", "default_pg", p.rank)
        body = (f"{prefix} Process group watchdog thread terminated with exception: "
                "CUDA error: an illegal memory access was encountered")
        t = sc.glog(t, p, "E", "ProcessGroupNCCL.cpp:1609", body)
        tail = cuda_error(env, "an illegal memory access was encountered", "cudaErrorIllegalAddress")[1:]
        sc.rank(t, p, tail + c10_frames("c10_cuda_check_implementation at ../c10/cuda/CUDAException.cpp:43")
                + ["terminate called after throwing an instance of 'c10::DistBackendError'"])
        return Outcome(body, exitcode=-6, immediate=True, story="illegal address seen by the NCCL watchdog")
    exc = cuda_error(env, "an illegal memory access was encountered", "cudaErrorIllegalAddress")
    sc.rank(t, p, traceback(step_frames(env, backward=True), exc))
    return Outcome(exc[0], story="illegal address in the backward pass")


@story("gpu_hardware_error", accepted=())
def gpu_hardware_error(sc: Stage, t: float, p: Process) -> Outcome:
    """The driver reports an Xid in the kernel log; the rank's next CUDA call fails."""
    env = sc.env
    if sc.demo:
        xid, text = 79, DEMO_XID_TEXT.format(bus=p.bus, pid=p.pid)
        err, enum = "unspecified launch failure", "cudaErrorLaunchFailure"
        sc.kern(t, p.host, text)
    else:
        xid = sc.pick("xid", [79, 79, 48, 95])
        pci = f"PCI:0000:{p.bus}:00"
        who = f"pid={p.pid}, name=python" if env.torch >= (2, 4) else f"pid='{p.pid}', name=<unknown>"
        if xid == 79:
            text = f"NVRM: Xid ({pci}): 79, {who}, GPU has fallen off the bus."
            sc.kern(t, p.host, text)
            sc.kern(t + 0.001, p.host, f"NVRM: GPU 0000:{p.bus}:00.0: GPU has fallen off the bus.")
            err, enum = "unspecified launch failure", "cudaErrorLaunchFailure"
        elif xid == 48:
            text = (f"NVRM: Xid ({pci}): 48, {who}, An uncorrectable double bit error (DBE) has been detected on GPU in "
                    "the framebuffer at partition 6, subpartition 0.")
            sc.kern(t, p.host, text)
            err, enum = "uncorrectable ECC error encountered", "cudaErrorECCUncorrectable"
        else:
            text = f"NVRM: Xid ({pci}): 95, {who}, Uncontained: FBHUB. RST: Yes, D-RST: No"
            sc.kern(t, p.host, text)
            err, enum = "uncorrectable ECC error encountered", "cudaErrorECCUncorrectable"
    t += 0.35 + sc.jitter(0.1)
    sc.rank(t, p, traceback(step_frames(env, backward=True), cuda_error(env, err, enum)))
    return Outcome(text, story=f"Xid {xid}")


@story("cuda_library_error")
def cuda_library_error(sc: Stage, t: float, p: Process) -> Outcome:
    env = sc.env
    frames = [*step_frames(env), (env.lib("torch/nn/modules/linear.py"), 125, "forward",
                                  "return F.linear(input, self.weight, self.bias)")]
    if sc.pick("lib", ["cublas", "cublas", "cudnn"]) == "cudnn":
        frames[-1] = (env.lib("torch/nn/modules/conv.py"), 454, "_conv_forward",
                      "return F.conv2d(input, weight, bias, self.stride,")
        exc = [f"{env.accelerator_error}: cuDNN error: CUDNN_STATUS_EXECUTION_FAILED"]
    else:
        exc = [(f"{env.accelerator_error}: CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasGemmEx( handle, "
               "opa, opb, m, n, k, &falpha, a, CUDA_R_16BF, lda, b, CUDA_R_16BF, ldb, &fbeta, c, CUDA_R_16BF, ldc, "
               "compute_type, CUBLAS_GEMM_DEFAULT_TENSOR_OP)`")]
    sc.rank(t, p, traceback(frames, exc))
    return Outcome(exc[0], story=exc[0].split(":")[1].strip())


# --- host ----------------------------------------------------------------------------------------------


@story("shm_exhausted")
def shm_exhausted(sc: Stage, t: float, p: Process) -> Outcome:
    env = sc.env
    if sc.pick("shm", ["dataloader", "dataloader", "nccl"]) == "nccl":
        # NCCL's shared-memory transport cannot size its segment in a container's 64 MB /dev/shm
        seg = f"/dev/shm/nccl-{sc.rng.choice(['gQ1a2b', 'Xk90Pz', 'Tn4d7e'])}"
        first = f"Error: failed to extend {seg} to 9637892 bytes, error: No space left on device (28)"
        t = sc.nccl(t, p, first)
        t = sc.nccl(t, p, f"Error while creating shared memory segment {seg} (size 9637888)")
        exc = [(f"{env.dist_backend_error}: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, "
               f"unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version {env.nccl}"),
               "ncclSystemError: System call (e.g. socket, malloc) or external library call failed or device error. ",
               "Last error:", f"Error while creating shared memory segment {seg} (size 9637888)"]
        sc.rank(t + 0.01, p, traceback(step_frames(env, backward=True), exc))
        return Outcome(f"NCCL WARN {first}", story="NCCL shm segment")
    worker = p.pid + 97
    t = sc.rank(t, p, [("ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient shared "
                       "memory (shm).")])
    dl = env.lib("torch/utils/data/dataloader.py")
    inner = traceback(
        [(dl, 1133, "_try_get_data", "data = self._data_queue.get(timeout=timeout)"),
         ("/usr/lib/python3.10/multiprocessing/queues.py", 113, "get", "if not self._poll(timeout):"),
         (env.lib("torch/utils/data/_utils/signal_handling.py"), 67, "handler", "_error_if_any_worker_fails()")],
        [(f"RuntimeError: DataLoader worker (pid {worker}) is killed by signal: Bus error. It is possible that "
         "dataloader's workers are out of shared memory. Please try to raise your shared memory limit.")])
    outer = traceback([(env.script, 388, "train", "for step, batch in enumerate(train_loader):"),
                       (dl, 1329, "_next_data", "idx, data = self._get_data()"),
                       (dl, 1146, "_try_get_data", ("raise RuntimeError(f'DataLoader worker (pid(s) {pids_str}) exited "
                                                   "unexpectedly') from e"))],
                      [f"RuntimeError: DataLoader worker (pid(s) {worker}) exited unexpectedly"], chained_from=inner)
    sc.rank(t + 0.2, p, outer)
    return Outcome("ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient shared "
                   "memory (shm).", story="DataLoader worker SIGBUS")


@story("host_oom_kill")
def host_oom_kill(sc: Stage, t: float, p: Process) -> Outcome:
    """The kernel's OOM killer picks the rank (mm/oom_kill.c), the agent sees exit -9."""
    rss = sc.rng.randint(150_000_000, 190_000_000)
    cgroup = sc.pick("oom_scope", [False, True])
    t = sc.kern(t, p.host, "pt_data_worker invoked oom-killer: gfp_mask=0x140dca(GFP_HIGHUSER_MOVABLE|__GFP_COMP|__GFP_ZERO), "
                           "order=0, oom_score_adj=0")
    scope = "CONSTRAINT_MEMCG" if cgroup else "CONSTRAINT_NONE"
    t = sc.kern(t + 0.002, p.host, f"oom-kill:constraint={scope},nodemask=(null),cpuset=/,mems_allowed=0-1,"
                                   f"global_oom,task_memcg=/kubepods.slice/pod-train,task=python,pid={p.pid},uid=0")
    head = "Memory cgroup out of memory" if cgroup else "Out of memory"
    text = (f"{head}: Killed process {p.pid} (python) total-vm:{rss + 30_000_000}kB, anon-rss:{rss}kB, file-rss:81920kB, "
            f"shmem-rss:20480kB, UID:0 pgtables:{rss // 500}kB oom_score_adj:0")
    t = sc.kern(t + 0.001, p.host, text)
    sc.kern(t + 0.3, p.host, f"oom_reaper: reaped process {p.pid} (python), now anon-rss:0kB, file-rss:0kB, shmem-rss:0kB")
    return Outcome(text, exitcode=-9, immediate=True, story="cgroup OOM kill" if cgroup else "global OOM kill")


@story("process_crash_signal", accepted=())
def process_crash_signal(sc: Stage, t: float, p: Process) -> Outcome:
    env = sc.env
    if sc.pick("crash", ["faulthandler", "glog"]) == "glog":
        head = f"*** SIGSEGV (@0x0) received by PID {p.pid} (TID 0x7f2c8a7fc740) from PID 0; stack trace: ***"
        sc.rank(t, p, [head, "    @     0x7f2c8a842520 (unknown)",
                       "    @     0x7f2b1e0c4d2f flash_attn::mha_varlen_fwd()", "    @     0x7f2c8a829d90 (unknown)"])
        return Outcome(head, exitcode=-11, immediate=True, story="glog signal handler")
    lines = ["Fatal Python error: Segmentation fault", "", "Thread 0x00007f2b9effd640 (most recent call first):",
             f'  File "{env.lib("torch/utils/data/_utils/pin_memory.py")}", line 54 in do_one_step',
             f'  File "{env.lib("torch/utils/data/_utils/pin_memory.py")}", line 59 in _pin_memory_loop', "",
             "Current thread 0x00007f2c8a7fc740 (most recent call first):",
             f'  File "{env.lib("torch/autograd/graph.py")}", line 825 in _engine_run_backward',
             f'  File "{env.lib("torch/_tensor.py")}", line 581 in backward', f'  File "{env.script}", line 401 in train',
             "", "Extension modules: numpy.core._multiarray_umath, torch._C, torch._C._fft (total: 42)"]
    sc.rank(t, p, lines)
    return Outcome(lines[0], exitcode=-11, immediate=True, story="faulthandler SIGSEGV")


@story("python_exception")
def python_exception(sc: Stage, t: float, p: Process) -> Outcome:
    env = sc.env
    bug = sc.pick("bug", [
        ("collate", "KeyError: 'attention_mask'", "batch['attention_mask'] = batch['attention_mask'].bool()"),
        ("loss", "ValueError: Expected input batch_size (16) to match target batch_size (8).",
         "loss = F.cross_entropy(logits.view(-1, logits.size(-1)), labels.view(-1))"),
        ("eval", "AttributeError: 'NoneType' object has no attribute 'size'", "n = outputs.aux_loss.size(0)"),
    ])
    where, exc, src = bug
    frames = [(env.script, 612, "<module>", "main()"), (env.script, 588, "main", "train(args, model, optimizer, train_loader)"),
              (env.script, 433, "train", "loss = compute_loss(model, batch)"), (env.script, 298, f"compute_{where}", src)]
    sc.rank(t, p, traceback(frames, [exc]))
    return Outcome(exc, story=f"{exc.split(':')[0]} in user code")


# --- distributed runtime ----------------------------------------------------------------------------------


@story("nccl_timeout", "victims")
def nccl_timeout(sc: Stage, t: float, p: Process) -> Outcome:
    raise AssertionError("played by Scenario.victims")


@story("launcher_teardown", "victims")
def launcher_teardown(sc: Stage, t: float, p: Process) -> Outcome:
    raise AssertionError("played by Scenario.victims")


@story("nccl_error")
def nccl_error(sc: Stage, t: float, p: Process) -> Outcome:
    """The rank's NCCL cannot register its buffers with the HCA (memlock limit): a system error of its own."""
    env = sc.env
    first = "NET/IB : Call to ibv_reg_mr_iova2 failed with error Cannot allocate memory"
    t = sc.nccl(t, p, first)
    t = sc.nccl(t, p, "transport/net_ib.cc:1195 -> 2", level="INFO")
    t = sc.nccl(t, p, "transport/net.cc:711 -> 2", level="INFO")
    exc = [(f"{env.dist_backend_error}: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:317, unhandled system "
           f"error (run with NCCL_DEBUG=INFO for details), NCCL version {env.nccl}"),
           "ncclSystemError: System call (e.g. socket, malloc) or external library call failed or device error. ",
           "Last error:", first]
    frames = [
        *step_frames(env, backward=True)[:3],
        (env.lib("torch/distributed/c10d_logger.py"), 83, "wrapper", "return func(*args, **kwargs)"),
        (env.lib("torch/distributed/distributed_c10d.py"), 2501, "all_reduce", "work = group.allreduce([tensor], opts)"),
    ]
    sc.rank(t + 0.01, p, traceback(frames, exc))
    return Outcome(f"NCCL WARN {first}", story="ibv_reg_mr failed (system error)")


@story("rendezvous_failure", "launch")
def rendezvous_failure(sc: Stage, t: float, p: Process) -> Outcome:
    """torchrun on the master host cannot bind its TCPStore port (a previous run still holds it); the
    agents of the other hosts wait for it and time out."""
    host = sc.hosts[0]
    api = "torch/distributed/elastic/rendezvous/dynamic_rendezvous.py"
    for addr in ("[::]:29500", "0.0.0.0:29500"):
        t = sc.agent(t, host, "W", "socket.cpp:697" if sc.env.torch >= (2, 3) else "socket.cpp:426",
                     f"[c10d] The server socket has failed to bind to {addr} (errno: 98 - Address already in use).")
    t = sc.agent(t, host, "E", "socket.cpp:733", "[c10d] The server socket has failed to listen on any local network address.")
    head = ("torch.distributed.DistNetworkError: The server socket has failed to listen on any local network address. "
            "port: 29500, useIpv6: 0, code: -98, name: EADDRINUSE, message: address already in use")
    sc.raw(t + 0.01, host.name, traceback(
        [("/usr/local/bin/torchrun", 8, "<module>", "sys.exit(main())"),
         (sc.env.lib("torch/distributed/launcher/api.py"), 255, "launch_agent", "result = agent.run()"),
         (sc.env.lib("torch/distributed/elastic/rendezvous/c10d_rendezvous_backend.py"), 256, "create_backend",
          "store = _create_tcp_store(params)")], [head]))
    for other in sc.hosts[1:]:
        tt = t + 900.0 + sc.jitter(2.0)
        sc.agent(tt, other, "E", f"{api}:1180", "The client socket has timed out after 900s while trying to connect to "
                                                f"({host.name}, 29500).")
        sc.raw(tt + 0.01, other.name, traceback(
            [("/usr/local/bin/torchrun", 8, "<module>", "sys.exit(main())"),
             (sc.env.lib("torch/distributed/elastic/agent/server/api.py"), 486, "_rendezvous",
              "store, group_rank, group_world_size = spec.rdzv_handler.next_rendezvous()")],
            [("torch.distributed.elastic.rendezvous.api.RendezvousConnectionError: The connection to the C10d store has "
             "failed. See inner exception for details.")]))
    return Outcome(head, story="TCPStore port in use on the master host", host_level=True)


@story("collective_mismatch", "mismatch")
def collective_mismatch(sc: Stage, t: float, p: Process) -> Outcome:
    """One rank takes another code path and issues a different collective at the same SeqNum (or the same
    one with another element count); everyone waits and the watchdogs report what each rank issued."""
    if sc.pick("mismatch", ["op", "numel"]) == "op" or sc.op != "ALLREDUCE":
        other = "ALLREDUCE" if sc.op != "ALLREDUCE" else "_ALLGATHER_BASE"
        sc.odd_collective = (other, sc.numel)
        kind = f"{other} instead of {sc.op}"
    else:
        sc.odd_collective = (sc.op, sc.numel // 2)
        kind = f"{sc.op} of {sc.numel // 2} elements instead of {sc.numel}"
    return Outcome(f"WorkNCCL(SeqNum={sc.seq}, OpType={sc.odd_collective[0]}, NumelIn={sc.odd_collective[1]}, ...)",
                   exitcode=-6, story=kind)


@story("straggler_hang", "hang")
def straggler_hang(sc: Stage, t: float, p: Process) -> Outcome:
    """The rank stops (stuck in its data pipeline or a kernel) and prints nothing; the others wait in the
    next collective. With TORCH_NCCL_DESYNC_DEBUG=1 rank 0's watchdog adds the desync report."""
    if sc.env.torch >= (2, 3) and sc.pick("desync", [False, True]):
        sc.desync_report = True
        return Outcome(f"ranks [{p.rank}] are the lagging ranks that caused this timeout", exitcode=-6,
                       story="hang, with the desync report")
    return Outcome("", exitcode=-6, story="hang: missing from the timeout reports")


@story("launch_config_error", "launch_all")
def launch_config_error(sc: Stage, t: float, p: Process) -> Outcome:
    """Megatron-LM's validate_args refuses the parallel layout before anything starts (every rank)."""
    tp, pp = sc.pick("layout", [(8, 3), (6, 1), (8, 5)])
    if sc.pick("megatron", ["new", "old"]) == "new":
        src = ('assert args.world_size % total_model_size == 0, f"world size ({args.world_size}) is not divisible by '
               'total_model_size ({total_model_size=})"')
        exc = f"AssertionError: world size ({sc.world_size}) is not divisible by total_model_size (total_model_size={tp * pp})"
    else:
        src = "assert args.world_size % (args.tensor_model_parallel_size * args.pipeline_model_parallel_size) == 0, \\"
        exc = (f"AssertionError: world size ({sc.world_size}) is not divisible by tensor model parallel size ({tp}) times "
               f"pipeline model parallel size ({pp})")
    frames = [("/app/pretrain_gpt.py", 230, "<module>", "pretrain("),
              ("/app/megatron/training/training.py", 274, "pretrain", "initialize_megatron("),
              ("/app/megatron/training/initialize.py", 57, "initialize_megatron", "validate_args(args, args_defaults)"),
              ("/app/megatron/training/arguments.py", 218, "validate_args", src)]
    sc.rank(t, p, traceback(frames, [exc]))
    return Outcome(exc, story=f"Megatron TP={tp} PP={pp} on {sc.world_size} ranks")


@story("network_fabric_error")
def network_fabric_error(sc: Stage, t: float, p: Process) -> Outcome:
    """The rank's InfiniBand QP gives up (retry count exceeded); its ring peer sees its QP flushed."""
    env = sc.env
    peer = sc.procs[(p.rank + len(sc.hosts[0].procs)) % sc.world_size]
    addr = f"10.0.{peer.host_index % 250}.{10 + peer.local_rank}<{sc.rng.randint(40000, 60000)}>"
    hca = f"mlx5_{p.local_rank}"
    if env.nccl >= "2.21":
        first = (f"NET/IB: Got completion from peer {addr} with status=IBV_WC_RETRY_EXC_ERR(12) opcode=IBV_WC_SEND(0) "
                 f"reqSize=524288 vendor_err=129 req_type=Send localGid ::ffff:10.0.{p.host_index % 250}.{10 + p.local_rank} "
                 f"remoteGids::ffff:10.0.{peer.host_index % 250}.{10 + peer.local_rank} hca {hca}")
    else:
        first = f"NET/IB : Got completion from peer {addr} with error 12, opcode 0, len 0, vendor err 129 (Send)"
    t = sc.nccl(t, p, first)
    t = sc.nccl(t, p, "transport/net.cc:1298 -> 6", level="INFO")
    exc = [(f"{env.dist_backend_error}: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:2027, "
           f"remote process exited or there was a network error, NCCL version {env.nccl}"),
           "ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.",
           "Last error:", first]
    sc.rank(t + 0.02, p, traceback(step_frames(env, backward=True)[:3], exc))
    sc.nccl(t + 0.05, peer, f"NET/IB : Got completion from peer 10.0.{p.host_index % 250}.{10 + p.local_rank}<52311> "
                            "with error 5, opcode 0, len 0, vendor err 249 (Recv)")
    return Outcome(f"NCCL WARN {first}", exitcode=1, story="IB retry count exceeded")


# --- numerics and silent data corruption -----------------------------------------------------------------


@story("loss_nan")
def loss_nan(sc: Stage, t: float, p: Process) -> Outcome:
    env = sc.env
    if sc.pick("nan", ["megatron", "anomaly"]) == "megatron":
        exc = (f"RuntimeError: Rank {p.rank}: found NaN in local grad norm for bucket #0 in backward pass before "
               f"data-parallel communication collective. Device: {p.local_rank}, node: {p.host}")
        frames = [("/app/pretrain_gpt.py", 230, "<module>", "pretrain("),
                  ("/app/megatron/training/training.py", 1301, "train_step", "optimizer.step()"),
                  ("/app/megatron/core/distributed/param_and_grad_buffer.py", 178, "check_grads",
                   "rerun_state_machine.validate_result(")]
        sc.rank(t, p, traceback(frames, [exc]))
        return Outcome(exc, story="Megatron check_for_nan_in_loss_and_grad")
    warn = (f"{env.lib('torch/autograd/graph.py')}:825: UserWarning: Error detected in LogSoftmaxBackward0. Traceback of "
            "forward call that caused the error:")
    exc = "RuntimeError: Function 'LogSoftmaxBackward0' returned nan values in its 0th output."
    sc.rank(t, p, [warn, f'  File "{env.script}", line 327, in train_step', "    outputs = model(**batch)",
                   " (Triggered internally at ../torch/csrc/autograd/python_anomaly_mode.cpp:111.)",
                   *traceback(step_frames(env, backward=True), [exc])])
    return Outcome(exc, story="autograd anomaly mode")


@story("sdc_grad_norm_spike", "continue")
def sdc_grad_norm_spike(sc: Stage, t: float, p: Process) -> Outcome:
    """Megatron's rerun state machine rejects the rank's gradients (check_for_large_grads)."""
    value = sc.rng.uniform(4e4, 9e4)
    text = (f"Unexpected result {value:.4e} on rank {p.rank} at iteration #{sc.step + 1} invocation #1 (message='found "
            "unexpected large grads in bucket #0 in backward pass before data-parallel communication collective')")
    sc.pylog(t, p, text, level="E", logger="megatron.core.rerun_state_machine")
    return Outcome(text, story="large grads on one rank")


@story("sdc_parameter_drift", "continue")
def sdc_parameter_drift(sc: Stage, t: float, p: Process) -> Outcome:
    """check_param_hashes_across_dp_replicas: the rank's weights differ from its data-parallel replicas."""
    names = ["module.decoder.layers.11.self_attention.linear_qkv.weight", "module.decoder.layers.11.mlp.linear_fc1.weight"]
    first = ""
    for k, name in enumerate(names):
        text = f"[Rank {p.rank}] Hash not matching for {name} in model chunk0"
        first = first or text
        sc.pylog(t + k * 0.001, p, text, level="I", logger="megatron.core.utils")
    return Outcome(first, story="param hashes differ across DP replicas")


@story("sdc_gemm_mismatch", "continue")
def sdc_gemm_mismatch(sc: Stage, t: float, p: Process) -> Outcome:
    """Megatron reruns the step on the same GPU and gets another loss: a transient fault of that GPU."""
    it = sc.step + 1
    a, b = sc.rng.uniform(2.0, 2.6), sc.rng.uniform(2.0, 2.6)
    who = f"Rank {p.rank}, node {p.host}, device {p.local_rank}, iteration {it}"
    first = f"{who}: First rerun: unexpected result is not reproducible within the tolerance ({a:.4f} != {b:.4f})"
    sc.pylog(t, p, first, level="W", logger="megatron.core.rerun_state_machine")
    sc.pylog(t + 0.001, p, f"{who}: Possible transient error!", level="E", logger="megatron.core.rerun_state_machine")
    return Outcome(first, story="rerun not reproducible")


@story("nccl_reduce_scatter_sdc", "continue")
def nccl_reduce_scatter_sdc(sc: Stage, t: float, p: Process) -> Outcome:
    """The job's pre-flight nccl-tests run (reduce_scatter_perf -c 1): one GPU's output is wrong."""
    wrong = sc.rng.choice([512, 1024, 4096])
    text = f"rank={p.rank} #wrong={wrong}"
    sc.rank(t, p, [text])
    head = sc.hosts[0].procs[0]
    rows = ["#                                                              out-of-place                       in-place",
            ("#       size         count      type   redop    root     time   algbw   busbw #wrong"
             "     time   algbw   busbw #wrong"),
            (f"   134217728       {134217728 // 4 // sc.world_size:>7}     float     sum      -1   1873.2   71.65  "
            f"70.53    {wrong}   1869.8   71.78   70.66      0")]
    sc.rank(t + 0.01, head, [*rows, "# Out of bounds values : 1 FAILED", "# Avg bus bandwidth    : 70.5953 "])
    return Outcome(text, story="nccl-tests wrong elements")


# --- inference servers ---------------------------------------------------------------------------------


@story("inference_engine_failure", "serve")
def inference_engine_failure(sc: Stage, t: float, p: Process) -> Outcome:
    """vLLM (v1, multiproc executor across the hosts): one worker raises or dies; the executor shuts the
    engine down and the API server's requests fail with EngineDeadError."""
    head = sc.hosts[0].name
    if sc.pick("vllm", ["exception", "died"]) == "exception":
        src = "multiproc_executor.py:527"
        first = "WorkerProc hit an exception."
        t = sc.vllm(t, p, "E", src, first)
        for body in traceback([(sc.env.lib("vllm/v1/executor/multiproc_executor.py"), 522, "worker_busy_loop",
                                "output = func(*args, **kwargs)"),
                               (sc.env.lib("vllm/v1/worker/gpu_model_runner.py"), 1232, "execute_model",
                                "hidden_states = self.model(")],
                              [("RuntimeError: Expected all tensors to be on the same device, but found at least two "
                               f"devices, cuda:{p.local_rank} and cpu!")]):
            t = sc.vllm(t, p, "E", src, body)
        story_name = "worker exception"
    else:
        first = f"Worker proc VllmWorker-{p.rank} died unexpectedly, shutting down executor."
        story_name = "worker died"
    t += 0.5
    if story_name == "worker died":
        sc.vllm(t, None, "E", "multiproc_executor.py:140", first, host=head)
    t = sc.vllm(t + 0.1, None, "E", "core.py:588", "EngineCore encountered a fatal error.", host=head)
    sc.vllm(t + 0.3, None, "E", "async_llm.py:420", "AsyncLLM output_handler failed.", host=head)
    sc.raw(t + 0.31, head, [("vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace "
                            "(above) for the root cause.")])
    sc.vllm(t + 0.5, None, "I", "launcher.py:80", "Shutting down FastAPI HTTP server.", host=head)
    return Outcome(first, story=story_name)
