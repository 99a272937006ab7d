"""`rootrank serve`'s app with aiohttp's test client: the same JSON as `diagnose`, and every bad request a 4xx
with a message (never a 500), the temporary folder gone after each answer, the guards (Host, token)."""

from __future__ import annotations

import asyncio
import gzip
import io
import json
import os
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer

from correlator.offline.diagnose import Diagnoser
from correlator.serve import diagnosis as serve_diagnosis
from correlator.serve.app import PageStore, Settings, create_app
from correlator.serve.uploads import UploadError, safe_relative_path
from tests.fixtures.serve_logs import (
    PASTE_INITIATOR,
    diagnose_json,
    paste_log,
    simulated_hosts,
    torchrun_tree,
)

TOKEN = "0123456789abcdef0123"


@pytest.fixture(scope="module")
def diagnoser() -> Diagnoser:
    return Diagnoser()


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return simulated_hosts(tmp_path_factory.mktemp("hosts"))


def serve(diagnoser: Diagnoser, test: Callable[[TestClient[Any, Any]], Awaitable[None]], **settings: Any) -> None:
    """Run `test` against a fresh app on a free port of 127.0.0.1, stopped after."""
    settings.setdefault("log", lambda message: None)

    async def main() -> None:
        async with TestClient(TestServer(create_app(diagnoser, Settings(**settings)))) as client:
            await test(client)

    asyncio.run(main())


def form(*files: tuple[str, bytes], text: str | None = None, job: str | None = None) -> aiohttp.FormData:
    data = aiohttp.FormData(default_to_multipart=True, quote_fields=False)  # file names as browsers send them
    for name, content in files:
        data.add_field("file", io.BytesIO(content), filename=name, content_type="application/octet-stream")
    if text is not None:
        data.add_field("text", text)
    if job is not None:
        data.add_field("job", job)
    return data


async def post(client: TestClient[Any, Any], data: Any, **kwargs: Any) -> tuple[int, bytes, dict[str, str]]:
    async with client.post("/api/diagnose", data=data, **kwargs) as resp:
        return resp.status, await resp.read(), dict(resp.headers)


def error_of(status: int, body: bytes) -> str:
    assert 400 <= status < 500 or status == 507, (status, body[:300])
    message = json.loads(body)["error"]
    assert isinstance(message, str) and message
    return message


# --- the same answer as `rootrank diagnose --format json` ------------------------------------------------


def test_two_files_answer_the_bytes_diagnose_prints(diagnoser: Diagnoser, hosts: list[Path]) -> None:
    expected = diagnose_json(*(h.name for h in hosts), cwd=hosts[0].parent)

    async def test(client: TestClient[Any, Any]) -> None:
        status, body, headers = await post(client, form(*((h.name, h.read_bytes()) for h in hosts)))
        assert status == 200, body
        assert body == expected
        assert headers["X-Rootrank-Job"] == "node00" and "X-Rootrank-Notes" not in headers

    serve(diagnoser, test)
    incident = json.loads(expected)["incidents"][0]
    assert (incident["class"], incident["initiator"]["host"]) == ("cuda_oom", "node00")


def test_pasted_text_is_what_diagnose_reads_from_stdin(diagnoser: Diagnoser, tmp_path: Path) -> None:
    text = paste_log()
    expected = diagnose_json("-", cwd=tmp_path, stdin=text.encode())

    async def test(client: TestClient[Any, Any]) -> None:
        status, body, _ = await post(client, form(text=text))
        assert (status, body) == (200, expected)

    serve(diagnoser, test)
    incident = json.loads(expected)["incidents"][0]
    assert (incident["class"], incident["initiator"]["rank"], incident["job_id"]) == ("cuda_oom", PASTE_INITIATOR, "stdin")


