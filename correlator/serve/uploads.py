"""An upload, received: the multipart body streamed chunk by chunk into one temporary folder, checked as it comes.

Form fields: `file` (repeatable; its filename is the file's path relative to what was dropped, e.g.
`run/attempt_0/3/stderr.log` for a torchrun `--log-dir` tree, so that the engine reads identity from the
names as `diagnose` does), `text` (pasted text: the job's stdin, as `rootrank diagnose -` reads it) and
`job` (as `--job`). Nothing is held in memory but one chunk and the first 8 KiB of each file (the binary
check); the size limit is counted on the bytes as they arrive.
"""

from __future__ import annotations

import asyncio
import re
import zlib
from collections.abc import Awaitable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import BinaryIO, TypeVar

from aiohttp import BodyPartReader, web

from correlator.offline.diagnose import default_job_id, looks_binary

T = TypeVar("T")

CHUNK = 1 << 20
SNIFF = 8192  # what the engine looks at to call a file binary
MAX_FILES = 10_000
MAX_DEPTH = 32
MAX_JOB_CHARS = 200
FILES_DIR = "files"
PASTED_DIR = "pasted"
PASTED_FILE = "pasted.log"
PASTED_LABEL = "pasted text"
HOW = "send multipart/form-data: file=@LOG (repeatable), text=PASTED-LOG, job=NAME; e.g. curl -F file=@rank-0.log URL"


class UploadError(Exception):
    """A request that cannot be diagnosed: `status` (4xx, 507) and a message for the person who sent it."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class NotText(UploadError):
    """A file the engine would not read as a text log (binary, or not the gzip its name says)."""

    def __init__(self, message: str) -> None:
        super().__init__(400, message)


@dataclass
class Upload:
    """What was received, under `root`: files under `root/files/` (their relative paths), the paste in
    `root/pasted/`."""

    root: Path
    files: list[str] = field(default_factory=list)
    entries: list[str] = field(default_factory=list)  # first path parts, in the order they first came
    pasted: bool = False
    job: str | None = None
    size: int = 0
    notes: list[str] = field(default_factory=list)  # files of dropped folders left out, and why

    @property
    def pasted_path(self) -> Path:
        return self.root / PASTED_DIR / PASTED_FILE

    def paths(self) -> list[str]:
        """The inputs as `rootrank diagnose ENTRY... -` would get them: the dropped files and folders in the
        order they came (a folder is read recursively, sorted, as diagnose reads one), the paste last."""
        out = [str(self.root / FILES_DIR / entry) for entry in self.entries]
        if self.pasted:
            out.append(str(self.pasted_path))
        return out

    def job_id(self) -> str:
        """`job`, else what diagnose derives from the same names (the first file or folder), else `stdin`
        (pasted text alone is what diagnose reads from stdin)."""
        return self.job or (default_job_id(self.entries) if self.entries else "stdin")

    def display(self, text: str) -> str:
        """`text` with this upload's temporary paths written as the names the person sent."""
        text = text.replace(str(self.pasted_path), PASTED_LABEL)
        return text.replace(str(self.root / FILES_DIR) + "/", "")


class _Budget:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def take(self, n: int) -> None:
        self.used += n
        if self.used > self.limit:
            raise UploadError(413, too_large_message(self.limit))


def too_large_message(limit: int) -> str:
    return (f"the upload is over the limit of {limit / (1 << 20):g} MiB: start rootrank serve with "
            "--max-upload-mib N to raise it, or run rootrank diagnose on the files")


