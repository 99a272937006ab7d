"""`make demo`: the whole product on this machine, in under two minutes.

A 64-rank job on 8 hosts breaks (rank 37's GPU raises Xid 79, its CUDA call fails, every other rank
hits the NCCL watchdog, clocks skewed up to 3 s). Its logs are shipped through an embedded Kafka
broker to the faust worker; the incident lands in the search store and on a webhook; the demo prints
it, the webhook, the query that finds it, writes the HTML incident picture, stops everything and
exits 0 when the initiator is rank 37.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from rich.console import Console

from correlator.config import Settings
from correlator.tooling.embedded import UpContext, UpError, free_port, start_kafka
from correlator.tooling.local_services import WebhookReceiver, start_elasticsearch

if TYPE_CHECKING:
    from correlator.sinks.elasticsearch.search import IncidentHit

T = TypeVar("T")

console = Console(stderr=True)


def step(message: str) -> None:
    console.print(f"[bold cyan]demo[/] {message}")


def _write_config(path: Path, webhook_url: str, secret: str) -> None:
    import yaml

    path.write_text(yaml.safe_dump({
        "webhooks": {
            "receivers": {"demo": {"kind": "generic_json", "url": webhook_url, "secret": secret}},
            "routes": [{"match": {"job": "*"}, "receivers": ["demo"]}],
        }
    }))


def _wait_for(what: str, check: Callable[[], T | None], timeout_s: float) -> T:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(0.5)
    raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what}")


def run(keep: Path | None = None, timeout_s: float = 90.0) -> int:
    from elasticsearch import Elasticsearch

    from correlator.offline.diagnose import Diagnoser
    from correlator.render.html import render_incident_html
    from correlator.render.text import print_incidents
    from correlator.sinks.elasticsearch.indices import incidents_names, install_templates
    from correlator.sinks.elasticsearch.search import IncidentFilter, incidents_query, search_incidents
    from correlator.sinks.webhooks.receivers.generic_json import generate_secret
    from correlator.stream.setup_topics import ensure_topics
    from correlator.tooling.simulate import log_paths, simulate_demo
    from ingest.ship.runner import ShipOptions, run_ship

    started = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="rootrank-demo-"))
    out = keep or Path("out")
    out.mkdir(parents=True, exist_ok=True)
    settings = Settings()
    settings.engine.quiet_window_s = 5.0
    ctx = UpContext(settings=settings, data_dir=workdir)
    stops = []
    worker: subprocess.Popen[bytes] | None = None
    receiver = WebhookReceiver(secret=generate_secret())
    try:
        step("1/7 simulating a 64-rank job on 8 hosts (rank 37's GPU raises Xid 79; clocks skewed up to 3 s)")
        truth = simulate_demo(workdir / "job")
        files = log_paths(workdir / "job", truth)
        step(f"    {len(files)} log files, {sum(Path(f).stat().st_size for f in files) // 1024} KiB, job {truth.job_id}")

        step("2/7 starting the embedded stack: Kafka broker, search store, webhook receiver")
        kafka = start_kafka(ctx, broker="noida", port=free_port())
        stops.append(kafka.stop)
        es = start_elasticsearch(ctx)
        stops.append(es.stop)
        hook_url = receiver.start() + "/hook"
        stops.append(receiver.stop)
        for part in (kafka, es):
            step(f"    {part.name:12s} {part.address}  ({part.detail})")
        step(f"    {'webhook':12s} {hook_url}  (verifies Standard Webhooks signatures)")
        ensure_topics(settings)
        install_templates(settings)

        step("3/7 starting the faust worker (match, correlate, es-sink, webhooks)")
        config = workdir / "rootrank.yaml"
        _write_config(config, hook_url, receiver.secret or "")
        env = {
            **os.environ,
            "ROOTRANK_CONFIG": str(config),
            "ROOTRANK_KAFKA__BOOTSTRAP_SERVERS": settings.kafka.bootstrap_servers,
            "ROOTRANK_ELASTICSEARCH__URL": settings.elasticsearch.url,
            "ROOTRANK_ENGINE__QUIET_WINDOW_S": "5",
            "ROOTRANK_DATA_DIR": str(workdir / "worker"),
        }
        worker_log = (workdir / "worker.log").open("wb")
        worker = subprocess.Popen(
            [sys.executable, "-m", "correlator.cli", "worker", "--role", "all", "--web-port", str(free_port()),
             "--loglevel", "warning", "--skip-setup"],
            env=env, stdout=worker_log, stderr=subprocess.STDOUT, start_new_session=True,
        )

        step("4/7 shipping every host's logs with `rootrank ship` (batched, gzip, acks=all)")
        for host_dir in sorted({Path(f).parent for f in files}):
            options = ShipOptions(
                kafka={"bootstrap_servers": settings.kafka.bootstrap_servers},
                job_id=truth.job_id, host=host_dir.name, state_dir=workdir / "ship-state",
            )
            code = run_ship(options, files=[str(p) for p in sorted(host_dir.iterdir())])
            if code != 0:
                raise RuntimeError(f"rootrank ship exited {code} for {host_dir.name}")
        step(f"    shipped {len(files)} files to {settings.topics.logs}")

        step("5/7 waiting for the incident in the search store and on the webhook")
        client = Elasticsearch(settings.elasticsearch.url)
        alias = incidents_names(settings.elasticsearch.index_prefix).alias
        filt = IncidentFilter(job=truth.job_id)

        def found() -> list[IncidentHit] | None:
            if worker.poll() is not None:
                raise RuntimeError(f"the worker exited ({worker.returncode}); see {workdir / 'worker.log'}")
            try:
                hits = search_incidents(client, alias, filt)
            except Exception:  # noqa: BLE001 - the index appears with the first write
                return None
            return hits if hits and receiver.received else None

        hits = _wait_for("the incident", found, timeout_s)
        incident = hits[0].incident
        console.print()
        print_incidents([incident], Console(emoji=False))

        step("6/7 the webhook that arrived")
        hook = receiver.received[0]
        body = hook.json()
        console.print(f"    POST {hook.path}  webhook-id={hook.headers.get('webhook-id')}  "
                      f"signature {'valid' if hook.signature_valid else 'INVALID'}")
        data = body.get("data", {})
        incident_body = data.get("incident", data)
        console.print(f"    body: type={body.get('type')}, class={incident_body.get('class')}, "
                      f"initiator rank={incident_body.get('initiator', {}).get('rank')}, {len(hook.body)} bytes")
        console.print("    the search that finds it:")
        console.print(f"      rootrank incidents --job {truth.job_id} --es-url {settings.elasticsearch.url}")
        console.print(f"      GET {alias}/_search {incidents_query(filt)}", markup=False, highlight=False)

        step("7/7 writing the incident picture")
        _, signals = Diagnoser().diagnose([str(f) for f in files], truth.job_id)
        html = out / "demo-incident.html"
        html.write_text(render_incident_html(incident, signals), encoding="utf-8")
        step(f"    wrote {html}")

        ok = incident.initiator.rank == truth.initiator.rank
        elapsed = time.monotonic() - started
        if ok:
            step(f"[green]done in {elapsed:.0f}s: initiator rank {incident.initiator.rank} on "
                 f"{incident.initiator.host} ({incident.class_}) is the simulated culprit[/]")
            return 0
        step(f"[red]the incident names rank {incident.initiator.rank}, the simulation broke rank "
             f"{truth.initiator.rank}[/]")
        return 1
    except (UpError, TimeoutError, RuntimeError) as exc:
        step(f"[red]failed: {exc}[/]")
        tail = (workdir / "worker.log").read_text(errors="replace")[-3000:] if (workdir / "worker.log").exists() else ""
        if tail:
            console.print(tail, markup=False, highlight=False)
        return 1
    finally:
        step("stopping everything")
        if worker is not None and worker.poll() is None:
            os.killpg(worker.pid, signal.SIGTERM)
            try:
                worker.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(worker.pid, signal.SIGKILL)
        for stop in reversed(stops):
            with contextlib.suppress(Exception):  # keep stopping the others
                stop()
        shutil.rmtree(workdir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m correlator.tooling.demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="out", help="where the HTML incident picture is written")
    parser.add_argument("--timeout", type=float, default=90.0, help="seconds to wait for the incident")
    args = parser.parse_args(argv)
    code = run(Path(args.out), args.timeout)
    from correlator.tooling.path_hint import path_hint

    print(f"\n{path_hint(Path(sys.executable).parent, os.environ.get('PATH'), Path.cwd())}", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
