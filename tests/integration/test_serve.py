"""`rootrank serve` for real: the command as a process on a free port of 127.0.0.1, driven by curl and by headless
Chromium (pasting, dropping files and a folder, choosing files), every answer compared with what `rootrank
diagnose --format json` prints for the same input; the picture checked by its lanes and its pixels; every
request the page makes checked to stay on 127.0.0.1; the server's temporary folder empty after each answer.

`ROOTRANK_WRITE_SCREENSHOT=1` also writes docs/img/serve.png (the page after a drop of two hosts' logs).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest

from tests.fixtures.chromium import Browser, Page, needs_chromium, png_pixels
from tests.fixtures.serve_logs import (
    PASTE_INITIATOR,
    TREE_INITIATOR_LOCAL_RANK,
    diagnose_json,
    paste_log,
    simulated_hosts,
    torchrun_tree,
)

pytestmark = pytest.mark.integration
needs_curl = pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed (scripts/install-system-deps.sh)")

REPO = Path(__file__).resolve().parents[2]
LIMIT_MIB = 4


@dataclass
class Server:
    url: str
    proc: subprocess.Popen[str]
    tmp: Path  # the server's TMPDIR: its upload folders are made (and must be removed) here

    def leftovers(self) -> list[str]:
        return sorted(os.listdir(self.tmp))


@contextmanager
def running_server(tmp: Path, *args: str) -> Iterator[Server]:
    """`rootrank serve --port 0 ARGS` with TMPDIR=tmp, until the block ends; then it must stop cleanly."""
    env = {**os.environ, "TMPDIR": str(tmp)}
    env.pop("ROOTRANK_SERVE_TOKEN", None)
    log = tmp.parent / f"{tmp.name}.stderr"  # a file, not a pipe nobody reads while the tests run
    with log.open("w") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "correlator.cli", "serve", "--port", "0", *args],
                                stdout=subprocess.PIPE, stderr=stderr, text=True, env=env)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # printed once it listens
        found = re.search(r"http://127\.0\.0\.1:\d+/", line)
        assert found, f"no address printed: {line!r} {log.read_text()}"
        yield Server(found.group(0), proc, tmp)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise
    err = log.read_text()
    assert proc.returncode == 0, err
    assert "rootrank serve: stopped" in err and "Traceback" not in err, err[-3000:]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The server of this module's tests, with a small upload limit."""
    with running_server(tmp_path_factory.mktemp("serve-tmpdir"), "--max-upload-mib", str(LIMIT_MIB)) as running:
        yield running


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Two hosts' logs of a simulated 16-rank job whose rank 7 (node00) runs out of GPU memory."""
    return simulated_hosts(tmp_path_factory.mktemp("hosts"))


def curl(*args: str, cwd: Path) -> tuple[int, bytes]:
    """HTTP status and body of a real curl."""
    run = subprocess.run(["curl", "-sS", "-o", "-", "-w", "\n%{http_code}", *args], cwd=cwd, capture_output=True,
                         timeout=120, check=False)
    assert run.returncode == 0, run.stderr
    body, _, status = run.stdout.rpartition(b"\n")
    return int(status), body


# --- curl --------------------------------------------------------------------------------------------------


@needs_curl
def test_curl_two_files_get_the_json_of_diagnose(server: Server, hosts: list[Path]) -> None:
    expected = diagnose_json(*(h.name for h in hosts), cwd=hosts[0].parent)
    status, body = curl("-F", f"file=@{hosts[0].name}", "-F", f"file=@{hosts[1].name}", f"{server.url}api/diagnose",
                        cwd=hosts[0].parent)
    assert status == 200
    assert body == expected  # the same bytes: incidents, ids, order
    assert json.loads(body)["incidents"][0]["initiator"]["rank"] == 7
    assert server.leftovers() == []


