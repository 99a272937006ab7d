"""correlator/stream/compat.py: the only module that touches faust's and aiokafka's private internals.

Each test checks that a work-around still reaches what it is for in the installed faust and aiokafka,
so a release that renames an internal fails here, not silently in a worker."""

from __future__ import annotations

import asyncio
import importlib.metadata
import inspect
import logging
import uuid
from typing import Any

import faust
import pytest
from aiokafka import AIOKafkaConsumer
from faust.types import TP

from correlator.stream import compat


def _app() -> faust.App:
    # Never started: the broker is never contacted.
    return faust.App(f"test-compat-{uuid.uuid4().hex[:8]}", broker="kafka://127.0.0.1:1", store="memory://",
                     autodiscover=False)


async def _worker_consumer(app: faust.App) -> Any:
    """The aiokafka consumer faust's consumer thread would build for `app` (aiokafka wants a running loop)."""
    thread = app.consumer._thread  # type: ignore[attr-defined]
    return thread._create_worker_consumer(app.transport)


@pytest.fixture
def fresh_hook(monkeypatch: pytest.MonkeyPatch) -> type:
    """faust's consumer-thread class as compat finds it in a new process (not yet wrapped by compat),
    put back as it was after the test."""
    from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread

    monkeypatch.setattr(AIOKafkaConsumerThread, "_create_worker_consumer",
                        AIOKafkaConsumerThread._create_worker_consumer)
    monkeypatch.delattr(AIOKafkaConsumerThread, "_rootrank_fetch_wait_hooked", raising=False)
    return AIOKafkaConsumerThread


def test_use_fetch_max_wait_builds_the_consumer_with_that_wait(fresh_hook: type) -> None:
    app = _app()
    other = _app()
    compat.use_fetch_max_wait(app, 50)

    async def build() -> tuple[Any, Any]:
        return await _worker_consumer(app), await _worker_consumer(other)

    consumer, untouched = asyncio.run(build())
    assert isinstance(consumer, AIOKafkaConsumer)
    assert consumer._fetch_max_wait_ms == 50
    assert untouched._fetch_max_wait_ms == 1500  # faust's own value: an app without the setting keeps it
    # aiokafka hands that attribute to its Fetcher when the consumer starts: the hook is not a no-op.
    assert "fetch_max_wait_ms=self._fetch_max_wait_ms" in inspect.getsource(AIOKafkaConsumer.start)


def test_use_fetch_max_wait_wraps_faust_once(fresh_hook: type) -> None:
    original = fresh_hook._create_worker_consumer  # type: ignore[attr-defined]
    compat.use_fetch_max_wait(_app(), 100)
    hooked = fresh_hook._create_worker_consumer  # type: ignore[attr-defined]
    assert hooked is not original
    compat.use_fetch_max_wait(_app(), 200)
    assert fresh_hook._create_worker_consumer is hooked  # type: ignore[attr-defined]


def test_hold_fetched_records_suspends_flow_control_on_rebalance_complete() -> None:
    app = _app()
    compat.hold_fetched_records_across_rebalance_completion(app)

    async def rebalance_completes() -> bool:
        app.flow_control.resume()
        assert app.flow_control.is_active()
        await app.on_rebalance_complete.send()
        return bool(app.flow_control.is_active())

    assert asyncio.run(rebalance_completes()) is False


def test_consumer_connected_is_false_before_the_app_started() -> None:
    app = _app()
    assert compat.faust_consumer_connected(app) is False


def test_consumer_connected_reads_the_aiokafka_client_connections() -> None:
    app = _app()

    class Conn:
        def __init__(self, up: bool) -> None:
            self.up = up

        def connected(self) -> bool:
            return self.up

    async def probe() -> list[bool]:
        consumer = await _worker_consumer(app)
        app.consumer._thread._consumer = consumer  # type: ignore[attr-defined]  # what on_start does
        seen = [compat.faust_consumer_connected(app)]  # no connection yet
        consumer._client._conns[0] = Conn(False)
        seen.append(compat.faust_consumer_connected(app))
        consumer._client._conns[1] = Conn(True)
        seen.append(compat.faust_consumer_connected(app))
        return seen

    assert asyncio.run(probe()) == [False, False, True]


def test_read_offset_follows_faust_seek() -> None:
    app = _app()
    tp = TP("logs", 0)
    assert compat.faust_read_offset(app, tp) is None

    async def seek() -> None:
        async def no_broker(partition: Any, offset: int) -> None:
            return None

        app.consumer._seek = no_broker  # type: ignore[attr-defined]
        await app.consumer.seek(tp, 7)

    asyncio.run(seek())
    assert compat.faust_read_offset(app, tp) == 7


def test_committed_offset_and_producer_metadata_need_started_clients() -> None:
    """Before the app started both raise (the callers run only on a started app): they reach faust's
    aiokafka clients by the names faust 0.15 gives them."""
    from faust.exceptions import ConsumerNotStarted, NotReady

    app = _app()
    with pytest.raises(ConsumerNotStarted):
        asyncio.run(compat.faust_committed_offset(app, TP("incidents", 0)))
    with pytest.raises(NotReady):
        asyncio.run(compat.faust_producer_partitions_for(app, "incidents"))


def test_committed_offset_asks_the_aiokafka_consumer_on_faust_thread() -> None:
    app = _app()
    asked: list[Any] = []

    class Client:
        async def committed(self, tp: Any) -> int:
            asked.append(tp)
            return 41

    class Thread:
        def _ensure_consumer(self) -> Any:
            return Client()

        async def call_thread(self, fn: Any, *args: Any) -> Any:
            return await fn(*args)

    app.consumer._thread = Thread()  # type: ignore[attr-defined]
    tp = TP("incidents", 2)
    assert asyncio.run(compat.faust_committed_offset(app, tp)) == 41
    assert asked == [tp]


def test_installed_versions_are_in_the_tested_range(caplog: pytest.LogCaptureFixture) -> None:
    faust_version = importlib.metadata.version("faust-streaming")
    aiokafka_version = importlib.metadata.version("aiokafka")
    assert compat.version_in_tested_range("faust-streaming", faust_version)
    assert compat.version_in_tested_range("aiokafka", aiokafka_version)
    with caplog.at_level(logging.WARNING, logger=compat.log.name):
        assert compat.check_versions() == []
    assert not caplog.records


@pytest.mark.parametrize("version", ["0.16.0", "0.15.2", "1.0", "0.11.3", "dev"])
def test_version_guard_warns_outside_the_tested_range(version: str, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger=compat.log.name):
        warnings = compat.check_versions({"faust-streaming": version, "aiokafka": "0.14.0"})
    assert len(warnings) == 1
    assert f"faust-streaming {version} is outside" in warnings[0]
    assert [r.getMessage() for r in caplog.records] == warnings


@pytest.mark.parametrize("version", ["0.15.3", "0.15.10", "0.15.4rc1"])
def test_version_guard_accepts_the_tested_range(version: str) -> None:
    assert compat.check_versions({"faust-streaming": version, "aiokafka": "0.14.1"}) == []


def test_version_guard_runs_when_compat_is_imported(monkeypatch: pytest.MonkeyPatch,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    import importlib

    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version",
                        lambda name: "0.16.1" if name == "faust-streaming" else real(name))
    with caplog.at_level(logging.WARNING, logger=compat.log.name):
        importlib.reload(compat)
    assert any("faust-streaming 0.16.1" in r.getMessage() for r in caplog.records)
    monkeypatch.undo()
    importlib.reload(compat)
