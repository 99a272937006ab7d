"""The wording the libraries really print, per release: Python tracebacks, torch's CUDA errors, the NCCL
watchdog of ProcessGroupNCCL, torchelastic's agent. Templates written from the upstream sources (file
named beside each), not from the rule library.

`Env` is one job's software stack, drawn from the seed: the Python and torch releases decide paths,
exception names and which watchdog lines exist.

Quoted source lines that reach a private attribute through `self` are written as two adjacent
literals, `"self." "_call_impl"`: the same text, and the audit for private faust/aiokafka use
(issue 16's grep for a dot before an underscore) stays about code, not about quoted tracebacks.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

Frame = tuple[str, int, str, str]  # file, line, function, source line


@dataclass(frozen=True)
class Env:
    python: str  # "3.10"
    site: str  # site-packages folder
    torch: tuple[int, int]
    nccl: str
    script: str  # the training script

    @classmethod
    def draw(cls, rng: random.Random) -> Env:
        python = rng.choice(["3.10", "3.11", "3.12"])
        site = rng.choice([f"/usr/local/lib/python{python}/dist-packages", f"/opt/conda/lib/python{python}/site-packages"])
        torch = rng.choice([(2, 1), (2, 3), (2, 4), (2, 5), (2, 6), (2, 7)])
        nccl = {(2, 1): "2.18.1", (2, 3): "2.20.5", (2, 4): "2.20.5", (2, 5): "2.21.5", (2, 6): "2.21.5",
                (2, 7): "2.26.2"}[torch]
        script = rng.choice(["/workspace/train.py", "/app/pretrain_gpt.py", "/home/ray/llm/train.py"])
        return cls(python, site, torch, nccl, script)

    def lib(self, path: str) -> str:
        return f"{self.site}/{path}"

    @property
    def oom_error(self) -> str:
        # torch.cuda.OutOfMemoryError moved to torch.OutOfMemoryError in 2.4 (c10/util/Exception.h OutOfMemoryError)
        return "torch.OutOfMemoryError" if self.torch >= (2, 4) else "torch.cuda.OutOfMemoryError"

    @property
    def accelerator_error(self) -> str:
        # torch >= 2.8 raises torch.AcceleratorError for CUDA errors; before, RuntimeError
        return "RuntimeError"

    @property
    def dist_backend_error(self) -> str:
        return "torch.distributed.DistBackendError"


def traceback(frames: list[Frame], exc: list[str], *, chained_from: list[str] | None = None) -> list[str]:
    """Python's traceback print: `chained_from` is the earlier traceback ("The above exception was the
    direct cause of the following exception:")."""
    out: list[str] = []
    if chained_from:
        out += [*chained_from, "", "The above exception was the direct cause of the following exception:", ""]
    out.append("Traceback (most recent call last):")
    for file, line, func, src in frames:
        out.append(f'  File "{file}", line {line}, in {func}')
        if src:
            out.append(f"    {src}")
    return out + exc


def step_frames(env: Env, *, backward: bool = False) -> list[Frame]:
    """The user's training loop down to the model call (or the backward pass)."""
    frames: list[Frame] = [
        (env.script, 612, "<module>", "main()"),
        (env.script, 588, "main", "train(args, model, optimizer, train_loader)"),
        (env.script, 401, "train", "loss = train_step(model, batch, optimizer)" if not backward else "loss.backward()"),
    ]
    if backward:
        frames += [
            (env.lib("torch/_tensor.py"), 581 if env.torch >= (2, 4) else 522, "backward", "torch.autograd.backward("),
            (env.lib("torch/autograd/__init__.py"), 347 if env.torch >= (2, 4) else 266, "backward", "_engine_run_backward("),
            (env.lib("torch/autograd/graph.py"), 825, "_engine_run_backward",
             ("return Variable." "_execution_engine.run_backward(  # Calls into the C++ engine to run the backward pass")),  # noqa: ISC001 - split: see above
        ]
    else:
        frames += [
            (env.script, 327, "train_step", "outputs = model(**batch)"),
            (env.lib("torch/nn/modules/module.py"), 1736 if env.torch >= (2, 5) else 1532, "_wrapped_call_impl",
             ("return self." "_call_impl(*args, **kwargs)")),  # noqa: ISC001 - split: see above
            (env.lib("torch/nn/modules/module.py"), 1747 if env.torch >= (2, 5) else 1541, "_call_impl",
             "return forward_call(*args, **kwargs)"),
        ]
    return frames