@needs_curl
def test_curl_a_folder_tree_with_relative_names(server: Server, tmp_path: Path) -> None:
    run = torchrun_tree(tmp_path)
    names = [str(p.relative_to(tmp_path)) for p in sorted(run.rglob("*.log"))]
    fields = [a for name in names for a in ("-F", f"file=@{name};filename={name}")]
    status, body = curl(*fields, f"{server.url}api/diagnose", cwd=tmp_path)
    assert (status, body) == (200, diagnose_json("run", cwd=tmp_path))
    assert json.loads(body)["incidents"][0]["initiator"]["local_rank"] == TREE_INITIATOR_LOCAL_RANK


@needs_curl
def test_curl_over_the_limit_is_413_with_a_message(server: Server, tmp_path: Path) -> None:
    big = tmp_path / "big.log"
    big.write_bytes(b"[rank0]: {'loss': 2.1, 'grad_norm': 0.9, 'learning_rate': 3e-05}\n" * 80_000)  # 5.3 MB
    # curl asks first (Expect: 100-continue) and is refused before sending; without asking, the body is refused
    # from its length and drained
    for extra in ((), ("-H", "Expect:")):
        status, body = curl(*extra, "-F", "file=@big.log", f"{server.url}api/diagnose", cwd=tmp_path)
        assert status == 413
        assert json.loads(body) == {"error": f"the upload is over the limit of {LIMIT_MIB} MiB: start rootrank serve "
                                             "with --max-upload-mib N to raise it, or run rootrank diagnose on the files"}
    assert server.leftovers() == []


@needs_curl
def test_curl_binary_file_is_400_naming_it(server: Server, tmp_path: Path) -> None:
    (tmp_path / "core.12345").write_bytes(b"\x7fELF\x02\x01\x01\0" + bytes(range(256)) * 64)
    status, body = curl("-F", "file=@core.12345", f"{server.url}api/diagnose", cwd=tmp_path)
    assert status == 400
    assert json.loads(body)["error"].startswith("core.12345: binary data")
    status, body = curl("-H", "Content-Type: text/plain", "--data-binary", "@core.12345", f"{server.url}api/diagnose",
                        cwd=tmp_path)
    assert status == 415 and "multipart/form-data" in json.loads(body)["error"]
    assert server.leftovers() == []


# --- in Chromium -------------------------------------------------------------------------------------------

ANSWER = """JSON.stringify({
  state: document.body.dataset.state,
  klass: document.getElementById('r-class') && document.getElementById('r-class').textContent,
  rank: document.getElementById('r-initiator') && document.getElementById('r-initiator').dataset.rank,
  host: document.getElementById('r-initiator') && document.getElementById('r-initiator').dataset.host,
  incident: document.getElementById('r-incident-id') && document.getElementById('r-incident-id').textContent,
  error: document.getElementById('error').hidden ? null : document.getElementById('error').textContent,
  files: Array.from(document.querySelectorAll('#files li')).map((li) => li.dataset.path),
  progress: Object.assign({shown: !document.getElementById('progress').hidden},
                          document.getElementById('progress').dataset),
})"""


def expected_answer(report: bytes) -> dict[str, Any]:
    first = json.loads(report)["incidents"][0]
    rank = first["initiator"]["rank"]
    return {"klass": first["class"], "rank": "" if rank is None else str(rank), "host": first["initiator"]["host"] or "",
            "incident": first["incident_id"]}


async def diagnose_in_page(page: Page) -> dict[str, Any]:
    """Press Diagnose; the page's answer once it shows one (and the picture, when there is an incident)."""
    await page.click("#diagnose")
    await page.wait_for("['done', 'error'].includes(document.body.dataset.state)")
    answer: dict[str, Any] = json.loads(await page.evaluate(ANSWER))
    if answer["state"] == "done":
        await page.wait_for(f"document.body.dataset.picture === {json.dumps(answer['incident'])}")
    return answer


def assert_stayed_on_loopback(page: Page, *, expected_problems: tuple[str, ...] = ()) -> None:
    """Every request went to 127.0.0.1, and the page logged no error but those expected."""
    assert page.requests, "no request recorded"
    hosts = {urlparse(u).hostname for u in page.requests if urlparse(u).scheme not in ("data", "blob", "about")}
    assert hosts == {"127.0.0.1"}, page.requests
    assert [p for p in page.problems if not any(e in p for e in expected_problems)] == []