def safe_relative_path(name: str) -> PurePosixPath:
    """A sent file name as a relative path inside the upload folder: separators normalised, `.` and empty
    parts and a leading `/` or drive (`C:`) dropped; `..`, control characters and over-long names refused."""
    parts = [p for p in name.replace("\\", "/").split("/") if p not in ("", ".")]
    if parts and re.fullmatch(r"[A-Za-z]:", parts[0]):
        parts = parts[1:]
    if not parts:
        raise UploadError(400, f"file name {name!r} names no file")
    if ".." in parts:
        raise UploadError(400, f"file name {name!r} goes up a folder ('..'): send paths inside what was dropped")
    if len(parts) > MAX_DEPTH:
        raise UploadError(400, f"file name {name!r} is more than {MAX_DEPTH} folders deep")
    for part in parts:
        if any(ord(c) < 32 or ord(c) == 127 for c in part) or len(part.encode()) > 255:
            raise UploadError(400, f"file name {name!r} has a control character or a part over 255 bytes")
    return PurePosixPath(*parts)


def check_text(head: bytes, name: str) -> None:
    """Refuse what the engine would skip as binary, from a file's first bytes (a `.gz` file: what it holds)."""
    if name.lower().endswith(".gz"):
        if not head.startswith(b"\x1f\x8b"):
            raise NotText(f"{name}: not gzip data, though its name ends in .gz")
        try:
            head = zlib.decompressobj(wbits=31).decompress(head, SNIFF)
        except zlib.error as exc:
            raise NotText(f"{name}: not readable gzip data ({exc})") from None
        if looks_binary(head):
            raise NotText(f"{name}: what the .gz holds is binary, not a text log")
        return
    if head.startswith(b"\x1f\x8b"):
        raise NotText(f"{name}: gzip data without .gz in its name: name it {name}.gz")
    if looks_binary(head):
        raise NotText(f"{name}: binary data (a NUL byte, or mostly not text, in its first 8 KiB): "
                      "rootrank reads text logs, plain or .gz")


async def _store(part: BodyPartReader, dest: Path, name: str, budget: _Budget, idle_s: float) -> int:
    """Stream one part into `dest`, checking its head; its size."""
    head = bytearray()
    checked = False
    size = 0
    try:
        out: BinaryIO = await asyncio.to_thread(open, dest, "xb")  # closed below, around awaits
    except FileExistsError:
        raise UploadError(400, f"{name}: sent twice (two files with the same path)") from None
    except OSError as exc:
        raise UploadError(507, f"could not store the upload: {exc.strerror or exc}") from None
    with out:
        while chunk := await _within(idle_s, part.read_chunk(CHUNK)):
            budget.take(len(chunk))
            size += len(chunk)
            if not checked:
                head += chunk
                if len(head) >= SNIFF:
                    check_text(bytes(head), name)
                    checked, head = True, bytearray()
            try:
                await asyncio.to_thread(out.write, chunk)  # the event loop goes on with other requests meanwhile
            except OSError as exc:
                raise UploadError(507, f"could not store the upload: {exc.strerror or exc}") from None
    if not checked:
        check_text(bytes(head), name)
    return size


def _place(upload: Upload, rel: PurePosixPath, seen_dirs: set[PurePosixPath], seen_files: set[PurePosixPath]) -> Path:
    """Where a sent file goes; a path that is both a file and a folder of the upload is refused."""
    if rel in seen_dirs or any(parent in seen_files for parent in rel.parents):
        raise UploadError(400, f"{rel}: a file and a folder of the upload have the same path")
    seen_files.add(rel)
    seen_dirs.update(p for p in rel.parents if p != PurePosixPath("."))
    top = rel.parts[0]
    if top not in upload.entries:
        upload.entries.append(top)
    dest = upload.root / FILES_DIR / rel
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UploadError(507, f"could not store the upload: {exc.strerror or exc}") from None
    return dest


