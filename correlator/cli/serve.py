"""`rootrank serve`: a local web page to paste or drop logs on; the `diagnose` engine answers, on this machine."""

from __future__ import annotations

import sys

import click

from correlator.cli.rules import load_ruleset_or_report

MIN_TOKEN_CHARS = 16

EPILOG = """\b
The page (GET /): paste a log or drop files and folders (.gz, torchrun --log-dir trees: one job), then
Diagnose. The API: POST /api/diagnose with multipart fields file=@LOG (repeatable; the file name may be a
relative path, e.g. run/attempt_0/3/stderr.log), text=PASTED-LOG, job=NAME; it answers what
rootrank diagnose --format json prints for the same files. GET /incident/ID: the picture of a recent one.
Uploads are written to one temporary folder per request, removed before the answer; nothing is fetched
from the network. Exit codes: 0 stopped (Ctrl-C, SIGTERM); 1 it could not listen (the port in use); 2 a
usage error or a broken rule set."""


@click.command("serve", epilog=EPILOG,
               short_help="A local web page: paste or drop logs, see which rank broke the job (nothing leaves the machine).")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on. Anything but loopback (127.0.0.1, ::1, localhost) needs --token.")
@click.option("--port", default=8765, show_default=True, type=click.IntRange(0, 65535),
              help="Port to listen on; 0: any free port (the address is printed).")
@click.option("--rules", "rules_dir", metavar="DIR", help="Rules folder; when not given: the installed library.")
@click.option("--token", envvar="ROOTRANK_SERVE_TOKEN", metavar="TOKEN",
              help=f"Every request must carry it (Authorization: Bearer TOKEN, or open the printed /?token= address "
              f"once); at least {MIN_TOKEN_CHARS} characters. Better from the environment, ROOTRANK_SERVE_TOKEN "
              "(a flag is visible to other users in ps).")
@click.option("--max-upload-mib", default=512, show_default=True, type=click.IntRange(1, 1 << 20), metavar="MIB",
              help="Largest upload, files and pasted text together; a larger one is refused (413) with a message.")
def serve(host: str, port: int, rules_dir: str | None, token: str | None, max_upload_mib: int) -> int:
    """A local web page that diagnoses pasted or dropped logs on this machine.

    The same engine, JSON and incident ids as rootrank diagnose; the logs stay on this machine.
    """
    from correlator.serve.app import is_loopback

    loopback = is_loopback(host)
    if token is not None and len(token) < MIN_TOKEN_CHARS:
        print(f"rootrank serve: --token must be at least {MIN_TOKEN_CHARS} characters "
              "(e.g. --token \"$(openssl rand -hex 16)\")", file=sys.stderr)
        return 2
    if not loopback and token is None:
        print(f"rootrank serve: --host {host or '(all addresses)'} is reachable from other machines: give --token TOKEN "
              "(or ROOTRANK_SERVE_TOKEN) so that only who has it can send logs and read the answers; or keep the "
              "default --host 127.0.0.1", file=sys.stderr)
        return 2
    ruleset = load_ruleset_or_report(rules_dir)
    if ruleset is None:
        return 2
    return _run(host, port, ruleset, token, max_upload_mib, loopback)


def _run(host: str, port: int, ruleset: object, token: str | None, max_upload_mib: int, loopback: bool) -> int:
    import asyncio
    import socket
    import tempfile

    from correlator.diagnosis.rules import RuleSet
    from correlator.offline.diagnose import Diagnoser
    from correlator.serve.app import Settings, create_app
    from correlator.serve.server import serve_until_stopped
    from ingest.prefixes import identity_from_path

    assert isinstance(ruleset, RuleSet)
    diagnoser = Diagnoser(ruleset, jobs=1)  # the server runs threads: one scan process, never forked
    diagnoser.matcher.combined_database()  # built (or read from the cache) now, not during the first answer
    temp = tempfile.gettempdir()
    if identity_from_path(temp + "/x"):
        print(f"rootrank serve: warning: the temporary folder {temp} has a name diagnose reads as identity "
              f"({identity_from_path(temp + '/x')}); set TMPDIR to a plain folder", file=sys.stderr)
    if not loopback:
        print(f"rootrank serve: warning: listening on {host or 'every address'}, reachable from other machines; "
              "requests need the token, and plain HTTP is not encrypted: use it on a network you trust, or keep "
              "127.0.0.1 and reach it through ssh -L", file=sys.stderr)
    app = create_app(diagnoser, Settings(max_upload_bytes=max_upload_mib << 20, token=token, loopback_only=loopback))

    def ready(bound: int) -> None:
        shown = host if host not in ("", "0.0.0.0", "::") else socket.gethostname()
        shown = f"[{shown}]" if ":" in shown else shown
        query = f"?token={token}" if token else ""
        print(f"rootrank serve: http://{shown}:{bound}/{query} (Ctrl-C to stop)", flush=True)

    try:
        asyncio.run(serve_until_stopped(app, host, port, ready))
    except OSError as exc:
        print(f"rootrank serve: cannot listen on {host}:{port}: {exc.strerror or exc} (--port N, or --port 0 for any "
              "free port)", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        pass
    print("rootrank serve: stopped", file=sys.stderr)
    return 0
