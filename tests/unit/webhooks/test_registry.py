"""Registrations over a changelog-replicated table that echoes the worker's own writes back late."""

from __future__ import annotations

import json
from typing import Any

from correlator.sinks.webhooks.registry import EchoSafeStore, Registration, Registry


class EchoingTable(dict[str, Any]):
    """A dict whose writes are also queued as changelog records, applied back later (as faust does)."""

    def __init__(self) -> None:
        super().__init__()
        self.changelog: list[tuple[bytes, bytes]] = []

    def __setitem__(self, key: str, value: Any) -> None:
        super().__setitem__(key, value)
        self.changelog.append((key.encode(), json.dumps(value).encode()))

    def replay(self, store: EchoSafeStore, upto: int) -> None:
        """Apply the first `upto` changelog records to the local copy, the way the standby reader does."""
        for key, value in self.changelog[:upto]:
            super().__setitem__(key.decode(), json.loads(value))
            store.on_changelog(key, value)


def test_a_removed_webhook_stays_removed_while_the_changelog_catches_up() -> None:
    table = EchoingTable()
    store = EchoSafeStore(table)
    registry = Registry(store)
    registry.upsert("job-c", Registration(url="https://h.example.com/c"))
    [registration] = registry.for_job("job-c")
    assert registry.remove("job-c", registration.id)

    table.replay(store, upto=1)  # the PUT's record comes back after the DELETE was made locally
    assert table["job-c"]["webhooks"]  # the raw table is stale...
    assert registry.for_job("job-c") == []  # ...the registry is not
    assert store.pending == 1

    table.replay(store, upto=2)  # the DELETE's own record: caught up
    assert store.pending == 0
    assert registry.for_job("job-c") == []


def test_writes_by_another_worker_after_ours_win_once_ours_is_seen() -> None:
    table = EchoingTable()
    store = EchoSafeStore(table, writer_id="me")
    registry = Registry(store)
    registry.upsert("job-a", Registration(url="https://h.example.com/mine"))
    table.replay(store, upto=1)
    assert store.pending == 0
    # Another worker (its own store over the same changelog) writes later: it lands in our table.
    other = {"v": 1, "webhooks": [{"kind": "generic_json", "url": "https://h.example.com/theirs"}], "writer": "w2", "seq": 1}
    dict.__setitem__(table, "job-a", other)
    store.on_changelog(b"job-a", json.dumps(other).encode())
    assert [r.url for r in registry.for_job("job-a")] == ["https://h.example.com/theirs"]