def in_browser(browser: Browser, scenario: Any) -> Any:
    async def main() -> Any:
        async with browser.page() as page:
            return await scenario(page)

    return asyncio.run(main())


async def open_page(page: Page, server: Server, *, height: int = 900) -> None:
    await page.navigate(server.url, width=1400, height=height)
    await page.wait_for("document.body.dataset.state === 'ready'")


@needs_chromium
def test_pasted_log_names_the_class_initiator_and_id_diagnose_names(browser: Browser, server: Server,
                                                                     tmp_path: Path) -> None:
    text = paste_log()
    expected = expected_answer(diagnose_json("-", cwd=tmp_path, stdin=text.encode()))

    async def scenario(page: Page) -> dict[str, Any]:
        await open_page(page, server)
        await page.insert_text("#text", text)
        answer = await diagnose_in_page(page)
        assert_stayed_on_loopback(page)
        assert f"{server.url}api/diagnose" in page.requests
        return answer

    answer = in_browser(browser, scenario)
    assert {k: answer[k] for k in expected} == expected
    assert (answer["klass"], answer["rank"]) == ("cuda_oom", str(PASTE_INITIATOR))
    assert server.leftovers() == []


@needs_chromium
def test_two_dropped_files_are_one_job(browser: Browser, server: Server, hosts: list[Path]) -> None:
    expected = expected_answer(diagnose_json(*(h.name for h in hosts), cwd=hosts[0].parent))

    async def scenario(page: Page) -> dict[str, Any]:
        await open_page(page, server)
        await page.drop_files("#dropzone", hosts)
        await page.wait_for("document.querySelectorAll('#files li').length === 2")
        answer = await diagnose_in_page(page)
        assert_stayed_on_loopback(page)
        return answer

    answer = in_browser(browser, scenario)
    assert answer["files"] == ["node00.log", "node01.log"]
    assert {k: answer[k] for k in expected} == expected
    assert (answer["klass"], answer["rank"], answer["host"]) == ("cuda_oom", "7", "node00")


@needs_chromium
def test_a_dropped_torchrun_folder_keeps_its_tree(browser: Browser, server: Server, tmp_path: Path) -> None:
    run = torchrun_tree(tmp_path)
    expected = expected_answer(diagnose_json("run", cwd=tmp_path))

    async def scenario(page: Page) -> dict[str, Any]:
        await open_page(page, server)
        await page.drop_files("#dropzone", [run])
        await page.wait_for("document.querySelectorAll('#files li').length === 8")
        answer = await diagnose_in_page(page)
        assert_stayed_on_loopback(page)
        return answer

    answer = in_browser(browser, scenario)
    assert sorted(answer["files"]) == sorted(str(p.relative_to(tmp_path)) for p in run.rglob("*.log"))
    assert {k: answer[k] for k in expected} == expected
    assert answer["klass"] == "cuda_illegal_memory_access"