def test_a_torchrun_tree_keeps_its_paths_and_gz_is_read(diagnoser: Diagnoser, tmp_path: Path) -> None:
    """A folder drop sends each file with its path relative to what was dropped; `.gz` files are read as
    diagnose reads them; the job is named as diagnose names it, or by `job`."""
    run = torchrun_tree(tmp_path)
    gz = simulated_hosts(tmp_path / "gz", gz=True)
    expected_tree = diagnose_json("run", cwd=tmp_path)
    expected_gz = diagnose_json("--job", "my-job", *(g.name for g in gz), cwd=gz[0].parent)
    tree = [(str(p.relative_to(tmp_path)), p.read_bytes()) for p in sorted(run.rglob("*.log"), reverse=True)]

    async def test(client: TestClient[Any, Any]) -> None:
        status, body, _ = await post(client, form(*tree))
        assert (status, body) == (200, expected_tree)
        status, body, _ = await post(client, form(*((g.name, g.read_bytes()) for g in gz), job="my-job"))
        assert (status, body) == (200, expected_gz)

    serve(diagnoser, test)
    incident = json.loads(expected_tree)["incidents"][0]
    assert (incident["class"], incident["initiator"]["local_rank"]) == ("cuda_illegal_memory_access", 2)
    assert json.loads(expected_gz)["incidents"][0]["job_id"] == "my-job"


def test_a_dropped_folder_skips_what_diagnose_skips_in_a_folder(diagnoser: Diagnoser, hosts: list[Path],
                                                                tmp_path: Path) -> None:
    """Inside a dropped folder, a binary file (a core dump) or a broken .gz is skipped with a note and a hidden
    file is left out, as `diagnose FOLDER` does; the answer is diagnose's, byte for byte. Sent on its own,
    the same binary file is refused (the bad-request cases)."""
    job = tmp_path / "训练-job"  # any text may name a file, a folder and so the job
    job.mkdir()
    (job / "node00.log").write_bytes(hosts[0].read_bytes())
    (job / "core.4242").write_bytes(b"\x7fELF" + bytes(256) * 64)
    (job / "old.log.gz").write_bytes(b"not gzip")
    (job / ".DS_Store").write_bytes(b"\0\0\0\1Bud1" + bytes(4000))
    expected = diagnose_json(job.name, cwd=tmp_path)
    sent = [(f"{job.name}/{p.name}", p.read_bytes()) for p in sorted(job.iterdir())]

    async def test(client: TestClient[Any, Any]) -> None:
        status, body, headers = await post(client, form(*sent))
        assert (status, body) == (200, expected)
        notes = json.loads(headers["X-Rootrank-Notes"])
        assert [n.split(":")[1].strip() for n in notes] == [f"{job.name}/core.4242", f"{job.name}/old.log.gz"]
        assert headers["X-Rootrank-Job"] == "%E8%AE%AD%E7%BB%83-job"  # the job's name, percent-encoded

    serve(diagnoser, test)
    assert json.loads(expected)["incidents"][0]["job_id"] == "训练-job"


def test_the_picture_of_each_incident_is_kept_with_evidence_file_and_line(diagnoser: Diagnoser, hosts: list[Path]) -> None:
    async def test(client: TestClient[Any, Any]) -> None:
        status, body, _ = await post(client, form(*((h.name, h.read_bytes()) for h in hosts)))
        assert status == 200
        incident = json.loads(body)["incidents"][0]
        async with client.get(f"/incident/{incident['incident_id']}") as resp:
            assert resp.status == 200
            assert "style-src 'unsafe-inline'" in resp.headers["Content-Security-Policy"]
            page = await resp.text()
        lanes = set(re.findall(r'<g class="lane[^"]*" data-host="[^"]*" data-rank="(\d+)"', page))
        assert lanes == {str(r) for r in range(16)}  # one lane per rank
        assert incident["incident_id"] in page and incident["initiator"]["line"][:40] in page
        where = re.findall(r'<span class="where">(node0\d\.log):(\d+)</span>', page)
        assert len(where) == len(incident["evidence"])
        for (name, line), evidence in zip(where, incident["evidence"], strict=True):
            text = next(h for h in hosts if h.name == name).read_text().splitlines()[int(line) - 1]
            assert evidence["line"][:60] in text  # the line number is the evidence line's own
        async with client.get("/incident/0000") as resp:
            assert resp.status == 404 and "diagnose its logs again" in await resp.text()

    serve(diagnoser, test)


