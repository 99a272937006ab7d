"""Failure stories with a known culprit, and red herrings.

Each story picks its culprit, prints what the culprit (and its host) print, then lets `Sim.cascade` spread
the failure. It returns the label: what truly happened, from the story, never from any diagnosis.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from lab.synth import formats as F
from lab.synth.cluster import Host
from lab.synth.sim import Sim


@dataclass
class Label:
    cls: str
    initiator: str
    story: str
    also_ok: list[str] = field(default_factory=list)


@dataclass
class Ctx:
    t_fail: float
    step: int
    step_time: float
    seqs: dict[str, int]
    ops: dict[str, tuple[str, int]]
    end: float = 0.0
    culprit: int = -1
    phase: str = "step"   # step | load | save


def make_ctx(sim: Sim, t_fail: float, step: int, step_time: float, phase: str = "step") -> Ctx:
    job, rng = sim.job, sim.rng
    fsdp = job.tp == 1 and job.pp == 1 and rng.random() < 0.5
    seqs = {"default": rng.randint(2000, 900000), "tp": rng.randint(2000, 2_000_000),
            "pp": rng.randint(500, 400000), "dp": rng.randint(1000, 300000)}
    ops = {"default": ("_REDUCE_SCATTER_BASE", 67108864) if fsdp else ("ALLREDUCE", rng.choice([25165824, 1, 4096])),
           "tp": (rng.choice(["ALLREDUCE", "_ALLGATHER_BASE", "BROADCAST"]), rng.choice([16777216, 50331648, 8192])),
           "pp": (rng.choice(["RECV", "SEND", "COALESCED"]), 25165824),
           "dp": (rng.choice(["_REDUCE_SCATTER_BASE", "ALLREDUCE"]), rng.choice([134217728, 67108864]))}
    if phase in ("load", "save"):
        ops["default"] = ("ALLREDUCE", 1)   # a barrier is an all-reduce of one element
        ops["dp"] = ("ALLREDUCE", 1)
    return Ctx(t_fail, step, step_time, seqs, ops, phase=phase)


def pick_culprit(sim: Sim) -> int:
    job, rng = sim.job, sim.rng
    if sim.forced_culprit is not None:
        return sim.forced_culprit
    if rng.random() < 0.08:
        return 0
    if rng.random() < 0.08:
        return job.world - 1
    return rng.randrange(1, job.world)


def block(sim: Sim, ctx: Ctx, culprit: int, tp_first: bool = True) -> dict[int, float]:
    """When each rank starts waiting, and on which group: the culprit's TP peers at once, its pipeline peers
    soon after, everyone else when they reach the gradient reduction at the end of their step."""
    job, rng = sim.job, sim.rng
    sim.blocked_kind = {}
    tb: dict[int, float] = {}
    t = ctx.t_fail
    if ctx.phase != "step":
        for r in range(job.world):
            tb[r] = t + rng.uniform(-2.0, 15.0)
            sim.blocked_kind[r] = "default"
        return tb
    tp_peers = set(job.group(culprit, "tp").ranks) if job.tp > 1 and tp_first else set()
    pp_peers = set(job.group(culprit, "pp").ranks) if job.pp > 1 else set()
    for r in range(job.world):
        if r == culprit:
            continue
        if r in tp_peers:
            tb[r] = t - rng.uniform(0, 0.05)
            sim.blocked_kind[r] = "tp"
        elif r in pp_peers:
            tb[r] = t + rng.uniform(0.1, ctx.step_time * 0.5)
            sim.blocked_kind[r] = "pp"
        else:
            tb[r] = t + rng.uniform(0.3, 1.0) * ctx.step_time
            sim.blocked_kind[r] = job.grad_kind
    return tb


def _script_frames(sim: Sim) -> list[tuple[str, int, str, str]]:
    job, prof = sim.job, sim.prof
    site = job.site
    if prof.framework == "megatron":
        return [("/workspace/Megatron-LM/pretrain_gpt.py", 285, "<module>",
                 "pretrain(train_valid_test_datasets_provider,"),
                ("/workspace/Megatron-LM/megatron/training/training.py", 374, "pretrain",
                 "iteration, num_floating_point_operations_so_far = train("),
                ("/workspace/Megatron-LM/megatron/training/training.py", 1365, "train",
                 "train_step(forward_step_func,"),
                ("/workspace/Megatron-LM/megatron/training/training.py", 733, "train_step",
                 "losses_reduced = forward_backward_func(")]
    if prof.framework == "hf":
        return [("/workspace/train.py", 188, "<module>", "main()"),
                ("/workspace/train.py", 181, "main", "trainer.train(resume_from_checkpoint=args.resume)"),
                (f"{site}/transformers/trainer.py", 1948, "train", "return inner_training_loop("),
                (f"{site}/transformers/trainer.py", 2289, "_inner_training_loop",
                 "tr_loss_step = self.training_step(model, inputs)")]
    if prof.framework == "lightning":
        return [("/workspace/train.py", 96, "<module>", "trainer.fit(model, datamodule=dm)"),
                (f"{site}/lightning/pytorch/trainer/trainer.py", 538, "fit", "call._call_and_handle_interrupt("),
                (f"{site}/lightning/pytorch/loops/fit_loop.py", 206, "run", "self.advance()")]
    return F.train_frames(job, f"/workspace/{prof.script}", [
        (f"/workspace/{prof.script}", 302, "train", "loss = train_step(model, batch, optimizer)")])


def _die_by_exception(sim: Sim, r: int, t: float, frames: list[tuple[str, int, str, str]], exc: list[str],
                      code: int = 1) -> dict[int, tuple[float, int, str]]:
    sim.rank_out(r, t, F.py_traceback(sim.job, r, frames, exc), err=True)
    return {r: (t + sim.rng.uniform(0.3, 3.0), code, "exception")}


def _cascade(sim: Sim, ctx: Ctx, first: dict[int, tuple[float, int, str]], stalled: set[int] | None = None,
             hang: bool = False, restart: bool = False, tp_first: bool = True) -> None:
    tb = block(sim, ctx, ctx.culprit, tp_first)
    ctx.end = sim.cascade(first, stalled or set(), tb, ctx.seqs, ctx.ops, restart=restart, hang=hang)


# =============================================================================== stories

def s_cuda_oom(sim: Sim, ctx: Ctx, restart: bool = False) -> Label:
    job, rng = sim.job, sim.rng
    k = ctx.culprit = pick_culprit(sim)
    site = job.site
    frames = [*_script_frames(sim),
              (f"{site}/torch/nn/modules/module.py", 1553, "_wrapped_call_impl", "return self._call_impl(*args, **kwargs)"),
              (f"{site}/torch/nn/modules/module.py", 1562, "_call_impl", "return forward_call(*args, **kwargs)"),
              ("/workspace/model/attention.py", 214, "forward",
               "attn = torch.matmul(q, k.transpose(-2, -1)) * self.scale")]
    exc = F.oom_message(job, k, rng.choice([2.0, 4.5, 10.25, 1.17, 20.0]), rng.uniform(20, 900))
    first = _die_by_exception(sim, k, ctx.t_fail, frames, exc)
    if rng.random() < 0.35:  # a second OOM, on another rank a little later (red herring)
        j = rng.randrange(job.world)
        if job.host_of(j) is not job.host_of(k):
            tj = ctx.t_fail + rng.uniform(3, 40)
            sim.rank_out(j, tj, F.py_traceback(job, j, frames, F.oom_message(job, j, 2.0, 60.0)), err=True)
            first[j] = (tj + 1, 1, "exception")
    _cascade(sim, ctx, first, restart=restart)
    return Label("cuda_oom", f"rank={k}", "cuda_oom")


def _xid_common(sim: Sim, ctx: Ctx, code: int, app_msg: str, restart: bool) -> tuple[int, Host]:
    job, rng = sim.job, sim.rng
    k = ctx.culprit = pick_culprit(sim)
    h = job.host_of(k)
    t = ctx.t_fail
    kmsgs = [F.xid(job, k, code, job.pids[k])]
    if code == 79:
        kmsgs += [(f"NVRM: GPU at PCI:0000:{job.bus(k)}:00: GPU-{rng.getrandbits(32):08x}-{rng.getrandbits(16):04x}-"
                  f"{rng.getrandbits(16):04x}-{rng.getrandbits(16):04x}-{rng.getrandbits(48):012x}"),
                  f"NVRM: GPU Board Serial Number: {rng.randint(10**12, 10**13 - 1)}",
                  "NVRM: A GPU crash dump has been created. If possible, please run",
                  "NVRM: nvidia-bug-report.sh as root to collect this data before",
                  "NVRM: the NVIDIA kernel module is unloaded."]
    if code == 48 and rng.random() < 0.5:
        kmsgs.append(F.xid(job, k, 63, None))
    sim.kernel(h, t, kmsgs)
    ta = t + rng.uniform(0.1, 4.0)
    if job.tv >= (2, 0) and rng.random() < 0.6:
        sim.rank_out(k, ta, F.cuda_error_in_watchdog(job, k, job.group(k, job.grad_kind), ta, app_msg), err=True)
        first = {k: (ta + rng.uniform(0.2, 1), -6, "abort")}
    else:
        site = job.site
        frames = [*_script_frames(sim), (f"{site}/torch/cuda/streams.py", 94, "synchronize",
                                         "super().synchronize()") if rng.random() < 0.5 else
                  (f"{site}/torch/_tensor.py", 522, "backward", "torch.autograd.backward(")]
        first = _die_by_exception(sim, k, ta, frames, [f"RuntimeError: CUDA error: {app_msg}",
                                                       ("CUDA kernel errors might be asynchronously reported at some "
                                                       "other API call, so the stacktrace below might be incorrect."),
                                                       "For debugging consider passing CUDA_LAUNCH_BLOCKING=1"])
    _cascade(sim, ctx, first, restart=restart)
    return k, h


def _hw_also(sim: Sim) -> list[str]:
    return [] if sim.prof.kernel else ["cuda_illegal_memory_access", "cuda_library_error", "process_crash_signal"]


def s_xid79(sim: Sim, ctx: Ctx, restart: bool = False) -> Label:
    msg = sim.rng.choice(["unspecified launch failure", "unknown error"])
    k, h = _xid_common(sim, ctx, 79, msg, restart)
    return Label("gpu_hardware_error", f"rank={k}&host={h.name}&gpu=0000:{sim.job.bus(k)}:00", "xid79",
                 _hw_also(sim))


def s_xid_ecc(sim: Sim, ctx: Ctx, restart: bool = False) -> Label:
    code = sim.rng.choice([48, 48, 94, 95]) if sim.job.gpu in ("a100", "h100") else 48
    k, h = _xid_common(sim, ctx, code, "uncorrectable ECC error encountered", restart)
    return Label("gpu_hardware_error", f"rank={k}&host={h.name}&gpu=0000:{sim.job.bus(k)}:00", f"xid{code}",
                 _hw_also(sim))


def s_segfault(sim: Sim, ctx: Ctx, restart: bool = False) -> Label:
    job, rng = sim.job, sim.rng
    k = ctx.culprit = pick_culprit(sim)
    h = job.host_of(k)
    t = ctx.t_fail
    site = job.site
    lib = rng.choice(["libnccl.so.2", "libtorch_cuda.so", "libc10.so", "_C.cpython-310-x86_64-linux-gnu.so"])
    sim.rank_out(k, t, ["Fatal Python error: Segmentation fault", "",
                        f"Thread 0x{0x7F0000000000 + job.pids[k] * 4096:016x} (most recent call first):",
                        f'  File "{site}/torch/autograd/graph.py", line 768 in _engine_run_backward',
                        f'  File "{site}/torch/autograd/__init__.py", line 289 in backward',
                        f'  File "{site}/torch/_tensor.py", line 521 in backward',
                        f'  File "/workspace/{sim.prof.script}", line 302 in train',
                        f'  File "/workspace/{sim.prof.script}", line 412 in <module>', ""], err=True)
    sim.kernel(h, t + 0.01, [(f"python{job.python}[{job.pids[k]}]: segfault at 18 ip 00007f3b2c1a4f3e sp "
                             f"00007ffd5e3b1a80 error 4 in {lib}[7f3b2c000000+1a2e000] likely on CPU "
                             f"{job.local(k) * 12 + 5} (core 5, socket {job.local(k) // 4})"),
                             ("Code: 48 8b 47 18 48 85 c0 74 0c 48 8b 40 08 c3 0f 1f 80 00 00 00 00 31 c0 c3 66 66 2e 0f "
                             "1f 84 00 00 00 00 00 <48> 8b 47 18 c3")])
    _cascade(sim, ctx, {k: (t + 0.02, -11, "signal")}, restart=restart)
    return Label("process_crash_signal", f"rank={k}", "segfault")


def s_host_oom(sim: Sim, ctx: Ctx, restart: bool = False) -> Label:
    job, rng = sim.job, sim.rng
    k = ctx.culprit = pick_culprit(sim)
    h = job.host_of(k)
    t = ctx.t_fail
    cg = sim.prof.launcher == "srun" or rng.random() < 0.3
    sim.kernel(h, t - 0.05, F.oom_killer(job, k, job.pids[k], cg))
    if sim.prof.launcher == "srun" and cg:
        sim.emit(t + 1.5, h.node_rank, -1, "stepd", [(f"slurmstepd: error: Detected 1 oom_kill event in StepId="
                                                     f"{job.slurm_id}.0. Some of the step tasks have been OOM Killed.")],
                 True)
    _cascade(sim, ctx, {k: (t, -9, "oom-cgroup" if cg else "sigkill")}, restart=restart)
    return Label("host_oom_kill", f"rank={k}&host={h.name}&pid={job.pids[k]}", "host_oom", ["process_crash_signal"])


def s_dataloader_oom(sim: Sim, ctx: Ctx, restart: bool = False) -> Label:
    job, rng = sim.job, sim.rng
    k = ctx.culprit = pick_culprit(sim)
    h = job.host_of(k)
    t = ctx.t_fail
    wpid = job.pids[k] + rng.randint(100, 900)
    sim.kernel(h, t - 0.05, F.oom_killer(job, k, wpid, False))
    site = job.site
    frames = [*_script_frames(sim),
              (f"{site}/torch/utils/data/dataloader.py", 631, "__next__", "data = self._next_data()"),
              (f"{site}/torch/utils/data/dataloader.py", 1329, "_next_data", "idx, data = self._get_data()"),
              (f"{site}/torch/utils/data/dataloader.py", 1295, "_get_data", "success, data = self._try_get_data()"),
              (f"{site}/torch/utils/data/dataloader.py", 1146, "_try_get_data",
               "raise RuntimeError(f'DataLoader worker (pid(s) {pids_str}) exited unexpectedly') from e")]
    sim.rank_out(k, t + 0.4, [("ERROR: Unexpected bus error encountered in worker. This might be caused by "
                              "insufficient shared memory (shm).")] if rng.random() < 0.2 else [], err=True)
    first = _die_by_exception(sim, k, t + rng.uniform(0.5, 5), frames,
                              [f"RuntimeError: DataLoader worker (pid(s) {wpid}) exited unexpectedly"]
                              if rng.random() < 0.5 else
                              [f"RuntimeError: DataLoader worker (pid {wpid}) is killed by signal: Killed. "])
    _cascade(sim, ctx, first, restart=restart)
    return Label("dataloader_worker_killed", f"rank={k}&host={h.name}", "dataloader_oom", ["host_oom_kill"])


def s_bad_data(sim: Sim, ctx: Ctx, restart: bool = False) -> Label:
    job, rng = sim.job, sim.rng
    k = ctx.culprit = pick_culprit(sim)
    site = job.site
    w = rng.randrange(2, 8)
    variant = rng.randrange(4)
    inner: list[tuple[str, int, str, str]] = [
        (f"{site}/torch/utils/data/_utils/worker.py", 308, "_worker_loop", "data = fetcher.fetch(index)"),
        (f"{site}/torch/utils/data/_utils/fetch.py", 51, "fetch",
         "data = [self.dataset[idx] for idx in possibly_batched_index]")]
    if variant == 0:
        inner.append(("/workspace/data/jsonl_dataset.py", 88, "__getitem__", 'ids = sample["input_ids"]'))
        err, name = "KeyError: 'input_ids'", "KeyError"
    elif variant == 1:
        inner += [("/workspace/data/jsonl_dataset.py", 61, "__getitem__", "sample = json.loads(line)"),
                  (f"/usr/lib/python{job.python}/json/decoder.py", 353, "raw_decode",
                   "obj, end = self.scan_once(s, idx)")]
        err, name = "json.decoder.JSONDecodeError: Unterminated string starting at: line 1 column 5817 (char 5816)", \
            "JSONDecodeError"
    elif variant == 2:
        inner.append(("/workspace/data/packing.py", 140, "__getitem__", "buf[:len(tokens)] = tokens"))
        err, name = ("ValueError: could not broadcast input array from shape (8193,) into shape (8192,)",
                     "ValueError")
    else:
        inner.append(("/workspace/data/image_dataset.py", 77, "__getitem__", "img = Image.open(path).convert('RGB')"))
        err, name = (("PIL.UnidentifiedImageError: cannot identify image file "
                     "'/data/laion/shard-0412/000412873.jpg'"), "UnidentifiedImageError")
    frames = [*_script_frames(sim),
              (f"{site}/torch/utils/data/dataloader.py", 631, "__next__", "data = self._next_data()"),
              (f"{site}/torch/utils/data/dataloader.py", 1346, "_next_data", "return self._process_data(data)"),
              (f"{site}/torch/utils/data/dataloader.py", 1372, "_process_data", "data.reraise()"),
              (f"{site}/torch/_utils.py", 705, "reraise", "raise exception")]
    exc = [(f"{name if name != 'JSONDecodeError' else 'json.decoder.JSONDecodeError'}: Caught {name} in DataLoader "
           f"worker process {w}."), "Original Traceback (most recent call last):"]
    for f, lno, fn, src in inner:
        exc += [f'  File "{f}", line {lno}, in {fn}', f"    {src}"]
    exc.append(err)
    first = _die_by_exception(sim, k, ctx.t_fail, frames, exc)
    _cascade(sim, ctx, first, restart=restart)
    return Label("python_exception", f"rank={k}", "bad_data")


def s_ckpt_corrupt(sim: Sim, ctx: Ctx, restart: bool = False) -> Label:
    job, rng = sim.job, sim.rng
    k = ctx.culprit = pick_culprit(sim)
    site = job.site
    v = rng.randrange(3)
    path = (f"/lustre/ckpt/gpt/iter_{ctx.step:07d}/mp_rank_{job.coords(k)[0]:02d}_{job.coords(k)[2]:03d}/"
            "model_optim_rng.pt" if sim.prof.framework == "megatron" else
            f"/ckpt/global_step{ctx.step}/zero_pp_rank_{k}_mp_rank_00_optim_states.pt")
    frames = [*_script_frames(sim)[:2],
              ("/workspace/utils/checkpoint.py", 118, "load_checkpoint", ("state = torch.load(ckpt_path, "
                                                                          "map_location='cpu')")),
              (f"{site}/torch/serialization.py", 1025, "load",
               "with _open_zipfile_reader(opened_file) as opened_zipfile:" if v == 0 else
               "return _legacy_load(opened_file, map_location, pickle_module, **pickle_load_args)")]
    if v == 0:
        frames.append((f"{site}/torch/serialization.py", 446, "__init__",
                       "super().__init__(torch._C.PyTorchFileReader(name_or_buffer))"))
        exc = ["RuntimeError: PytorchStreamReader failed reading zip archive: failed finding central directory"]
        also = ["torch_load_failed", "partial_checkpoint_save", "checkpoint_torn_write"]
    elif v == 1:
        frames.append((f"{site}/torch/serialization.py", 1246, "_legacy_load",
                       "magic_number = pickle_module.load(f, **pickle_load_args)"))
        exc = ["_pickle.UnpicklingError: invalid load key, '\\x00'."]
        also = ["torch_load_failed", "unpickling_truncated"]
    else:
        frames.append((f"{site}/torch/serialization.py", 1246, "_legacy_load",
                       "magic_number = pickle_module.load(f, **pickle_load_args)"))
        exc = ["EOFError: Ran out of input"]
        also = ["unpickling_truncated", "torch_load_failed", "partial_checkpoint_save"]
    sim.app(k, ctx.t_fail - rng.uniform(1, 20), "INFO", f"loading checkpoint {path}")
    first = _die_by_exception(sim, k, ctx.t_fail, frames, exc)
    _cascade(sim, ctx, first, restart=restart)
    return Label("checkpoint_corruption", f"rank={k}", "ckpt_corrupt", also)


def s_disk_full(sim: Sim, ctx: Ctx, restart: bool = False) -> Label:
    job, rng = sim.job, sim.rng
    k = ctx.culprit = pick_culprit(sim)
    h = job.host_of(k)
    site = job.site
    frames = [*_script_frames(sim)[:2],
              ("/workspace/utils/checkpoint.py", 64, "save_checkpoint", "torch.save(state, tmp_path)"),
              (f"{site}/torch/serialization.py", 652, "save",
               "_save(obj, opened_zipfile, pickle_module, pickle_protocol, _disable_byteorder_record)"),
              (f"{site}/torch/serialization.py", 886, "_save", "zip_file.write_record(name, storage, num_bytes)")]
    exc = [(f"RuntimeError: [enforce fail at inline_container.cc:{rng.choice([595, 778])}] . unexpected pos "
           f"{rng.randint(10**9, 4 * 10**9)} vs {rng.randint(10**9, 4 * 10**9)}")]
    if rng.random() < 0.5:
        exc = ["OSError: [Errno 28] No space left on device"]
    sim.app(k, ctx.t_fail - rng.uniform(5, 60), "INFO", f"saving local shard to /local_nvme/ckpt/step_{ctx.step}/"
            f"shard_{k:05d}.pt")
    first = _die_by_exception(sim, k, ctx.t_fail, frames, exc)
    _cascade(sim, ctx, first, restart=restart)
    return Label("disk_full", f"rank={k}&host={h.name}", "disk_full",
                 ["torch_save_failed", "checkpoint_torn_write", "partial_checkpoint_save"])


def s_ib_local(sim: Sim, ctx: Ctx, restart: bool = False) -> Label:
    job, rng = sim.job, sim.rng
    k = ctx.culprit = pick_culprit(sim)
    h = job.host_of(k)
    loc = job.local(k)
    t = ctx.t_fail
    nic_bus = ("0c", "12", "48", "4d", "89", "8e", "c6", "cb")[loc % 8]
    sim.kernel(h, t - rng.uniform(0.5, 5), [
        (f"mlx5_core 0000:{nic_bus}:00.0: mlx5_port_module_event:1164:(pid 0): Port module event[error]: module "
        f"{loc}, Cable error, High Temperature"),
        f"mlx5_core 0000:{nic_bus}:00.0 ibp{int(nic_bus, 16)}s0: Link DOWN"])
    sim.rank_out(k, t, F.nccl_warn(job, h, k, t, "transport/net_ib.cc", 101 if job.nv >= (2, 21) else 85,
                                   f"NET/IB : mlx5_{loc}:1 Got async event : port error"), err=True)
    nbs = sim.neighbours(k)
    peer = job.host_of(nbs[0]) if nbs else h
    tt = t + rng.uniform(1, 12)
    sim.blocked_kind = {}
    sim.rank_out(k, tt, F.remote_error(job, k, job.group(k, job.grad_kind), tt, ctx.seqs[job.grad_kind],
                                       *ctx.ops[job.grad_kind], peer, rng.randint(30000, 60999),
                                       "ib" if job.ib else "socket"), err=True)
    first = {k: (tt + rng.uniform(0.1, 0.5), -6, "remote")}
    # the peers wired to the broken link see it too, naming this host's address
    for nb in nbs:
        tn = t + rng.uniform(1, 20)
        sim.rank_out(nb, tn, F.remote_error(job, nb, job.group(nb, job.grad_kind), tn, ctx.seqs[job.grad_kind],
                                            *ctx.ops[job.grad_kind], h, rng.randint(30000, 60999),
                                            "ib" if job.ib else "socket"), err=True)
        first[nb] = (tn + rng.uniform(0.1, 0.5), -6, "remote")
    _cascade(sim, ctx, first, restart=restart)
    return Label("network_fabric_error", f"host={h.name}&rank={k}", "ib_local", ["nccl_error"])


def _stall_story(sim: Sim, ctx: Ctx, k: int, story: str, tp_first: bool) -> Label:
    job, rng = sim.job, sim.rng
    ctx.culprit = k
    tb = block(sim, ctx, k, tp_first)
    timeout = job.timeout_ms / 1000
    # torch >= 2.5: the first rank to time out asks every rank, through the store, to dump its flight recorder;
    # the message on every rank names that reporter, not the culprit.
    if job.tv >= (2, 5) and rng.random() < 0.8:
        reporter = min(tb, key=lambda r: tb[r])
        t_rep = tb[reporter] + timeout + 0.5
        for r in range(job.world):
            if r == reporter:
                continue
            kind = sim.blocked_kind.get(r, job.grad_kind)
            g = job.group(r, kind)
            seq = ctx.seqs[kind]
            enq = seq - 1 if r == k else seq
            sim.rank_out(r, t_rep + rng.uniform(0.05, 2.5), F.dump_signal(job, r, g, t_rep, f" rank {reporter}", enq,
                                                                           seq - 1)[-1:], err=True)
    elif (2, 3) <= job.tv <= (2, 5) and rng.random() < 0.3:
        th = ctx.t_fail + (480 if job.tv >= (2, 4) else 600) + rng.uniform(0, 30)
        sim.rank_out(k, th, F.heartbeat(job, k, job.group(k, job.grad_kind), th, 1), err=True)
    ctx.end = sim.cascade({}, {k}, tb, ctx.seqs, ctx.ops, hang=True)
    _time_limit_if_alive(sim, ctx)
    return Label("straggler_hang", f"rank={k}", story)


def _time_limit_if_alive(sim: Sim, ctx: Ctx) -> None:
    """Ranks nobody killed (srun without kill-on-bad-exit, no local launcher) run into the job's time limit."""
    job, rng = sim.job, sim.rng
    alive = [r for r in range(job.world) if r not in sim.dead]
    if not alive:
        return
    t = ctx.end + rng.uniform(600, 7200)
    for h in {job.host_of(r).node_rank: job.host_of(r) for r in alive}.values():
        sim.emit(t + rng.uniform(0, 0.5), h.node_rank, -1, "stepd",
                 [F.stepd_cancelled(job, h, t, f"JOB {job.slurm_id}", "DUE TO TIME LIMIT")], True)
    for r in alive:
        sim.dead[r] = (t, -15, "srun")
    ctx.end = t + 1


