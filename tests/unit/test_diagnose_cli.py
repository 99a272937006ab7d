"""`rootrank diagnose` on bad input: a clear one-line message or a counted skip, never a traceback."""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

OOM = "[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a total capacity of 79.1 GiB"


def rootrank(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "correlator.cli", *args], input=stdin.decode("latin-1") if stdin else None,
        capture_output=True, text=True, timeout=120, check=False,  # the tests read the exit code
    )


def test_missing_path_is_one_line_error() -> None:
    proc = rootrank("diagnose", "/no/such/file.log")
    assert proc.returncode == 2
    assert proc.stderr.strip() == "rootrank diagnose: /no/such/file.log: no such file or directory"
    assert "Traceback" not in proc.stderr


def test_binary_file_is_a_counted_skip_and_text_files_still_count(tmp_path: Path) -> None:
    (tmp_path / "core.bin").write_bytes(bytes(range(256)) * 64)
    (tmp_path / "rank3.log").write_text(f"step 1 loss 2.0\n{OOM}\n")
    proc = rootrank("diagnose", "--format", "json", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "skipped: " in proc.stderr and "core.bin: binary data, skipped" in proc.stderr
    assert "Traceback" not in proc.stderr
    incidents = json.loads(proc.stdout)["incidents"]
    assert incidents[0]["class"] == "cuda_oom" and incidents[0]["initiator"]["rank"] == 3


def test_only_binary_input_exits_2_with_the_reason(tmp_path: Path) -> None:
    (tmp_path / "x.bin").write_bytes(b"\0\1\2\3" * 1000)
    proc = rootrank("diagnose", str(tmp_path / "x.bin"))
    assert proc.returncode == 2
    assert "binary data, skipped" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files regardless of their mode")
def test_unreadable_file_is_skipped_with_the_reason(tmp_path: Path) -> None:
    f = tmp_path / "secret.log"
    f.write_text(OOM)
    f.chmod(0)
    proc = rootrank("diagnose", str(f))
    assert "not readable" in proc.stderr and "Traceback" not in proc.stderr


def test_non_utf8_and_gzip_and_stdin_are_read(tmp_path: Path) -> None:
    raw = b"caf\xe9 \xff\xfe garbage line\n" + OOM.encode() + b"\n"
    (tmp_path / "a.log.gz").write_bytes(gzip.compress(raw))
    proc = rootrank("diagnose", "--format", "json", str(tmp_path / "a.log.gz"))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["incidents"][0]["class"] == "cuda_oom"
    proc = rootrank("diagnose", "--format", "json", "-", stdin=raw)
    assert json.loads(proc.stdout)["incidents"][0]["initiator"]["rank"] == 3


def test_clean_log_gives_the_empty_contract(tmp_path: Path) -> None:
    (tmp_path / "ok.log").write_text("[rank0]: step 10 loss 2.1\n[rank1]: step 10 loss 2.2\n")
    proc = rootrank("diagnose", "--format", "json", str(tmp_path / "ok.log"))
    assert proc.returncode == 0 and json.loads(proc.stdout) == {"incidents": [], "recovered": []}


def test_broken_rule_folder_is_reported_as_file_line(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text("id: bad\ntitle: [unclosed\n")
    proc = rootrank("diagnose", "--rules", str(tmp_path), "/dev/null")
    assert proc.returncode == 2  # not a finding: the run could not happen
    assert re.match(rf"{re.escape(str(tmp_path / 'bad.yaml'))}:[23]: YAML syntax: ", proc.stderr), proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert "Traceback" not in proc.stderr


def test_gzip_that_is_not_gzip_is_a_counted_skip(tmp_path: Path) -> None:
    (tmp_path / "fake.log.gz").write_text("not gzip at all\n")
    proc = rootrank("diagnose", str(tmp_path / "fake.log.gz"))
    assert "fake.log.gz" in proc.stderr and "Traceback" not in proc.stderr


# --- the exit-code table (README, docs/operations.md, `rootrank diagnose --help`) -----------------------

RECOVERED = f"[rank3]: step 10 loss 2.0\n{OOM}\n[rank3]: step 11 loss 2.0\n[rank3]: step 12 loss 1.9\n"


def _run_in_process(args: list[str], capfd: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    from correlator.cli import main

    code = main(args)
    out, err = capfd.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("exit-codes")
    files = {"oom": f"{OOM}\n", "clean": "[rank0]: step 10 loss 2.1\n", "recovered": RECOVERED, "empty": ""}
    for name, text in files.items():
        (folder / f"{name}.log").write_text(text)
    (folder / "binary.bin").write_bytes(b"\0\1\2\3" * 1000)
    return {name: folder / f"{name}.log" for name in files} | {"binary": folder / "binary.bin"}


EXIT_TABLE = [
    # (input, extra flags, exit code)
    ("oom", [], 0),                                  # it ran, an incident was found
    ("clean", [], 0),                                # it ran, nothing found
    ("oom", ["--fail-on", "high"], 1),               # a critical incident >= high
    ("oom", ["--fail-on", "critical"], 1),
    ("clean", ["--fail-on", "info"], 0),
    ("recovered", ["--fail-on", "info"], 0),         # a failure the job survived never fails the run
    ("empty", ["--fail-on", "info"], 0),             # no lines: it says so, nothing to fail on
    ("binary", [], 2),                               # no input it could read
    ("missing", [], 2),
    ("oom", ["--fail-on", "severe"], 2),             # a usage error
]


@pytest.mark.parametrize("output_format", ["text", "json", "html"])
@pytest.mark.parametrize(("name", "flags", "expected"), EXIT_TABLE,
                         ids=[f"{n}-{'-'.join(f) or 'plain'}" for n, f, _ in EXIT_TABLE])
def test_exit_codes_are_the_same_for_every_format(
    output_format: str, name: str, flags: list[str], expected: int, logs: dict[str, Path],
    capfd: pytest.CaptureFixture[str], tmp_path: Path,
) -> None:
    path = str(logs.get(name, tmp_path / "no-such.log"))
    code, _out, err = _run_in_process(["diagnose", "-j", "1", "--format", output_format, *flags, path], capfd)
    assert code == expected, err
    assert "Traceback" not in err
    if name == "empty":
        assert "the input has no lines" in err


def test_output_goes_to_stdout_unless_o_is_given_for_every_format(
    logs: dict[str, Path], capfd: pytest.CaptureFixture[str], tmp_path: Path,
) -> None:
    for output_format, marker in (("text", "cuda_oom"), ("json", '"incidents"'), ("html", "<!DOCTYPE html>")):
        code, out, err = _run_in_process(["diagnose", "-j", "1", "--format", output_format, str(logs["oom"])], capfd)
        assert code == 0 and marker in out, (output_format, err)
        target = tmp_path / f"report.{output_format}"
        code, out, err = _run_in_process(
            ["diagnose", "-j", "1", "--format", output_format, "-o", str(target), str(logs["oom"])], capfd)
        assert code == 0 and out == "" and f"wrote {target}" in err
        assert marker in target.read_text(encoding="utf-8")


def test_version_prints_the_package_and_rule_set_versions(capfd: pytest.CaptureFixture[str]) -> None:
    for flag in ("--version", "-V"):
        code, out, _ = _run_in_process([flag], capfd)
        assert code == 0
        assert re.match(r"rootrank \S+, rule set [0-9a-f]{12} \(\d+ rules\)$", out.strip()), out


@pytest.mark.parametrize(("line", "finds"), [(OOM, "cuda_oom"), ("[rank3]: step 12 loss 2.31", "No incident")])
def test_a_small_diagnosis_imports_only_what_diagnose_needs(tmp_path: Path, line: str, finds: str) -> None:
    """Start-up is most of a small diagnosis: with the rule set cached, no YAML parser, no process pool, no
    progress bar, no other command and nothing of the streaming stack is imported; for a clean log not
    even the report's renderer."""
    log = tmp_path / "rank3.log"
    log.write_text(line + "\n")
    program = ("import sys\nfrom correlator.cli import main\ncode = main(['diagnose', sys.argv[1]])\n"
               "print('MODULES', ' '.join(sorted(sys.modules)), file=sys.stderr)\nsys.exit(code)\n")
    env = {**os.environ, "ROOTRANK_CACHE_DIR": str(tmp_path / "cache")}
    for _ in range(2):  # the first run fills the rule set cache (it parses the YAML)
        run = subprocess.run([sys.executable, "-c", program, str(log)], capture_output=True, text=True, timeout=120,
                             env=env, check=False)
    assert run.returncode == 0 and finds in run.stdout, run.stderr
    modules = set(run.stderr.rsplit("MODULES ", 1)[1].split())
    unwanted = {"yaml", "multiprocessing", "rich.progress", "faust", "aiokafka", "kafka", "elasticsearch",
                "correlator.cli.ship", "correlator.cli.stream", "correlator.cli.webhooks", "correlator.cli.search",
                "correlator.cli.simulate", "correlator.cli.config",
                "gzip", "ingest.decoders", "orjson",  # a plain .log in the text format needs none of them
                "aiohttp", "jinja2", "correlator.cli.serve", "correlator.serve"}  # nor the web page's server
    if finds == "No incident":
        unwanted |= {"rich", "correlator.render.text"}
    assert not modules & unwanted, sorted(modules & unwanted)


def test_the_program_ends_at_once_after_a_diagnosis_with_its_output_and_exit_code_whole(tmp_path: Path) -> None:
    """Run as the program, `diagnose` skips the interpreter's teardown (atexit hooks do not run), yet the
    report, the -o file and the exit code are all there; called as a function, it returns as usual."""
    log = tmp_path / "rank3.log"
    log.write_text(OOM + "\n")
    program = ("import atexit, sys\nfrom correlator.cli import main\n"
               "atexit.register(lambda: print('TEARDOWN', file=sys.stderr))\n"
               "how, sys.argv = sys.argv[1], ['rootrank', *sys.argv[2:]]\n"
               "sys.exit(main(None if how == 'program' else sys.argv[1:]))\n")
    report = tmp_path / "report.json"
    for how, expect_teardown in (("program", False), ("function", True)):
        run = subprocess.run([sys.executable, "-c", program, how, "diagnose", "--fail-on", "high", str(log)],
                             capture_output=True, text=True, timeout=120, check=False)
        assert run.returncode == 1, run.stderr
        assert "cuda_oom" in run.stdout and run.stdout.rstrip().endswith("╯"), run.stdout[-200:]
        assert ("TEARDOWN" in run.stderr) is expect_teardown, (how, run.stderr)
        run = subprocess.run([sys.executable, "-c", program, how, "diagnose", "--format", "json", "-o", str(report),
                              str(log)], capture_output=True, text=True, timeout=120, check=False)
        assert run.returncode == 0 and f"wrote {report}" in run.stderr, run.stderr
        assert json.loads(report.read_text())["incidents"][0]["class"] == "cuda_oom"
        report.unlink()