def test_other_failures_are_listed_and_each_has_its_picture(diagnoser: Diagnoser, tmp_path: Path) -> None:
    files = simulated_hosts(tmp_path, "nccl_error", seed=1, several=True)
    expected = diagnose_json(*(f.name for f in files), cwd=tmp_path)
    report = json.loads(expected)
    everything = report["incidents"] + report["recovered"]
    assert [(i["class"], i["recovered"]) for i in everything] == [
        ("nccl_error", False), ("cuda_oom", False), ("python_exception", True)]

    async def test(client: TestClient[Any, Any]) -> None:
        status, body, _ = await post(client, form(*((f.name, f.read_bytes()) for f in files)))
        assert (status, body) == (200, expected)
        for incident in everything:
            async with client.get(f"/incident/{incident['incident_id']}") as resp:
                page = await resp.text()
            listed = re.findall(r'<li data-incident="([0-9a-f]+)"><div class="who">([a-z ]+) · ([a-z_]+) ·', page)
            others = [i for i in everything if i is not incident]
            labels = {everything[0]["incident_id"]: "primary", everything[1]["incident_id"]: "also failed",
                      everything[2]["incident_id"]: "survived"}
            assert listed == [(o["incident_id"], labels[o["incident_id"]], o["class"]) for o in others]
            assert all(f'<a href="/incident/{o["incident_id"]}">' in page for o in others)

    serve(diagnoser, test)


# --- bad requests: a 4xx and a message, never a 500 ------------------------------------------------------


def multipart(body: bytes, boundary: str = "XyZ") -> dict[str, Any]:
    return {"data": body, "headers": {"Content-Type": f"multipart/form-data; boundary={boundary}"}}


def part(name: str, content: bytes, filename: str | None = None) -> bytes:
    disposition = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename is not None else "")
    return f"--XyZ\r\nContent-Disposition: {disposition}\r\n\r\n".encode() + content + b"\r\n"


LOG = b"[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n"
JUNK = [
    ("no body", {}, 400, "no body"),
    ("text/plain body", {"data": LOG, "headers": {"Content-Type": "text/plain"}}, 415, "multipart/form-data"),
    ("url-encoded form", {"data": {"file": "x"}}, 415, "multipart/form-data"),
    ("multipart without boundary", {"data": LOG, "headers": {"Content-Type": "multipart/form-data"}}, 400, "boundary"),
    ("not multipart at all", multipart(b"hello, this is not multipart\r\n"), 400, "not a complete"),
    ("truncated body", multipart(part("file", LOG, "a.log")[:-10]), 400, "not a complete"),
    ("no closing boundary", multipart(part("file", LOG, "a.log")), 400, "not a complete"),
    ("no parts", multipart(b"--XyZ--\r\n"), 400, "no file and no text"),
    ("file without a name", multipart(part("file", LOG) + b"--XyZ--\r\n"), 400, "without a file name"),
    ("unknown field", multipart(part("upload", LOG, "a.log") + b"--XyZ--\r\n"), 400, "unknown form field"),
    ("parent folder", multipart(part("file", LOG, "../../etc/a.log") + b"--XyZ--\r\n"), 400, "'..'"),
    ("same file twice", multipart(part("file", LOG, "a.log") * 2 + b"--XyZ--\r\n"), 400, "sent twice"),
    ("file and folder", multipart(part("file", LOG, "a") + part("file", LOG, "a/b.log") + b"--XyZ--\r\n"), 400,
     "same path"),
    ("empty file", multipart(part("file", b"", "a.log") + b"--XyZ--\r\n"), 400, "no lines"),
    ("empty text", multipart(part("text", b"") + b"--XyZ--\r\n"), 400, "no file and no text"),
    ("job of many lines", multipart(part("job", b"a\nb") + part("file", LOG, "a.log") + b"--XyZ--\r\n"), 400,
     "one line"),
    ("NUL bytes", multipart(part("file", LOG + b"\0\0\0core dump", "core.log") + b"--XyZ--\r\n"), 400,
     "core.log: binary data (a NUL byte"),
    ("random bytes", multipart(part("file", bytes(range(256)) * 40, "x.bin") + b"--XyZ--\r\n"), 400,
     "x.bin: binary data ("),
    ("gzip not named .gz", multipart(part("file", gzip.compress(LOG), "r.log") + b"--XyZ--\r\n"), 400, "r.log.gz"),
    (".gz that is not gzip", multipart(part("file", LOG, "r.log.gz") + b"--XyZ--\r\n"), 400, "not gzip data"),
    (".gz of binary", multipart(part("file", gzip.compress(b"\0" * 5000), "r.log.gz") + b"--XyZ--\r\n"), 400,
     "r.log.gz: what the .gz holds is binary"),
]