def s_hang(sim: Sim, ctx: Ctx, restart: bool = False) -> Label:
    del restart
    k = pick_culprit(sim)
    if sim.rng.random() < 0.3:
        sim.app(k, ctx.t_fail - sim.rng.uniform(0, 3), "INFO", f"fetching next batch from "
                f"s3://team-data/shards/shard-{sim.rng.randint(0, 99999):05d}.tar")
    return _stall_story(sim, ctx, k, "hang", tp_first=True)


def s_tp_hang(sim: Sim, ctx: Ctx, restart: bool = False) -> Label:
    del restart
    job = sim.job
    k = pick_culprit(sim)
    if job.tp == 1:
        return _stall_story(sim, ctx, k, "hang", tp_first=True)
    ctx.ops["tp"] = ("ALLREDUCE", 16777216)
    return _stall_story(sim, ctx, k, "tp_hang", tp_first=True)


def s_straggler(sim: Sim, ctx: Ctx, restart: bool = False) -> Label:
    del restart
    job, rng = sim.job, sim.rng
    k = pick_culprit(sim)
    # before it stops: the straggler gets slower, and the job says so
    t = ctx.t_fail - 40 * ctx.step_time
    slow = 1.0
    step = ctx.step - 40
    r0 = 0
    while t < ctx.t_fail:
        slow *= rng.uniform(1.05, 1.25)
        t += ctx.step_time * slow
        step += 1
        if sim.prof.framework == "megatron" and step % 5 == 0:
            mx = ctx.step_time * 1000 * slow
            h0 = job.host_of(r0)
            sim.rank_out(r0, t, [(f"INFO:megatron.core.utils:[{F.clock.seconds(job.local_t(h0, t))}] | MnRtt/Rnk: "
                                 f"{ctx.step_time * 990:.2f}ms/{rng.randrange(job.world)} | MxRtt/Rnk: {mx:.2f}ms/{k} | "
                                 f"MnPwr/Rnk: {rng.randint(380, 420)}W/{k} | MxPwr/Rnk: 698W/{rng.randrange(job.world)} "
                                 f"| MnTmp/Rnk: 41C/{rng.randrange(job.world)} | MxTmp/Rnk: {rng.randint(86, 94)}C/{k} "
                                 f"| MnUtl/Rnk: 97%/{rng.randrange(job.world)} | MxUtl/Rnk: 100%/{rng.randrange(job.world)}"
                                 f" | MnClk/Rnk: {rng.randint(700, 1100)}MHz/{k} | MxClk/Rnk: 1980MHz/0")])
        elif step % 4 == 0:
            sim.app(k, t, "WARNING", f"[rank {k}] step {step} took {ctx.step_time * slow:.1f}s "
                    f"(median {ctx.step_time:.1f}s)")
    return _stall_story(sim, ctx, k, "straggler", tp_first=True)