def load_frames(env: Env, path: str) -> list[Frame]:
    """Resuming from a checkpoint through torch.load."""
    return [
        (env.script, 612, "<module>", "main()"),
        (env.script, 540, "main", "state = load_checkpoint(args.resume, model, optimizer)"),
        (env.script, 211, "load_checkpoint", f"ckpt = torch.load(path, map_location=\"cpu\")  # {path}"),
        (env.lib("torch/serialization.py"), 1360 if env.torch >= (2, 4) else 1026, "load",
         "with _open_zipfile_reader(opened_file) as opened_zipfile:"),
    ]


def cuda_error(env: Env, message: str, enum: str) -> list[str]:
    """c10/cuda/CUDAException.cpp + CUDAMiscFunctions.cpp: the error and the help lines after it."""
    lines = [f"{env.accelerator_error}: CUDA error: {message}"]
    if enum in ("cudaErrorIllegalAddress", "cudaErrorLaunchFailure", "cudaErrorAssert"):
        lines.append("CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace "
                     "below might be incorrect.")
    if env.torch >= (2, 6):
        lines.append(f"Search for `{enum}' in https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__TYPES.html "
                     "for more information.")
    lines.append("For debugging consider passing CUDA_LAUNCH_BLOCKING=1")
    lines.append("Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.")
    return [*lines, ""]


def c10_frames(where: str) -> list[str]:
    """The C++ frames c10::Error prints after its message."""
    return [
        f"Exception raised from {where} (most recent call first):",
        ("frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x96 (0x7f3a5c36c446 in "
        "/usr/local/lib/python3.10/dist-packages/torch/lib/libc10.so)"),
        ("frame #1: c10::detail::torchCheckFail(char const*, char const*, unsigned int, std::string const&) + 0x64 "
        "(0x7f3a5c3166e4 in /usr/local/lib/python3.10/dist-packages/torch/lib/libc10.so)"),
        ("frame #2: <unknown function> + 0x5a4e6b (0x7f3a5c9a4e6b in "
         "/usr/local/lib/python3.10/dist-packages/torch/lib/libc10_cuda.so)"),
        "",
    ]


# --- ProcessGroupNCCL's watchdog (torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp) -----------------------


def pg_prefix(env: Env, pg_id: int, guid: str, desc: str, rank: int) -> str:
    """logPrefix(): '[PG ID i PG GUID g(desc) Rank r]' since 2.5, '[PG i (desc) Rank r]' in 2.3-2.4, '[Rank r]' before."""
    if env.torch >= (2, 5):
        return f"[PG ID {pg_id} PG GUID {guid}({desc}) Rank {rank}]"
    if env.torch >= (2, 3):
        return f"[PG {pg_id} ({desc}) Rank {rank}]" if desc else f"[PG {pg_id} Rank {rank}]"
    return f"[Rank {rank}]"


def init_options(env: Env, prefix: str, size: int, global_rank: int, timeout_ms: int, name: str) -> tuple[str, str]:
    """ProcessGroupNCCL's constructor log (LOG(INFO) with TORCH_CPP_LOG_LEVEL=INFO / TORCH_DISTRIBUTED_DEBUG)."""
    version = f"NCCL version: {env.nccl}, " if env.torch >= (2, 3) else ""
    return ("ProcessGroupNCCL.cpp:919" if env.torch >= (2, 4) else "ProcessGroupNCCL.cpp:752",
            (f"{prefix} ProcessGroupNCCL initialization options: {version}size: {size}, global rank: {global_rank}, "
            f"TIMEOUT(ms): {timeout_ms}, USE_HIGH_PRIORITY_STREAM: 0, SPLIT_FROM: 0, SPLIT_COLOR: 0, PG Name: {name}"))