@pytest.mark.parametrize(("what", "request_kwargs", "status", "says"), JUNK, ids=[j[0] for j in JUNK])
def test_bad_requests_are_refused_with_a_message(diagnoser: Diagnoser, tmp_path: Path, what: str,
                                                 request_kwargs: dict[str, Any], status: int, says: str) -> None:
    async def test(client: TestClient[Any, Any]) -> None:
        got, body, _ = await post(client, **({"data": None} | request_kwargs))
        assert got == status, body
        assert says in error_of(got, body)

    serve(diagnoser, test, tmp_root=str(tmp_path))
    assert os.listdir(tmp_path) == []


def test_size_limit_is_413_declared_or_streamed(diagnoser: Diagnoser, tmp_path: Path) -> None:
    """Over the limit: refused from Content-Length before reading, or while the body streams (chunked, no
    length) without keeping more than the limit; the message names the limit and the option."""
    big = (b"step 1 loss 2.0 " * 4 + b"\n") * 20_000  # 1.3 MB of text

    async def chunked() -> AsyncIterator[bytes]:
        yield b'--XyZ\r\nContent-Disposition: form-data; name="file"; filename="big.log"\r\n\r\n'
        for start in range(0, len(big), 65536):
            yield big[start : start + 65536]
        yield b"\r\n--XyZ--\r\n"

    async def test(client: TestClient[Any, Any]) -> None:
        status, body, _ = await post(client, form(("big.log", big)))
        assert status == 413 and re.search(r"limit of 1 MiB.*--max-upload-mib", error_of(status, body))
        status, body, _ = await post(client, chunked(), headers={"Content-Type": "multipart/form-data; boundary=XyZ"})
        assert status == 413 and "--max-upload-mib" in error_of(status, body)
        status, body, _ = await post(client, form(("small.log", big[: 500_000])))
        assert status == 200, body

    serve(diagnoser, test, max_upload_bytes=1 << 20, tmp_root=str(tmp_path))
    assert os.listdir(tmp_path) == []