def s_mismatch(sim: Sim, ctx: Ctx, restart: bool = False) -> Label:
    del restart
    job, rng = sim.job, sim.rng
    k = ctx.culprit = pick_culprit(sim)
    seq = ctx.seqs["default"]
    shape = rng.choice([[1024], [4096, 4096], [1]])

    def fp(op: str, sh: list[int]) -> str:
        return (f"CollectiveFingerPrint(SequenceNumber={seq}, OpType={op}, TensorShape={sh}, TensorDtypes=Float, "
                "TensorDeviceTypes=TensorOptions(dtype=float (default), device=cuda, layout=Strided (default), "
                "requires_grad=false (default), pinned_memory=false (default), memory_format=(nullopt)))")

    site = job.site
    if rng.random() < 0.5:
        # TORCH_DISTRIBUTED_DEBUG=DETAIL: every rank checks its fingerprint against the others and raises
        frames = [*_script_frames(sim)[:2],
                  ("/workspace/utils/metrics.py", 51, "reduce_metrics", "dist.all_reduce(t, op=dist.ReduceOp.SUM)"),
                  (f"{site}/torch/distributed/c10d_logger.py", 79, "wrapper", "return func(*args, **kwargs)"),
                  (f"{site}/torch/distributed/distributed_c10d.py", 2288, "all_reduce", ("work = group.allreduce([tensor], "
                                                                                       "opts)"))]
        first = {}
        for r in range(job.world):
            t = ctx.t_fail + rng.uniform(0, 1.5)
            if r == k:
                msg = (f"RuntimeError: Detected mismatch between collectives on ranks. Rank {k} is running collective: "
                       f"{fp('BROADCAST', [1])}, but Rank {0 if k else 1} is running collective: {fp('ALLREDUCE', shape)}."
                       f"Collectives differ in the following aspects: \t Op type: BROADCASTvs ALLREDUCE\t Tensor "
                       f"Tensor shapes: [1]vs {shape}")
            else:
                msg = (f"RuntimeError: Detected mismatch between collectives on ranks. Rank {r} is running collective: "
                       f"{fp('ALLREDUCE', shape)}, but Rank {k} is running collective: {fp('BROADCAST', [1])}."
                       f"Collectives differ in the following aspects: \t Op type: ALLREDUCEvs BROADCAST\t Tensor "
                       f"Tensor shapes: {shape}vs [1]")
            sim.rank_out(r, t, F.py_traceback(job, r, frames, [msg]), err=True)
            first[r] = (t + rng.uniform(0.2, 2), 1, "exception")
        ctx.end = sim.cascade(first, set(), dict.fromkeys(range(job.world), ctx.t_fail), ctx.seqs, ctx.ops)
        return Label("collective_mismatch", f"rank={k}", "mismatch_detail")
    # without the debug mode: the culprit enqueued another collective at the same sequence number; all time out
    tb = {r: ctx.t_fail + rng.uniform(0, 2) for r in range(job.world)}
    sim.blocked_kind = dict.fromkeys(range(job.world), "default")
    timeout = job.timeout_ms / 1000
    g = job.group(k, "default")
    tk = tb[k] + timeout + rng.uniform(0.02, 0.8)
    sim.rank_out(k, tk, F.watchdog_timeout(job, k, g, tk, seq, "BROADCAST", 1, int((tk - tb[k]) * 1000), seq, seq - 1,
                                           sim.prof.stack_frames), err=True)
    ctx.end = sim.cascade({k: (tk + 0.3, -6, "timeout")}, set(), tb, ctx.seqs, ctx.ops)
    return Label("collective_mismatch", f"rank={k}", "mismatch_silent", ["straggler_hang"])


