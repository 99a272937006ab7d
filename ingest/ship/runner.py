"""`rootrank ship`: send log lines to Kafka from files, stdin, or a wrapped command.

    rootrank ship --job J --file rank0.log --follow      follow files (rotation-aware, resumes)
    some_command 2>&1 | rootrank ship --job J             read stdin
    rootrank ship --job J --rank 3 -- python train.py     wrap a command

Design, from the wrapped process's point of view: it must never wait for us. Its stdout/stderr
are read by one thread per pipe in large chunks, written straight through to our stdout/stderr,
and handed to a bounded in-memory queue that spills to a disk file when the batcher falls behind;
nothing on that path waits for the network (past that file's bound, output is dropped, and said
so loudly). A batcher thread splits chunks into lines and packs
them into messages (wire_format.py: identity once per message, each line `[ts, stream, text]`,
bounded by size and by a linger time). Messages go to Kafka with acks=all and compression; while
Kafka is down or slow they go to a bounded disk spool that a drain thread sends, in order, when
the broker is back, also after a restart of the shipper. Positions of followed files are saved
only once the lines before them are acknowledged by Kafka or safe in the spool, so a restart
resumes without losing a line (and re-sends at most a few, which the worker recognises by the
batch's stable line offsets).

Files are different: they are already on disk, so nothing of theirs is ever dropped. Backpressure
instead, end to end: when the spool is full and Kafka is not taking messages, the batcher waits
to submit a file's message; it stops taking chunks, the frame reader stops reading the pipe, the
parent's forwarder blocks writing it, the in-memory queue fills, and the file readers wait for
room (never spilling to disk). On SIGINT/SIGTERM the parent tells the shipping process through a
control pipe; a message still waiting then is left out ("deferred"): its file's saved position
stays before it, so the next run reads it again.
"""

from __future__ import annotations

import contextlib
import fcntl
import gc
import hashlib
import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import orjson

from ingest.ship.batcher import Batcher
from ingest.ship.chunks import Chunk, ChunkQueue, Source
from ingest.ship.cluster import ProbeResult, probe_in_child
from ingest.ship.frames import FrameQueue, forward_frames, send_pid
from ingest.ship.options import ShipOptions, ShipStats
from ingest.ship.positions import BacklogFile, Positions, measure_backlog, resume_position
from ingest.ship.readers import file_reader, pipe_reader
from ingest.ship.sender import Sender
from ingest.ship.spool import Spool
from ingest.ship.wire_format import CONTEXT_LINES, CONTEXT_MAX_BYTES

__all__ = ["ShipOptions", "ShipStats", "run_ship"]

log = logging.getLogger("rootrank.ship")

def _state_key(options: ShipOptions, files: Sequence[str], command: Sequence[str], cluster_key: str) -> str:
    """The state folder of these inputs shipped to this Kafka (ingest/ship/cluster.py): its positions and
    spool say what that cluster got, not what another one did."""
    basis = orjson.dumps([options.job_id, options.rank, options.topic, sorted(str(Path(f).resolve()) for f in files),
                          list(command[:1]), cluster_key])
    return hashlib.sha1(basis).hexdigest()[:12]


@contextlib.contextmanager
def _locked_dir(base: Path, name: str) -> Iterator[Path]:
    """A state folder only this process uses (a second shipper with the same inputs gets its own)."""
    base.mkdir(parents=True, exist_ok=True)
    candidates = [base / name, base / f"{name}-{os.getpid()}"]
    for path in candidates:
        path.mkdir(parents=True, exist_ok=True)
        lock = open(path / "lock", "w")  # noqa: SIM115 - held for the whole run
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            continue
        try:
            yield path
        finally:
            lock.close()
        return
    raise RuntimeError(f"no free state folder under {base}")


def run_ship(options: ShipOptions, *, files: Sequence[str] = (), command: Sequence[str] = ()) -> int:
    """Ship until the input ends (or, following files, until SIGINT/SIGTERM). Returns the exit code:
    the wrapped command's, else 0 (1 when lines of a pipe were dropped because the spool or the
    overflow file was full; files are never dropped: reading them waits instead)."""
    if options.attempt is None and os.environ.get("TORCHELASTIC_RESTART_COUNT", "").isdigit():
        options.attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    # Hand the GIL over quickly, so the pipe readers run as soon as the child writes.
    sys.setswitchinterval(0.001)
    # Batches are millions of short-lived tuples and no cycles: collecting them is pure overhead.
    gc.set_threshold(200_000, 50, 100)
    base = Path(options.state_dir)
    probe = probe_in_child(options.kafka, options.topic, base,
                           lambda key: base / _state_key(options, files, command, key) / "positions.json",
                           connect=bool(files))
    with _locked_dir(base, _state_key(options, files, command, probe.cluster_key)) as state:
        return _run(options, state, list(files), list(command), probe)