def test_a_declared_length_over_the_limit_is_refused_before_the_body(diagnoser: Diagnoser) -> None:
    """Content-Length over the limit: 413 at once, not after reading (or waiting for) the body; asked first
    (Expect: 100-continue), the client is told before it sends anything, and under the limit it may go on."""
    head = (b"POST /api/diagnose HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: multipart/form-data; boundary=XyZ\r\n"
            b"Content-Length: %d\r\n%s\r\n")

    async def first_line(port: int, request: bytes) -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(request)
            await writer.drain()
            return await asyncio.wait_for(reader.readline(), 5)
        finally:
            writer.close()

    async def test(client: TestClient[Any, Any]) -> None:
        port = client.port
        assert port is not None
        assert (await first_line(port, head % (1 << 30, b"") + b"--XyZ\r\n")).startswith(b"HTTP/1.1 413")
        assert (await first_line(port, head % (1 << 30, b"Expect: 100-continue\r\n"))).startswith(b"HTTP/1.1 413")
        assert (await first_line(port, head % (1000, b"Expect: 100-continue\r\n"))).startswith(b"HTTP/1.1 100")

    serve(diagnoser, test, max_upload_bytes=1 << 20, idle_s=30)


def test_uploads_live_in_one_temporary_folder_removed_after_the_answer(
    diagnoser: Diagnoser, hosts: list[Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[list[str]] = []
    real = serve_diagnosis.diagnose_upload

    def spy(d: Diagnoser, upload: Any) -> Any:
        seen.append(sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()))
        return real(d, upload)

    monkeypatch.setattr("correlator.serve.app.diagnose_upload", spy)

    async def test(client: TestClient[Any, Any]) -> None:
        status, _, _ = await post(client, form(("node00.log", hosts[0].read_bytes()), text="[rank0]: hello\n"))
        assert status == 200
        assert os.listdir(tmp_path) == []

    serve(diagnoser, test, tmp_root=str(tmp_path))
    [files] = seen
    assert [re.sub(r"^rootrank-serve-[^/]+/", "", f) for f in files] == ["files/node00.log", "pasted/pasted.log"]


def test_a_stalled_upload_is_dropped(diagnoser: Diagnoser, tmp_path: Path) -> None:
    async def stalls() -> AsyncIterator[bytes]:
        yield b'--XyZ\r\nContent-Disposition: form-data; name="file"; filename="a.log"\r\n\r\n' + LOG
        await asyncio.sleep(5)
        yield b"\r\n--XyZ--\r\n"

    async def test(client: TestClient[Any, Any]) -> None:
        status, body, _ = await post(client, stalls(), headers={"Content-Type": "multipart/form-data; boundary=XyZ"})
        assert status == 408 and "stalled" in error_of(status, body)

    serve(diagnoser, test, idle_s=0.5, tmp_root=str(tmp_path))
    assert os.listdir(tmp_path) == []


# --- the guards ---------------------------------------------------------------------------------------


def test_only_loopback_host_names_are_answered(diagnoser: Diagnoser) -> None:
    """A page elsewhere that rebinds its DNS name to 127.0.0.1 still sends its own name in Host."""

    async def test(client: TestClient[Any, Any]) -> None:
        for host, status in (("evil.example", 403), ("evil.example:8765", 403), ("localhost:8765", 200),
                             ("127.0.0.1", 200), ("[::1]:8765", 200)):
            async with client.get("/", headers={"Host": host}) as resp:
                assert resp.status == status, host
        async with client.post("/api/diagnose", headers={"Host": "rebound.example"}, data=form(text="x")) as resp:
            assert resp.status == 403 and "127.0.0.1" in (await resp.json())["error"]

    serve(diagnoser, test)

    async def anywhere(client: TestClient[Any, Any]) -> None:
        async with client.get("/", headers={"Host": "node07.cluster:8765", "Authorization": f"Bearer {TOKEN}"}) as resp:
            assert resp.status == 200

    serve(diagnoser, anywhere, loopback_only=False, token=TOKEN)


def test_with_a_token_every_request_needs_it(diagnoser: Diagnoser) -> None:
    async def test(client: TestClient[Any, Any]) -> None:
        for path in ("/", "/static/app.js", "/incident/x"):
            async with client.get(path) as resp:
                assert resp.status == 401, path
        status, body, _ = await post(client, form(text=LOG.decode()))
        assert status == 401 and "token" in error_of(status, body)
        status, body, _ = await post(client, form(text=LOG.decode()), headers={"Authorization": "Bearer wrong"})
        assert status == 401
        status, body, _ = await post(client, form(text=LOG.decode()), headers={"Authorization": f"Bearer {TOKEN}"})
        assert status == 200 and json.loads(body)["incidents"][0]["class"] == "cuda_oom"
        async with client.get(f"/?token={TOKEN}", allow_redirects=False) as resp:  # the printed address
            assert resp.status == 303 and resp.headers["Location"] == "/"
            assert "HttpOnly" in resp.headers["Set-Cookie"] and "SameSite=Strict" in resp.headers["Set-Cookie"]
        async with client.get("/") as resp:  # the cookie carries it now
            assert resp.status == 200
        status, _, _ = await post(client, form(text=LOG.decode()))
        assert status == 200

    serve(diagnoser, test, token=TOKEN)


def test_the_page_loads_nothing_from_elsewhere(diagnoser: Diagnoser) -> None:
    async def test(client: TestClient[Any, Any]) -> None:
        async with client.get("/") as resp:
            page = await resp.text()
            csp = resp.headers["Content-Security-Policy"]
        assert "default-src 'none'" in csp and "connect-src 'self'" in csp and "script-src 'self'" in csp
        assets = re.findall(r'(?:src|href)="([^"]+)"', page)
        assert sorted(assets) == ["/static/app.css", "/static/app.js", "data:,"]
        for asset in ("/static/app.css", "/static/app.js"):
            async with client.get(asset) as resp:
                text = await resp.text()
            assert resp.status == 200 and not re.search(r"https?://|//[a-z]|@import|url\(", text), asset

    serve(diagnoser, test)


def test_relative_paths_are_kept_inside_the_upload() -> None:
    assert str(safe_relative_path("run/attempt_0/3/stderr.log")) == "run/attempt_0/3/stderr.log"
    assert str(safe_relative_path("/abs/./rank-1.log")) == "abs/rank-1.log"
    assert str(safe_relative_path("C:\\logs\\rank-2.log")) == "logs/rank-2.log"
    for bad in ("../x.log", "a/../../x.log", "", "/", "a/\x00b.log", "x" * 300):
        with pytest.raises(UploadError):
            safe_relative_path(bad)


def test_kept_pictures_are_bounded() -> None:
    store = PageStore(count=3, size=10_000)
    for n in range(5):
        store.put(f"i{n}", "x" * 100)
    assert len(store) == 3 and store.get("i0") is None and store.get("i4") is not None
    store.put("big", "y" * 9_950)
    assert store.get("big") is not None and len(store) == 1


# --- the command ----------------------------------------------------------------------------------------


def test_listening_beyond_loopback_needs_a_token(capsys: pytest.CaptureFixture[str],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from correlator.cli import main

    monkeypatch.delenv("ROOTRANK_SERVE_TOKEN", raising=False)
    monkeypatch.setattr("correlator.cli.serve._run", lambda *args: 99)  # would listen: the checks let it through
    assert main(["serve", "--host", "0.0.0.0"]) == 2
    assert "--token" in capsys.readouterr().err
    assert main(["serve", "--host", "10.1.2.3", "--token", "short"]) == 2
    assert "at least 16 characters" in capsys.readouterr().err
    assert main(["serve", "--host", "0.0.0.0", "--token", TOKEN]) == 99
    assert main(["serve", "--host", "::1"]) == 99  # loopback needs none
    assert main(["serve", "--help"]) == 0
    out = capsys.readouterr().out
    assert "POST /api/diagnose" in out and "--max-upload-mib" in out and "--rules DIR" in out


def test_a_port_in_use_is_exit_1_with_a_message(capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    from correlator.cli import main

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", "--port", str(port)]) == 1
    err = capsys.readouterr().err
    assert f"cannot listen on 127.0.0.1:{port}" in err and "--port 0" in err