def s_nan(sim: Sim, ctx: Ctx, restart: bool = False) -> Label:
    job, _rng = sim.job, sim.rng
    k = ctx.culprit = pick_culprit(sim)
    h = job.host_of(k)
    if sim.prof.framework == "megatron":
        if job.tv >= (2, 4):
            exc = [(f"RuntimeError: Rank {k}, node {job.me(h)}, device {job.local(k)}, iteration {ctx.step + 1}: "
                   "Unexpected result nan (message='found NaN in local grad norm for bucket #0 in backward pass before "
                   "data-parallel communication collective')")]
        else:
            exc = [(f"AssertionError: Rank {k}: found NaN in local grad norm in backward pass before data-parallel "
                   f"communication collective. Device: {job.local(k)}, node: {job.me(h)}")]
        frames = [*_script_frames(sim),
                  ("/workspace/Megatron-LM/megatron/core/distributed/distributed_data_parallel.py", 418,
                   "start_grad_sync", "bucket_group.start_grad_sync()")]
    else:
        exc = [f"ValueError: loss is nan at step {ctx.step + 1} (rank {k}); aborting"]
        frames = _script_frames(sim)
    first = _die_by_exception(sim, k, ctx.t_fail, frames, exc)
    _cascade(sim, ctx, first, restart=restart)
    return Label("loss_nan", f"rank={k}", "nan_local", ["sdc_grad_norm_spike", "sdc_parameter_drift",
                                                        "python_exception"])


