"""The one place that touches faust's and aiokafka's private internals.

Tested on faust-streaming 0.15.3 (https://github.com/faust-streaming/faust) with aiokafka 0.14.0;
pyproject.toml pins faust-streaming to `>=0.15.3,<0.16`. Importing this module checks the installed
versions and logs a warning naming any that is outside the tested range (`check_versions`): every
function below relies on attributes a faust or aiokafka release may rename without notice, and
tests/unit/test_stream_compat.py fails when one of them no longer does what it is here for.

The work-arounds, and why no public API does them:

`use_fetch_max_wait(app, wait_ms)`
    faust builds its aiokafka consumer in `AIOKafkaConsumerThread._create_worker_consumer` with a
    literal `fetch_max_wait_ms=1500` and has no setting for it (`App.conf` has none, and the
    consumer is built inside faust's consumer thread, so there is no public place to pass kwargs).
    The hook wraps that private factory and overwrites aiokafka's private `_fetch_max_wait_ms`,
    which `AIOKafkaConsumer.start()` hands to its Fetcher. No upstream issue found.

`hold_fetched_records_across_rebalance_completion(app)`
    Uses only public faust API (`on_rebalance_complete`, `flow_control.suspend()`); it lives here
    because it works around faust 0.15's order of operations at the end of a rebalance, which a
    faust release may change. No upstream issue found for this exact sequence; the closest is
    faust-streaming/faust#596 (open: the clear of the in-memory queues after recovery races with
    fetched records and leaves gaps in the acked offsets).

`faust_consumer_connected(app)`
    faust exposes no "is the consumer connected" state, and aiokafka's client keeps its broker
    connections in the private `AIOKafkaClient._conns`; the aiokafka consumer itself is reachable
    only through faust's private `Consumer._thread._ensure_consumer()`. No upstream issue found.

`faust_read_offset(app, tp)`
    The last offset faust handed to a stream is the private `Consumer._read_offset`. The public
    `app.monitor.tp_read_offsets` is close but is not reset when faust seeks a partition (after a
    rebalance, to the committed offset), so lag computed from it would be wrong then. No upstream
    issue found.

`faust_committed_offset(app, tp)`
    aiokafka's `AIOKafkaConsumer.committed(tp)` is public, but faust gives no public way to reach its
    aiokafka consumer, nor a per-partition committed-offset lookup of its own; its public
    `Consumer.seek_to_committed()` seeks every assigned partition, a side effect in the middle of the
    rebalance it is needed in. No upstream issue found.

`faust_producer_partitions_for(app, topic)`
    aiokafka's `AIOKafkaProducer.partitions_for(topic)` is public (it fetches the topic's metadata),
    but faust's producer has no public access to its aiokafka producer (`Producer._ensure_producer()`
    is private) and no public metadata call; a table written outside a stream picks its changelog
    partition synchronously from that metadata. No upstream issue found (robinhood/faust#499 is the
    related case of metadata missing right after faust creates a topic).
"""

from __future__ import annotations

import importlib.metadata
import logging
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import faust

log = logging.getLogger(__name__)

# distribution -> (lowest tested, first untested): the ranges the tests ran on.
TESTED_VERSIONS: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {
    "faust-streaming": ((0, 15, 3), (0, 16)),
    "aiokafka": ((0, 14, 0), (0, 15)),
}

FETCH_WAIT_ATTR = "_rootrank_fetch_max_wait_ms"  # set on an app: the fetch wait its consumer is built with
_HOOKED_FLAG = "_rootrank_fetch_wait_hooked"  # set on faust's consumer-thread class once it is wrapped


def _release(version: str) -> tuple[int, ...] | None:
    """The leading numeric release of a version string ("0.15.3" -> (0, 15, 3)); None if it has none."""
    match = re.match(r"\d+(?:\.\d+)*", version.strip())
    return tuple(int(part) for part in match.group(0).split(".")) if match else None


def version_in_tested_range(distribution: str, version: str) -> bool:
    low, high = TESTED_VERSIONS[distribution]
    release = _release(version)
    return release is not None and low <= release < high


def check_versions(installed: dict[str, str | None] | None = None) -> list[str]:
    """Warn for each distribution of TESTED_VERSIONS whose installed version is outside the tested
    range; returns the warnings. `installed` (distribution -> version, None: not installed) is for
    tests; by default the versions come from importlib.metadata."""
    warnings: list[str] = []
    for distribution, (low, high) in TESTED_VERSIONS.items():
        if installed is not None:
            version = installed.get(distribution)
        else:
            try:
                version = importlib.metadata.version(distribution)
            except importlib.metadata.PackageNotFoundError:
                version = None
        if version is None or version_in_tested_range(distribution, version):
            continue
        text = (f"{distribution} {version} is outside the range correlator.stream.compat was tested on "
                f"(>={'.'.join(map(str, low))},<{'.'.join(map(str, high))}): its work-arounds use private "
                "faust/aiokafka internals that may have changed")
        log.warning("%s", text)
        warnings.append(text)
    return warnings