def _start_progress(options: ShipOptions, stats: ShipStats, backlog: dict[int, BacklogFile] | None) -> Any:
    """The backlog display (ingest.ship.progress), started, or None: it lives here, where the acks are."""
    from ingest.ship.progress import BacklogProgress, progress_mode

    total = sum(b.bytes for b in backlog.values()) if backlog is not None else None
    try:
        is_terminal = sys.stderr is not None and sys.stderr.isatty()
    except (AttributeError, ValueError):
        is_terminal = False
    mode = progress_mode(options.progress, is_terminal, total)
    if mode is None or total is None:
        return None
    progress = BacklogProgress(stats, total, mode, interval_s=options.progress_interval_s, follow=options.follow)
    progress.start()
    return progress


def _watch_control(fd: int, sender: Sender) -> None:
    """Shipping-process side of the control pipe: a byte (the parent is stopping) or its end (the
    parent is gone): a file's message waiting for room in the spool gives up (see Sender.stop_waiting)."""
    with contextlib.suppress(OSError):
        os.read(fd, 1)
    sender.stop_waiting()


def _shipping_process(fd: int, options: ShipOptions, state: Path, sources: dict[int, Source],
                      backlog: dict[int, BacklogFile] | None = None, control_fd: int | None = None) -> int:
    """The forked process that batches and sends, at low CPU priority: the wrapped command (and the
    parent that passes its output through) always come first."""
    with contextlib.suppress(OSError):
        os.nice(10)
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        # It stops when the parent's stream ends, after draining (bounded by drain_timeout_s).
        signal.signal(signum, signal.SIG_IGN)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)  # never holds the parent's stdout open (a `| tee` downstream sees EOF in time)
    os.close(devnull)
    stats = ShipStats()
    spool = Spool(state / "spool", options.spool_max_bytes)
    positions = Positions(state / "positions.json")
    sender = Sender(options, spool, stats)
    if control_fd is not None:
        threading.Thread(target=_watch_control, args=(control_fd, sender), name="ship-control", daemon=True).start()
    frames = FrameQueue(fd, sources)
    batcher = Batcher(options, sources, frames, sender, positions, stats, backlog)
    names = {batcher.key_of(source): source.name for source in sources.values() if source.file is not None}

    def landed(key: bytes, partition: int, offset: int) -> None:
        name = names.get(key)
        if name is not None:
            positions.acknowledged(name, partition, offset)

    sender.on_kafka_ack = landed
    if options.on_start is not None:
        options.on_start(stats, options.line_filter)
    progress = _start_progress(options, stats, backlog)
    saver_stop = threading.Event()

    def save_positions() -> None:
        while not saver_stop.wait(1.0):
            positions.save()

    threading.Thread(target=save_positions, name="ship-positions", daemon=True).start()
    try:
        batcher.run(threading.Event())
    finally:
        sender.close(options.drain_timeout_s)
        saver_stop.set()
        positions.save()
        if progress is not None:
            progress.stop()
    print(
        f"rootrank ship: {stats.lines} lines in {stats.messages} messages; "
        f"{stats.acked_messages} acknowledged, {stats.spooled_messages} went through the spool, "
        f"{stats.pending_messages} still spooled in {state / 'spool'}"
        + (f", {stats.waited_messages} waited for room in the spool (reading the files paused)"
           if stats.waited_messages else "")
        + (f", {stats.deferred_lines} lines left for the next run (the spool was full when stopped; "
           "their files' saved positions are before them)" if stats.deferred_messages else "")
        + (f", {stats.dropped_lines} lines dropped (spool full)" if stats.dropped_lines else ""),
        file=sys.stderr, flush=True,
    )
    if stats.dropped_lines:
        print(f"rootrank ship: ERROR: {stats.dropped_lines} lines in {stats.dropped_messages} messages were NOT shipped: "
              f"Kafka was not taking messages and the spool in {state / 'spool'} was full "
              f"(--spool-max-mib {options.spool_max_bytes / 2**20:g}); raise --spool-max-mib (disk permitting) "
              "or check the broker", file=sys.stderr, flush=True)
    return 1 if stats.dropped_lines else 0