STORIES: dict[str, tuple[Callable[..., Label], float, str]] = {
    # name: (function, weight, phase)
    "cuda_oom": (s_cuda_oom, 1.2, "step"),
    "xid79": (s_xid79, 1.0, "step"),
    "xid_ecc": (s_xid_ecc, 0.8, "step"),
    "segfault": (s_segfault, 0.7, "step"),
    "host_oom": (s_host_oom, 0.9, "step"),
    "dataloader_oom": (s_dataloader_oom, 0.5, "step"),
    "bad_data": (s_bad_data, 0.9, "step"),
    "ckpt_corrupt": (s_ckpt_corrupt, 0.8, "load"),
    "disk_full": (s_disk_full, 0.4, "save"),
    "ib_local": (s_ib_local, 0.9, "step"),
    "hang": (s_hang, 1.0, "step"),
    "tp_hang": (s_tp_hang, 0.7, "step"),
    "straggler": (s_straggler, 0.6, "step"),
    "mismatch": (s_mismatch, 0.7, "step"),
    "nan_local": (s_nan, 0.5, "step"),
}
RESTARTABLE = {"cuda_oom", "xid79", "xid_ecc", "segfault", "host_oom", "bad_data", "ib_local", "nan_local"}


# =============================================================================== red herrings

def rh_aer(sim: Sim, t_fail: float) -> str:
    job, rng = sim.job, sim.rng
    h = rng.choice(job.hosts)
    r = rng.choice(list(job.ranks_on(h)))
    b = job.bus(r)
    t = t_fail - rng.uniform(60, 3000)
    for i in range(rng.randint(1, 4)):
        tt = t + i * rng.uniform(5, 200)
        sim.kernel(h, tt, [f"pcieport 0000:{int(b, 16) - 1:02x}:01.0: AER: Corrected error received: 0000:{b}:00.0",
                           (f"nvidia 0000:{b}:00.0: PCIe Bus Error: severity=Corrected, type=Physical Layer, "
                           "(Receiver ID)"),
                           f"nvidia 0000:{b}:00.0:   device [10de:2330] error status/mask=00000001/0000e000",
                           f"nvidia 0000:{b}:00.0:    [ 0] RxErr                  (First)"])
    return f"aer:{h.name}"