@needs_chromium
def test_chosen_gz_files_and_the_progress_of_a_larger_upload(browser: Browser, server: Server, tmp_path: Path) -> None:
    gz = simulated_hosts(tmp_path / "gz", "gpu_hardware_error", gz=True)
    large = simulated_hosts(tmp_path / "large", "nccl_error", seed=3)
    chatter = b"".join(b"[rank%d]: {'loss': 1.93, 'grad_norm': 0.71, 'learning_rate': 2.5e-05, 'epoch': 0.4}\n" % (r % 16)
                       for r in range(40_000))
    large[1].write_bytes(chatter + large[1].read_bytes())  # 3.4 MB: over the size that shows a progress bar
    expected_gz = expected_answer(diagnose_json(*(g.name for g in gz), cwd=gz[0].parent))
    expected_large = expected_answer(diagnose_json(*(f.name for f in large), cwd=large[0].parent))

    async def scenario(page: Page) -> tuple[dict[str, Any], dict[str, Any]]:
        await open_page(page, server)
        await page.set_input_files("#file-input", gz)
        await page.wait_for("document.querySelectorAll('#files li').length === 2")
        first = await diagnose_in_page(page)
        await page.click("#clear")
        await page.set_input_files("#file-input", large)
        await page.wait_for("document.querySelectorAll('#files li').length === 2")
        second = await diagnose_in_page(page)
        assert_stayed_on_loopback(page)
        return first, second

    first, second = in_browser(browser, scenario)
    assert {k: first[k] for k in expected_gz} == expected_gz and first["files"] == ["node00.log.gz", "node01.log.gz"]
    assert first["progress"]["shown"] is False  # a small upload shows no bar
    assert {k: second[k] for k in expected_large} == expected_large
    progress = second["progress"]
    assert progress["shown"] is True
    assert int(progress["loaded"]) == int(progress["total"]) >= sum(f.stat().st_size for f in large)


@needs_chromium
def test_other_unexplained_failures_and_survived_ones_are_shown(browser: Browser, server: Server,
                                                                tmp_path: Path) -> None:
    """A restarted job with a red herring: the primary incident, the other failure and the survived one are
    listed as diagnose lists them, and the other's picture opens from its list entry."""
    files = simulated_hosts(tmp_path, "nccl_error", seed=1, several=True)
    report = json.loads(diagnose_json(*(f.name for f in files), cwd=tmp_path))
    lists = """JSON.stringify({
      others: Array.from(document.querySelectorAll('#r-others li')).map((li) => li.dataset.incident),
      recovered: Array.from(document.querySelectorAll('#r-recovered li')).map((li) => li.dataset.incident)})"""

    async def scenario(page: Page) -> tuple[dict[str, Any], dict[str, list[str]], str]:
        await open_page(page, server)
        await page.drop_files("#dropzone", files)
        await page.wait_for("document.querySelectorAll('#files li').length === 2")
        answer = await diagnose_in_page(page)
        listed = json.loads(await page.evaluate(lists))
        other = listed["others"][0]
        await page.click(f'#r-others li[data-incident="{other}"] button')
        await page.wait_for(f"document.body.dataset.picture === {json.dumps(other)}")
        shown = await page.evaluate("document.getElementById('picture').contentDocument.title")
        assert_stayed_on_loopback(page)
        return answer, listed, shown

    answer, listed, shown = in_browser(browser, scenario)
    assert answer["incident"] == report["incidents"][0]["incident_id"]
    assert listed == {"others": [i["incident_id"] for i in report["incidents"][1:]],
                      "recovered": [i["incident_id"] for i in report["recovered"]]}
    assert listed["others"] and listed["recovered"]
    assert shown == f"rootrank: {report['incidents'][1]['title']}"


@needs_chromium
def test_the_page_refuses_over_the_limit_and_shows_server_errors(browser: Browser, server: Server,
                                                                 tmp_path: Path) -> None:
    big = tmp_path / "big.log"
    big.write_bytes(b"step 1\n" * (LIMIT_MIB * 160_000))
    binary = tmp_path / "dump.log"
    binary.write_bytes(b"\0" * 4096)

    async def scenario(page: Page) -> tuple[dict[str, Any], dict[str, Any], int]:
        await open_page(page, server)
        await page.set_input_files("#file-input", [big])
        over = await diagnose_in_page(page)
        sent = sum(1 for u in page.requests if u.endswith("/api/diagnose"))
        await page.click("#clear")
        await page.set_input_files("#file-input", [binary])
        bad = await diagnose_in_page(page)
        assert_stayed_on_loopback(page, expected_problems=("status of 400 (Bad Request)",))
        return over, bad, sent

    over, bad, sent = in_browser(browser, scenario)
    assert over["state"] == "error" and f"limit of {LIMIT_MIB}.0 MiB" in over["error"] and "--max-upload-mib" in over["error"]
    assert sent == 0  # refused by the page itself, nothing uploaded
    assert bad["state"] == "error" and bad["error"].startswith("dump.log: binary data") and "(400)" in bad["error"]