def _lines_before(path: str, pos: int) -> list[str]:
    """The last lines of `path` before byte `pos` (a line's start): a resumed run's first batch's context."""
    begin = max(0, pos - CONTEXT_MAX_BYTES)
    try:
        with open(path, "rb") as fh:
            fh.seek(begin)
            data = fh.read(pos - begin)
    except OSError:
        return []
    lines = data.decode("utf-8", "replace").split("\n")
    if data.endswith(b"\n"):
        lines.pop()
    if begin > 0:
        lines = lines[1:]  # the first may be the end of a longer line
    return lines[-CONTEXT_LINES:]


def _resume_numbering(sources: dict[int, Source], positions: Positions, backlog: dict[int, BacklogFile] | None) -> None:
    """Before the shipping process is forked (it inherits the sources): a file that resumes from a saved
    position numbers its lines from the saved line number and has the lines before it for its first
    batch's context, and every file's key is read from its first line (ingest/order.py), so the lines'
    positions, order and look back are the file's whatever run sends them."""
    for source in sources.values():
        if source.file is None:
            continue
        start = backlog.get(source.id) if backlog is not None else None
        saved = positions.get(source.name)
        if start is not None and start.start > 0 and saved is not None:
            source.next_line = int(saved.get("line", 0))
            source.fresh = False
            source.recent = _lines_before(source.file, start.start)
        try:
            with open(source.file, "rb") as fh:
                head = fh.read(65536)
        except OSError:
            continue
        source.note_head(head)


def _check_positions(options: ShipOptions, sources: dict[int, Source], positions: Positions, probe: ProbeResult) -> None:
    """Before anything is read: a file shipped to this Kafka before resumes where it stopped, and says so
    when nothing is left; --from-start, or a topic that no longer holds what was shipped (a fresh stack
    that gives the same cluster id), ships it from its first line again."""
    for source in sources.values():
        if source.file is None:
            continue
        saved = positions.get(source.name)
        if saved is None:
            continue
        when = _when(saved)
        kafka = saved.get("kafka")
        if options.from_start:
            positions.forget(source.name)
            continue
        if isinstance(kafka, list) and len(kafka) == 2 and probe.holds.get((int(kafka[0]), int(kafka[1]))) is False:
            print(f"rootrank ship: {source.file}: {options.topic} no longer holds the lines shipped {when} (a new stack?); "
                  "sending them again", file=sys.stderr, flush=True)
            positions.forget(source.name)
            continue
        try:
            st = os.stat(source.file)
        except OSError:
            continue
        if resume_position(saved, st.st_ino, st.st_size) == st.st_size and not options.follow:
            print(f"rootrank ship: {source.file}: already shipped up to line {int(saved.get('line', 0))} {when}; "
                  "--from-start sends it again", file=sys.stderr, flush=True)
    positions.save()