async def receive_upload(request: web.Request, root: Path, limit: int, idle_s: float = 60.0) -> Upload:
    """The request's upload, stored under `root` (an empty folder the caller removes); UploadError for
    anything that is not a well-formed upload of text logs within `limit` bytes, or that stalls for
    `idle_s` seconds."""
    if not request.body_exists:
        raise UploadError(400, f"nothing to diagnose: the request has no body; {HOW}")
    if request.content_type != "multipart/form-data":
        raise UploadError(415, f"a body of type {request.content_type} is not an upload: {HOW}")
    if request.content_length is not None and request.content_length > limit + overhead_allowance():
        raise UploadError(413, too_large_message(limit))
    upload = Upload(root)
    budget = _Budget(limit)
    seen_dirs: set[PurePosixPath] = set()
    seen_files: set[PurePosixPath] = set()
    try:
        reader = await request.multipart()
        while (part := await _within(idle_s, reader.next())) is not None:
            if not isinstance(part, BodyPartReader):
                raise UploadError(400, f"a nested multipart part is not an upload: {HOW}")
            await _receive_part(part, upload, budget, seen_dirs, seen_files, idle_s)
    except UploadError:
        raise
    except TimeoutError:
        raise UploadError(408, f"the upload stalled: no data for {idle_s:g} s") from None
    except Exception as exc:  # noqa: BLE001 - whatever the parser raises on the sender's bytes is a bad request
        reason = str(exc) or type(exc).__name__
        raise UploadError(400, f"the request body is not a complete multipart/form-data upload ({reason}): {HOW}") from None
    if not upload.files and not upload.pasted:
        raise UploadError(400, f"nothing to diagnose: the request has no file and no text; {HOW}")
    upload.size = budget.used
    return upload


async def _receive_part(part: BodyPartReader, upload: Upload, budget: _Budget,
                        seen_dirs: set[PurePosixPath], seen_files: set[PurePosixPath], idle_s: float) -> None:
    if part.name == "file":
        if not part.filename:
            raise UploadError(400, f"a file field without a file name: {HOW}")
        if len(upload.files) >= MAX_FILES:
            raise UploadError(413, f"more than {MAX_FILES} files in one upload: send the folders' logs in fewer files")
        rel = safe_relative_path(part.filename)
        dest = _place(upload, rel, seen_dirs, seen_files)
        in_folder = len(rel.parts) > 1
        if in_folder and rel.name.startswith("."):  # as diagnose reads a folder: hidden files are not logs
            await _drain(part, budget, idle_s)
            return
        try:
            await _store(part, dest, str(rel), budget, idle_s)
        except NotText as exc:
            if not in_folder:
                raise  # a file sent on its own must be a log
            # a folder's other files (a core dump, a profile) are skipped with a note, as diagnose skips them
            await _drain(part, budget, idle_s)
            dest.unlink(missing_ok=True)
            upload.notes.append(f"skipped: {exc.message}")
            return
        upload.files.append(str(rel))
    elif part.name == "text":
        if upload.pasted:
            raise UploadError(400, "two text fields: paste the log once")
        upload.pasted_path.parent.mkdir(exist_ok=True)
        if await _store(part, upload.pasted_path, PASTED_LABEL, budget, idle_s):
            upload.pasted = True
        else:
            upload.pasted_path.unlink()  # an empty text box next to dropped files is no input
    elif part.name == "job":
        value = (await _within(idle_s, part.read_chunk(MAX_JOB_CHARS * 4 + 1))).decode("utf-8", "replace").strip()
        if len(value) > MAX_JOB_CHARS or any(ord(c) < 32 for c in value):
            raise UploadError(400, f"job: at most {MAX_JOB_CHARS} characters on one line")
        upload.job = value or None
    else:
        raise UploadError(400, f"unknown form field {part.name!r}: {HOW}")


async def _drain(part: BodyPartReader, budget: _Budget, idle_s: float) -> None:
    """Read the rest of a part without keeping it (it still counts towards the limit)."""
    while chunk := await _within(idle_s, part.read_chunk(CHUNK)):
        budget.take(len(chunk))


async def _within(seconds: float, step: Awaitable[T]) -> T:
    """`step`, or TimeoutError after `seconds` without it (a client that stops sending mid-body)."""
    async with asyncio.timeout(seconds):
        return await step


def overhead_allowance() -> int:
    """Bytes a multipart body may hold beyond its files' content (boundaries and part headers)."""
    return 1 << 20
