"""`rootrank worker`: run one or more roles of the pipeline in this process until SIGTERM/SIGINT.

SIGTERM and SIGINT stop the worker cleanly (offsets of processed messages are committed, the
producer is flushed). A worker killed hard loses nothing either: it restarts from the last committed
offsets and recovers job state from the changelog.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
from typing import Any

from correlator.config import Settings
from correlator.stream.app import build_apps, parse_roles

log = logging.getLogger(__name__)


class _StartTogether:
    """Starts the role apps concurrently (each waits for its own group join, seconds on some brokers)
    and stops them in reverse order. The worker then finds its primary app already started."""

    def __new__(cls, apps: list[Any]) -> Any:
        from mode import Service

        class StartTogether(Service):
            async def on_start(self) -> None:
                await asyncio.gather(*(app.maybe_start() for app in apps))

            async def on_stop(self) -> None:
                for app in reversed(apps):
                    await app.stop()

        return StartTogether()


def run_worker(settings: Settings, roles: str = "all", *, loglevel: str = "WARNING",
               web_port: int | None = None, **overrides: Any) -> int:
    import faust

    apps = build_apps(settings, parse_roles(roles), web_port=web_port, **overrides)
    # What start-up built (modules, rule set, compiled patterns) lives as long as the process: keep it
    # out of the cyclic garbage collector's full passes, which otherwise walk all of it again and again.
    gc.collect()
    gc.freeze()
    # A match batch allocates tens of thousands of short-lived objects (aiokafka builds a record object
    # per message); collecting the youngest generation every 700 allocations walks them to free nothing.
    # 8% more lines per CPU-second in the match role (docs/performance.md).
    gc.set_threshold(50_000, 20, 20)
    # mode's worker needs a current event loop before it starts.
    try:
        asyncio.get_event_loop()
    except RuntimeError:
        asyncio.set_event_loop(asyncio.new_event_loop())
    first = apps[0]
    # quiet: no banner or spinner (they write terminal escapes into log files); one line per app instead.
    worker = faust.Worker(first, _StartTogether(apps), loglevel=loglevel, redirect_stdouts=False, quiet=True)
    worker.spinner = None  # faust draws it even when quiet
    for app in apps:
        web = f", http://127.0.0.1:{app.conf.web_port}/rootrank/metrics" if app.conf.web_enabled else ""
        print(f"rootrank worker: {app.conf.id} (group {app.conf.id}) on {settings.kafka.bootstrap_servers}{web}",
              file=sys.stderr, flush=True)
    # execute_from_commandline() exits the process through sys.exit when the worker stops.
    try:
        worker.execute_from_commandline()
    except SystemExit as exc:
        return int(exc.code or 0) if not isinstance(exc.code, str) else 1


if __name__ == "__main__":  # pragma: no cover - `rootrank worker` is the entry point
    from correlator.config import load_settings

    sys.exit(run_worker(load_settings(), sys.argv[1] if len(sys.argv) > 1 else "all"))