def _when(saved: dict[str, Any]) -> str:
    at = saved.get("at")
    if not isinstance(at, (int, float)):
        return "earlier"
    import datetime as dt

    return "at " + dt.datetime.fromtimestamp(at, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _run(options: ShipOptions, state: Path, files: list[str], command: list[str], probe: ProbeResult) -> int:
    """Two processes: this one reads the inputs (and passes a wrapped command's output through);
    a forked, lower-priority one batches and sends. Only chunks cross, through a pipe."""
    sources: dict[int, Source] = {}

    def add_source(**kw: Any) -> Source:
        source = Source(id=len(sources), **kw)
        sources[source.id] = source
        return source

    if command:
        for name in ("stdout", "stderr"):
            add_source(name=name, stream=name)
    elif files:
        for path in files:
            add_source(name=str(Path(path).resolve()), file=path)
    else:
        add_source(name="stdin")

    positions = Positions(state / "positions.json")  # where followed files resume (written here only below)
    if files:
        _check_positions(options, sources, positions, probe)
    # Files: their backlog, measured before any is read (the shipping process shows its progress).
    backlog = measure_backlog(sources, positions) if files else None
    _resume_numbering(sources, positions, backlog)

    sys.stdout.flush()
    sys.stderr.flush()
    read_end, write_end = os.pipe()
    # Parent -> shipping process, beside the frames (which may be blocked by backpressure): one byte
    # when stopping; its end when the parent is gone.
    control_read, control_write = os.pipe()
    os.set_blocking(control_write, False)  # written from a signal handler: never waits
    shipper_pid = os.fork()
    if shipper_pid == 0:  # the shipping process
        code = 1
        try:
            os.close(write_end)
            os.close(control_write)
            code = _shipping_process(read_end, options, state, sources, backlog, control_read)
        except BaseException:
            log.exception("shipping process failed")
        finally:
            sys.stderr.flush()
            os._exit(code)
    os.close(read_end)
    os.close(control_read)
    try:
        return _read_inputs(options, state, sources, positions, files, command, write_end, shipper_pid,
                            control_write)
    finally:
        os.close(control_write)


def _read_inputs(options: ShipOptions, state: Path, sources: dict[int, Source], positions: Positions,
                 files: list[str], command: list[str], write_end: int, shipper_pid: int, control_write: int) -> int:
    """The parent's side of `_run`, once the shipping process is forked: read, forward, wait for it."""
    queue = ChunkQueue(options.queue_max_bytes, state / "overflow", options.spool_max_bytes)
    stop = threading.Event()
    threads: list[threading.Thread] = []
    child: subprocess.Popen[bytes] | None = None
    if command:
        try:
            child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0)
        except OSError as exc:
            print(f"rootrank ship: cannot run {command[0]}: {exc}", file=sys.stderr)
            for source in sources.values():
                queue.put(Chunk(source.id, b"", None, eof=True))
            forward_frames(write_end, queue, len(sources))
            os.waitpid(shipper_pid, 0)
            return 127
        assert child.stdout is not None and child.stderr is not None
        for source, pipe, out_fd in ((sources[0], child.stdout, 1), (sources[1], child.stderr, 2)):
            source.pid = child.pid
            send_pid(write_end, source.id, child.pid)
            threads.append(threading.Thread(target=pipe_reader, args=(pipe.fileno(), source, queue, out_fd),
                                            name=f"ship-{source.name}", daemon=True))
    elif files:
        threads.extend(threading.Thread(target=file_reader,
                                        args=(Path(source.file or ""), source, queue, positions, options, stop),
                                        name=f"ship-file-{source.id}", daemon=True)
                       for source in sources.values())
    else:
        threads.append(threading.Thread(target=pipe_reader,
                                        args=(sys.stdin.fileno(), sources[0], queue, 1 if options.tee else None),
                                        name="ship-stdin", daemon=True))
    forwarder = threading.Thread(target=forward_frames, args=(write_end, queue, len(sources)),
                                 name="ship-forward", daemon=True)

    def forward(signum: int, _frame: Any) -> None:
        if child is not None and child.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(signum)
        else:
            stop.set()
            with contextlib.suppress(OSError):  # full (it was told already), or closed
                os.write(control_write, b"s")

    previous: dict[int, Any] = {}
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        if signum == signal.SIGINT and child is not None:
            # The terminal already sends Ctrl-C to the whole foreground group, the child included.
            previous[signum] = signal.signal(signum, signal.SIG_IGN)
        else:
            previous[signum] = signal.signal(signum, forward)
    for thread in threads:
        thread.start()
    forwarder.start()
    code = 0
    try:
        if child is not None:
            code = child.wait()
            if code < 0:
                code = 128 - code  # killed by a signal: report it like a shell does
        for thread in [*threads, forwarder]:
            while thread.is_alive():
                thread.join(0.2)
        _, status = os.waitpid(shipper_pid, 0)
    finally:
        stop.set()
        queue.close()
        for restored, handler in previous.items():
            signal.signal(restored, handler)
    shipper_failed = (os.WIFEXITED(status) and os.WEXITSTATUS(status) != 0) or os.WIFSIGNALED(status)
    if queue.dropped_chunks:
        what = "the command's output" if command else "standard input"
        print(f"rootrank ship: ERROR: {queue.dropped_bytes} bytes (about {queue.dropped_lines} lines, in "
              f"{queue.dropped_chunks} chunks) of {what} were NOT shipped: shipping fell behind and the overflow "
              f"file in {state / 'overflow'} was full (--spool-max-mib "
              f"{options.spool_max_bytes / 2**20:g}); raise --spool-max-mib (disk permitting) or make Kafka faster",
              file=sys.stderr, flush=True)
    if code == 0 and (shipper_failed or queue.dropped_bytes):
        return 1
    return code