def rh_late_xid(sim: Sim, end: float) -> str:
    job, rng = sim.job, sim.rng
    h = rng.choice(job.hosts)
    r = rng.choice(list(job.ranks_on(h)))
    t = end + rng.uniform(1800, 7200)
    code = rng.choice([13, 31, 79, 48])
    sim.kernel(h, t, [F.xid(job, r, code, rng.randint(1000, 99999))])
    return f"late_xid{code}:{h.name}"


def rh_transient(sim: Sim, t_fail: float) -> str:
    job, rng = sim.job, sim.rng
    r = rng.randrange(job.world)
    t = t_fail - rng.uniform(120, 2400)
    v = rng.randrange(4)
    if v == 0:
        sim.app(r, t, "WARNING", "Retrying (Retry(total=4, connect=None, read=None, redirect=None, status=None)) after "
                "connection broken by 'ReadTimeoutError(\"HTTPSConnectionPool(host='s3.us-west-2.amazonaws.com', "
                "port=443): Read timed out. (read timeout=60)\")': /team-data/shards/shard-00123.tar",
                "urllib3.connectionpool")
    elif v == 1:
        h = job.host_of(r)
        sim.rank_out(r, t, F.nccl_warn(job, h, r, t, "transport/net_ib.cc", 101 if job.nv >= (2, 21) else 85,
                                       f"NET/IB : mlx5_{job.local(r)}:1 Got async event : GID table change"), err=True)
    elif v == 2:
        sim.rank_out(r, t, ["wandb: Network error (ReadTimeout), entering retry loop."], err=True)
        sim.app(r, t + 1, "ERROR", "failed to push metrics, will retry in 30s: ConnectionResetError(104, "
                "'Connection reset by peer')", "metrics")
    else:
        sim.app(r, t, "WARNING", "OOM during eval batch 17, retrying with micro_batch_size=1")
        sim.rank_out(r, t + 0.01, F.oom_message(job, r, 1.5, 300.0), err=True)
    return f"transient{v}:rank{r}"


def rh_overflow(sim: Sim, t_fail: float) -> str:
    _job, rng = sim.job, sim.rng
    t = t_fail - rng.uniform(300, 3000)
    scale = 65536
    for i in range(rng.randint(1, 3)):
        sim.app(0, t + i * 30, "INFO", f"[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: {scale}, "
                f"reducing to {scale // 2}", "deepspeed", "loss_scaler.py:183:update_scale")
        scale //= 2
    return "overflow"


def rh_row_remap(sim: Sim, t_fail: float) -> str:
    job, rng = sim.job, sim.rng
    h = rng.choice(job.hosts)
    r = rng.choice(list(job.ranks_on(h)))
    sim.kernel(h, t_fail - rng.uniform(3600, 30000), [F.xid(job, r, 63, None)])
    return f"xid63:{h.name}"


HERRINGS = [rh_aer, rh_late_xid, rh_transient, rh_overflow, rh_row_remap]
