"""The operator's CLI without servers: help that helps, where each setting comes from (flag, environment,
config file, a running `rootrank up`, default), ship's files and command, the context file."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import click
import pytest

from correlator.cli import rootrank
from correlator.cli.settings import load_with_sources
from correlator.tooling.context import StackContext, read_context, remove_context, write_context
from tests.fixtures.cli import parse_command_line


def _commands(command: click.Command, path: list[str]) -> Iterator[tuple[list[str], click.Command]]:
    if isinstance(command, click.Group):
        for name, sub in command.commands.items():
            yield from _commands(sub, [*path, name])
    yield path, command


def test_every_option_has_a_sentence_and_its_default_once() -> None:
    for path, command in _commands(rootrank, ["rootrank"]):
        assert command.help, f"{' '.join(path)} has no help"
        for param in command.params:
            if not isinstance(param, click.Option) or param.hidden:
                continue
            text = (param.help or "").rstrip()
            where = f"{' '.join(path)} {param.opts[0]}"
            assert text, f"{where} has no help"
            assert text.endswith((".", ")")), f"{where}: help is not a sentence: {text!r}"
            unset = getattr(click.core, "UNSET", None)  # click 8.3's "no default" sentinel
            shows_default = param.default not in (None, False, (), unset) and not param.is_flag
            if shows_default:  # click prints [default: ...]: the text must not say it again
                assert "default" not in text.lower(), f"{where} states its default twice: {text!r}"


@pytest.mark.parametrize("name", ["worker", "up", "ship"])
def test_settings_moved_from_help_to_config_show(name: str) -> None:
    command = rootrank.commands[name]
    with click.Context(command, info_name=name) as ctx:
        text = command.get_help(ctx)
    assert "rootrank config show" in text
    assert "ROOTRANK_KAFKA__SASL_PASSWORD" not in text
    assert len(text.splitlines()) < 110  # the settings table alone was 60 lines


@pytest.fixture
def clean_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in list(os.environ):
        if name.startswith("ROOTRANK_"):
            monkeypatch.delenv(name)
    context = tmp_path / "context.json"
    monkeypatch.setenv("ROOTRANK_CONTEXT", str(context))
    return context


def _running(context: Path) -> StackContext:
    stack = StackContext(broker="127.0.0.1:19092", es_url="http://127.0.0.1:19200", api_url="http://127.0.0.1:16066",
                         token="tok", pid=os.getpid())
    write_context(stack, context)
    return stack


def test_a_running_up_is_found_after_flags_environment_and_the_config_file(
    clean_env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    loaded = load_with_sources(None)
    assert loaded.settings.kafka.bootstrap_servers == "127.0.0.1:9092"
    assert loaded.sources.get("kafka.bootstrap_servers") is None  # default

    _running(clean_env)
    assert oct(clean_env.stat().st_mode & 0o777) == "0o600"  # it holds the token
    loaded = load_with_sources(None)
    assert loaded.settings.kafka.bootstrap_servers == "127.0.0.1:19092"
    assert loaded.settings.elasticsearch.url == "http://127.0.0.1:19200"
    assert loaded.sources["elasticsearch.url"] == "rootrank up"

    config = tmp_path / "rootrank.yaml"
    config.write_text("elasticsearch: {url: http://es.example:9200}\n")
    loaded = load_with_sources(str(config))
    assert loaded.settings.elasticsearch.url == "http://es.example:9200"
    assert loaded.sources["elasticsearch.url"] == f"file {config}"
    assert loaded.settings.kafka.bootstrap_servers == "127.0.0.1:19092"  # the file does not say

    monkeypatch.setenv("ROOTRANK_ELASTICSEARCH__URL", "http://env:9200")
    loaded = load_with_sources(str(config))
    assert loaded.settings.elasticsearch.url == "http://env:9200"
    assert loaded.sources["elasticsearch.url"] == "env ROOTRANK_ELASTICSEARCH__URL"

    loaded = load_with_sources(str(config), es_url="http://flag:9200")
    assert loaded.settings.elasticsearch.url == "http://flag:9200" and loaded.sources["elasticsearch.url"] == "flag"


def test_a_dead_stack_context_is_ignored_and_only_its_writer_removes_it(clean_env: Path) -> None:
    stack = _running(clean_env)
    remove_context(stack.pid + 1, clean_env)
    assert read_context(clean_env) == stack
    raw = json.loads(clean_env.read_text())
    raw["pid"] = 2**22 + 12345  # beyond pid_max: no such process
    clean_env.write_text(json.dumps(raw))
    assert read_context(clean_env) is None
    remove_context(stack.pid, clean_env)
    assert clean_env.exists()  # not ours any more
    _running(clean_env)
    remove_context(os.getpid(), clean_env)
    assert not clean_env.exists()


def test_print_env_exports_the_stack(clean_env: Path, capfd: pytest.CaptureFixture[str]) -> None:
    from correlator.cli import main

    assert main(["up", "--print-env"]) == 1
    assert "no rootrank up is running" in capfd.readouterr().err
    _running(clean_env)
    assert main(["up", "--print-env"]) == 0
    out = capfd.readouterr().out
    assert "export ROOTRANK_KAFKA__BOOTSTRAP_SERVERS=127.0.0.1:19092\n" in out
    assert "export ROOTRANK_API_URL=http://127.0.0.1:16066\n" in out and "export ROOTRANK_API_TOKEN=tok\n" in out


def test_config_show_names_each_source(clean_env: Path, capfd: pytest.CaptureFixture[str],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from correlator.cli import main

    _running(clean_env)
    monkeypatch.setenv("ROOTRANK_ENGINE__QUIET_WINDOW_S", "5")
    monkeypatch.setenv("ROOTRANK_KAFKA__SASL_PASSWORD", "hunter2")
    assert main(["config", "show", "--format", "json"]) == 0
    shown = json.loads(capfd.readouterr().out)
    assert shown["engine.quiet_window_s"] == {"value": 5.0, "source": "env ROOTRANK_ENGINE__QUIET_WINDOW_S",
                                              "env": "ROOTRANK_ENGINE__QUIET_WINDOW_S"}
    assert shown["kafka.bootstrap_servers"]["source"] == "rootrank up"
    assert shown["topics.partitions"]["source"] == "default"
    assert shown["kafka.sasl_password"]["value"] == "********"
    assert shown["webhooks.api_token"]["value"] == "********"
    assert main(["config", "show"]) == 0
    assert "hunter2" not in capfd.readouterr().out


def test_the_local_token_never_goes_to_another_worker(clean_env: Path) -> None:
    from correlator.cli.webhooks import _worker_client

    _running(clean_env)
    local = _worker_client(None, None, None)
    assert (local.base_url, local.token) == ("http://127.0.0.1:16066", "tok")
    other = _worker_client("https://worker.example", None, None)
    assert (other.base_url, other.token) == ("https://worker.example", None)


@pytest.mark.parametrize(("argv", "files", "command"), [
    (["--job", "J", "--file", "a.log", "b.log"], ["a.log", "b.log"], []),
    (["--job", "J", "/var/log/kern.log"], ["/var/log/kern.log"], []),
    (["--job", "J", "--", "torchrun", "--nproc-per-node", "8", "train.py"], [],
     ["torchrun", "--nproc-per-node", "8", "train.py"]),
    (["--job", "J", "--file", "a.log", "--follow"], ["a.log"], []),
    (["--job", "J", "--rank", "3", "--", "python", "--", "x"], [], ["python", "--", "x"]),
])
def test_ship_files_before_the_double_dash_and_the_command_after(
    argv: list[str], files: list[str], command: list[str],
) -> None:
    ctx = parse_command_line(["ship", *argv])
    assert [*ctx.params["files"], *ctx.params["paths"]] == files
    assert ctx.meta["ship_command"] == command


def test_ship_globs_expand_in_order_and_one_that_matches_nothing_is_an_error(tmp_path: Path) -> None:
    from correlator.cli.ship import expand_inputs

    for host in ("node01", "node00"):
        (tmp_path / host).mkdir()
        (tmp_path / host / "train.log").write_text("x\n")
    (tmp_path / "kern.log").write_text("k\n")
    found = expand_inputs([f"{tmp_path}/*/*.log", str(tmp_path / "kern.log"), f"{tmp_path}/node00/*.log"])
    assert found == [f"{tmp_path}/node00/train.log", f"{tmp_path}/node01/train.log", str(tmp_path / "kern.log")]
    with pytest.raises(click.BadParameter, match="no file matches"):
        expand_inputs([f"{tmp_path}/*.txt"])