# The picture inside the page: its lanes, and where the initiator's mark is painted (page coordinates).
PICTURE = """JSON.stringify((() => {
  const frame = document.getElementById('picture');
  const doc = frame.contentDocument;
  const svg = doc.getElementById('swimlanes');
  const ranks = Array.from(doc.querySelectorAll('g.lane')).map((g) => g.dataset.rank).filter((r) => /^\\d+$/.test(r));
  const f = frame.getBoundingClientRect();
  const m = doc.querySelector('[data-role="initiator"] circle').getBoundingClientRect();
  const s = svg.getBoundingClientRect();
  const x0 = window.scrollX + f.left + frame.clientLeft, y0 = window.scrollY + f.top + frame.clientTop;
  return {ranks, initiatorLane: doc.getElementById('initiator-lane').dataset.rank,
          svg: [s.width, s.height], mark: [x0 + m.left - 4, y0 + m.top - 4, m.width + 8, m.height + 8],
          bottom: window.scrollY + f.top + f.height, where: Array.from(doc.querySelectorAll('.where')).map((w) => w.textContent)};
})())"""


@needs_chromium
def test_the_picture_renders_a_lane_per_rank_and_paints_the_initiator(browser: Browser, hosts: list[Path],
                                                                      tmp_path: Path) -> None:
    """The screenshot test: one lane per rank of the 16, the SVG laid out, the initiator's mark painted red
    on screen, the page's PNG not blank. With ROOTRANK_WRITE_SCREENSHOT=1 it becomes docs/img/serve.png.
    A server of its own, with the default limit, as the page shows it."""
    write_png = os.environ.get("ROOTRANK_WRITE_SCREENSHOT", "") not in ("", "0")

    async def scenario(page: Page, server: Server) -> tuple[dict[str, Any], bytes, bytes]:
        await open_page(page, server, height=1300)
        await page.drop_files("#dropzone", hosts)
        await page.wait_for("document.querySelectorAll('#files li').length === 2")
        await diagnose_in_page(page)
        await page.evaluate("window.scrollTo(0, 0)")
        picture = json.loads(await page.evaluate(PICTURE))
        x, y, w, h = picture["mark"]
        mark = await page.call("Page.captureScreenshot", format="png", captureBeyondViewport=True,
                               clip={"x": x, "y": y, "width": w, "height": h, "scale": 1})
        whole = await page.screenshot(1400, 1300)
        assert_stayed_on_loopback(page)
        return picture, base64.b64decode(mark["data"]), whole

    with running_server(tmp_path) as server:
        picture, mark_png, page_png = in_browser(browser, lambda page: scenario(page, server))
        assert server.leftovers() == []
    assert sorted(map(int, set(picture["ranks"]))) == list(range(16))  # one lane per rank
    assert picture["initiatorLane"] == "7"
    assert picture["svg"][0] > 600 and picture["svg"][1] > 16 * 10
    assert picture["where"] and all(re.fullmatch(r"node0[01]\.log:\d+", w) for w in picture["where"])
    width, height, rows = png_pixels(mark_png)
    bpp = len(rows[0]) // width
    red = sum(1 for row in rows for i in range(0, len(row), bpp) if row[i] > 170 and row[i + 1] < 90 and row[i + 2] < 90)
    assert red >= 20, f"the initiator's mark is not painted ({red} red pixels of {width}x{height})"
    assert page_png[:8] == b"\x89PNG\r\n\x1a\n" and len(page_png) > 40_000  # a page of text and lanes, not blank
    if write_png:
        out = REPO / "docs" / "img" / "serve.png"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(page_png)


def test_every_upload_folder_is_gone(server: Server) -> None:
    """Last in the module: every upload folder the answers above made is gone."""
    time.sleep(0.2)
    assert server.leftovers() == []