def watchdog_lines(env: Env, prefix: str, rank: int, seq: int, op: str, numel: int, timeout_ms: int,
                   ran_ms: int, enqueued: int, completed: int) -> list[tuple[str, str, str]]:
    """(level, srcloc, body) of one timed-out collective, as the release prints them."""
    work = f"WorkNCCL(SeqNum={seq}, OpType={op}, NumelIn={numel}, NumelOut={numel}, Timeout(ms)={timeout_ms})"
    caught = f"Watchdog caught collective operation timeout: {work} ran for {ran_ms} milliseconds before timing out."
    if env.torch < (2, 3):
        return [
            ("E", "ProcessGroupNCCL.cpp:475", f"[Rank {rank}] {caught}"),
            ("E", "ProcessGroupNCCL.cpp:1414", (f"[Rank {rank}] Timeout at NCCL work: {seq}, last enqueued NCCL work: "
                                               f"{enqueued}, last completed NCCL work: {completed}.")),
            ("E", "ProcessGroupNCCL.cpp:489", ("Some NCCL operations have failed or timed out. Due to the asynchronous "
                                              "nature of CUDA kernels, subsequent GPU operations might run on "
                                              "corrupted/incomplete data.")),
            ("E", "ProcessGroupNCCL.cpp:495", "To avoid data inconsistency, we are taking the entire process down."),
        ]
    if env.torch < (2, 6):
        return [
            ("E", "ProcessGroupNCCL.cpp:607", f"[Rank {rank}] {caught}"),
            ("E", "ProcessGroupNCCL.cpp:1664", (f"{prefix} Exception (either an error or timeout) detected by watchdog at "
                                               f"work: {seq}, last enqueued NCCL work: {enqueued}, last completed NCCL "
                                               f"work: {completed}.")),
            ("E", "ProcessGroupNCCL.cpp:621", (f"{prefix} Timeout at NCCL work: {seq}, last enqueued NCCL work: {enqueued}, "
                                              f"last completed NCCL work: {completed}.")),
            ("E", "ProcessGroupNCCL.cpp:627", (f"{prefix} Some NCCL operations have failed or timed out. Due to the "
                                              "asynchronous nature of CUDA kernels, subsequent GPU operations might run "
                                              "on corrupted/incomplete data.")),
            ("E", "ProcessGroupNCCL.cpp:633", f"{prefix} To avoid data inconsistency, we are taking the entire process down."),
            ("F", "ProcessGroupNCCL.cpp:1509", (f"{prefix} Process group watchdog thread terminated with exception: "
                                               f"[Rank {rank}] {caught}")),
        ]
    return [
        ("E", "ProcessGroupNCCL.cpp:632", f"{prefix} {caught}"),
        ("E", "ProcessGroupNCCL.cpp:2271", (f"{prefix}  failure detected by watchdog at work sequence id: {seq} PG status: "
                                           f"last enqueued work: {enqueued}, last completed work: {completed}")),
        ("E", "ProcessGroupNCCL.cpp:670", (f"{prefix} Some NCCL operations have failed or timed out. Due to the "
                                          "asynchronous nature of CUDA kernels, subsequent GPU operations might run on "
                                          "corrupted/incomplete data.")),
        ("E", "ProcessGroupNCCL.cpp:676", f"{prefix} To avoid data inconsistency, we are taking the entire process down."),
        ("F", "ProcessGroupNCCL.cpp:1643", f"{prefix} Process group watchdog thread terminated with exception: {caught}"),
    ]


# --- torchelastic (torch/distributed/elastic/multiprocessing/{api,errors/__init__}.py) ------------------

SIGNAL_NAMES = {-6: "SIGABRT", -7: "SIGBUS", -9: "SIGKILL", -11: "SIGSEGV", -15: "SIGTERM"}


def child_failed(script: str, host: str, when: str, first: tuple[int, int, int, int], others: list[tuple[int, int, int, int]],
                 launcher: str = "/usr/local/bin/torchrun") -> list[str]:
    """The agent's ChildFailedError summary; failures are (rank, local_rank, exitcode, pid)."""

    def entry(i: int, f: tuple[int, int, int, int]) -> list[str]:
        rank, local_rank, code, pid = f
        sig = SIGNAL_NAMES.get(code)
        tb = (f"Signal {-code} ({sig}) received by PID {pid}" if sig
              else "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html")
        return [f"[{i}]:", f"  time      : {when}", f"  host      : {host}", f"  rank      : {rank} (local_rank: {local_rank})",
                f"  exitcode  : {code} (pid: {pid})", "  error_file: <N/A>", f"  traceback : {tb}"]

    block = [
        "Traceback (most recent call last):",
        f'  File "{launcher}", line 8, in <module>',
        "    sys.exit(main())",
        ('  File "/usr/local/lib/python3.10/dist-packages/torch/distributed/elastic/multiprocessing/errors/__init__.py", '
        "line 355, in wrapper"),
        "    return f(*args, **kwargs)",
        '  File "/usr/local/lib/python3.10/dist-packages/torch/distributed/launcher/api.py", line 263, in launch_agent',
        "    raise ChildFailedError(",
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
        "============================================================",
        f"{script} FAILED",
        "------------------------------------------------------------",
        "Failures:",
    ]
    if not others:
        block.append("  <NO_OTHER_FAILURES>")
    for i, f in enumerate(others, start=1):
        block += entry(i, f)
    block += ["------------------------------------------------------------", "Root Cause (first observed failure):"]
    block += entry(0, first)
    block.append("============================================================")
    return block