check_versions()


def _install_fetch_wait_hook() -> None:
    """Wrap faust's consumer factory once per process: a consumer built for an app carrying
    FETCH_WAIT_ATTR gets that fetch wait instead of faust's 1500 ms."""
    from faust.transport.drivers import aiokafka as driver

    thread_cls = driver.AIOKafkaConsumerThread
    if getattr(thread_cls, _HOOKED_FLAG, False):
        return
    original = thread_cls._create_worker_consumer

    def create_worker_consumer(self: Any, transport: Any) -> Any:
        consumer = original(self, transport)
        wait_ms = getattr(self.app, FETCH_WAIT_ATTR, None)
        if wait_ms is not None and hasattr(consumer, "_fetch_max_wait_ms"):
            consumer._fetch_max_wait_ms = int(wait_ms)  # read by AIOKafkaConsumer.start() for its Fetcher
        return consumer

    setattr(thread_cls, "_create_worker_consumer", create_worker_consumer)  # noqa: B010 - the patch itself, not a checked assignment
    setattr(thread_cls, _HOOKED_FLAG, True)


def use_fetch_max_wait(app: faust.App, wait_ms: int) -> None:
    """Build `app`'s aiokafka consumer with `fetch_max_wait_ms=wait_ms` (faust hard-codes 1500).
    Call before the app starts: the value is read when faust creates its consumer."""
    _install_fetch_wait_hook()
    setattr(app, FETCH_WAIT_ATTR, int(wait_ms))


def hold_fetched_records_across_rebalance_completion(app: faust.App) -> None:
    """faust-streaming 0.15 resumes the stream partitions and seeks them to the committed offsets
    *before* `flow_control.resume()`, which empties every agent's buffer. The fetcher already runs
    (it read the changelogs), so records fetched in between were put in a buffer and wiped while the
    read position moved past them: never processed, and a commit can step over the hole. With flow
    control suspended from `on_rebalance_complete` (sent right before that seek), fetched records
    wait in the conductor and enter the buffers after the clear. Found by the webhook rebalance test
    (tests/integration/test_webhooks_stream.py); it applies to every role's app."""

    @app.on_rebalance_complete.connect  # type: ignore[arg-type]  # mode's receiver type (a generic `signal` keyword) cannot be met; faust calls it (sender, ..., signal=...)
    async def hold_buffers(sender: Any, *args: Any, **kwargs: Any) -> None:
        app.flow_control.suspend()


def _aiokafka_consumer(app: faust.App) -> Any:
    """faust's aiokafka consumer; raises (ConsumerNotStarted) before faust's consumer thread made it."""
    return app.consumer._thread._ensure_consumer()  # type: ignore[attr-defined]  # faust's private attribute: what this module is for (see its docstring)


def faust_consumer_connected(app: faust.App) -> bool:
    """Whether `app`'s aiokafka consumer holds at least one live broker connection (False before the
    app started, or on another transport)."""
    try:
        return aiokafka_consumer_connected(_aiokafka_consumer(app))
    except Exception:  # noqa: BLE001 - not started yet, or another transport: not connected
        return False


def aiokafka_consumer_connected(consumer: Any) -> bool:
    """Whether an aiokafka consumer holds at least one live broker connection. aiokafka 0.14 has no
    public call for it (its client's connection map is private); the match role's reader asks this too."""
    try:
        conns = getattr(consumer._client, "_conns", {})
        return any(getattr(conn, "connected", lambda: False)() for conn in conns.values())
    except Exception:  # noqa: BLE001 - not started: not connected
        return False


def faust_read_offset(app: faust.App, tp: Any) -> int | None:
    """The offset of the last record of `tp` faust handed to a stream (None: none since the last seek)."""
    read: int | None = app.consumer._read_offset.get(tp)  # type: ignore[attr-defined]  # faust's private attribute: what this module is for (see its docstring)
    return read


async def faust_committed_offset(app: faust.App, tp: Any) -> int | None:
    """The offset `app`'s group committed for `tp` (None or negative: never committed), asked on
    faust's consumer thread like faust's own calls into aiokafka."""
    thread = app.consumer._thread  # type: ignore[attr-defined]  # faust's private attribute: what this module is for (see its docstring)
    client = thread._ensure_consumer()
    committed: int | None = await thread.call_thread(client.committed, tp)
    return committed


async def faust_producer_partitions_for(app: faust.App, topic: str) -> set[int]:
    """The partitions of `topic`, fetching its metadata into `app`'s producer if it has none yet."""
    producer = app.producer._ensure_producer()  # type: ignore[attr-defined]  # faust's private attribute: what this module is for (see its docstring)
    partitions: set[int] = await producer.partitions_for(topic)
    return partitions
