"""The bulk writer: writes documents until Elasticsearch acknowledged every one (or rejected it for good)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tenacity import RetryCallState, Retrying, retry_if_result, stop_never
from tenacity.wait import wait_base

from correlator.config import RetryPolicy
from correlator.stream import metrics

if TYPE_CHECKING:
    from elasticsearch import Elasticsearch

log = logging.getLogger(__name__)


class SinkStopped(Exception):
    """The stop signal was set while a write was still unacknowledged: nothing may be committed."""


@dataclass(frozen=True)
class IndexRequest:
    """One document to index. `version` (an incident's revision) makes the write external-versioned."""

    alias: str
    doc_id: str
    source: Mapping[str, Any]
    version: int | None = None
    ref: Any = None  # the caller's handle (e.g. the Kafka record), returned with rejections


@dataclass
class BulkOutcome:
    written: int = 0
    stale: int = 0  # an equal-or-newer revision was already indexed: nothing to do
    rejected: list[tuple[IndexRequest, str]] = field(default_factory=list)  # permanent, per document
    attempts: int = 0


# Only the backoff of a RetryPolicy applies: the writer has no attempt limit and no budget, because an
# outage must back up the source, never drop a document.
BULK_BACKOFF = RetryPolicy(initial_backoff_s=0.5, max_backoff_s=30.0).backoff()

_RETRIABLE_ITEM_STATUS = {408, 429, 500, 502, 503, 504}


@dataclass
class WriterStats:
    retries: int = 0


class BulkWriter:
    """Writes documents with the bulk API until every one is acknowledged (or permanently rejected).

    - Idempotent: `_id` is given by the caller; a document already living in an older index behind
      the alias (after a rollover) is written there, found by a real-time multi-get.
    - Whole-request failures (connection refused, timeouts, 429/5xx, even 401) are retried forever with
      exponential backoff (tenacity, `BULK_BACKOFF`): an outage must back up the source, never drop a
      document. `wait` is called
      instead of sleeping, so a Kafka consumer can keep its group membership while it waits.
    - Item failures: 429/5xx are retried; 409 on a versioned write means an equal or newer revision is
      there (counted as stale, not an error); a missing alias is re-bootstrapped; any other 4xx
      (a mapping error) is permanent and returned in `rejected` for the caller's dead-letter topic.
    """

    def __init__(
        self,
        client: Elasticsearch,
        *,
        backoff: wait_base = BULK_BACKOFF,
        stop: threading.Event | None = None,
        wait: Callable[[float], None] | None = None,
        bootstrap: Callable[[str], None] | None = None,
        refresh: bool | str = False,
    ) -> None:
        self.client = client
        self.backoff = backoff
        self.stop = stop or threading.Event()
        self._wait = wait
        self._bootstrap = bootstrap
        self.refresh = refresh
        self.stats = WriterStats()
        self._last_warning = 0.0

    # The default `wait` just sleeps, interruptibly.
    def _sleep(self, seconds: float) -> None:
        if self._wait is not None:
            deadline = time.monotonic() + seconds
            while not self.stop.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._wait(left)
        else:
            self.stop.wait(seconds)
        if self.stop.is_set():
            raise SinkStopped("stopped while a bulk write was unacknowledged")

    def _warn(self, message: str) -> None:
        now = time.monotonic()
        if now - self._last_warning >= 10.0:  # an outage logs a line every 10 s, not per retry
            self._last_warning = now
            log.warning("elasticsearch: %s (retrying; nothing is committed until it succeeds)", message)

    def _older_indices(self, alias: str) -> list[str]:
        found = self.client.indices.get_alias(name=alias)
        older = [idx for idx, meta in found.items() if not meta["aliases"][alias].get("is_write_index", False)]
        # Newest first: a document written after several rollovers is in the most recent one.
        return sorted(older, reverse=True)

    def _targets(self, requests: Sequence[IndexRequest]) -> dict[tuple[str, str], str]:
        """(alias, id) -> the older concrete index that already holds the id."""
        targets: dict[tuple[str, str], str] = {}
        by_alias: dict[str, list[str]] = {}
        for r in requests:
            by_alias.setdefault(r.alias, []).append(r.doc_id)
        for alias, ids in by_alias.items():
            older = self._older_indices(alias)
            if not older:
                continue
            docs = [{"_index": idx, "_id": doc_id} for idx in older for doc_id in ids]
            resp = self.client.mget(docs=docs, source=False, realtime=True)
            for hit in resp["docs"]:
                if hit.get("found"):
                    targets.setdefault((alias, str(hit["_id"])), str(hit["_index"]))
        return targets

    @staticmethod
    def _dedupe(requests: Iterable[IndexRequest]) -> list[IndexRequest]:
        """One request per document: the highest version, the latest on a tie (bulk order is not a
        contract across shards, and an older revision must never win)."""
        latest: dict[tuple[str, str], IndexRequest] = {}
        for r in requests:
            key = (r.alias, r.doc_id)
            prev = latest.get(key)
            if prev is None or (r.version or 0) >= (prev.version or 0):
                latest[key] = r
        return list(latest.values())

    def write(self, requests: Sequence[IndexRequest]) -> BulkOutcome:
        outcome = BulkOutcome()
        pending = self._dedupe(requests)
        # Requests folded into another by _dedupe count as written when their survivor is.
        folded = len(requests) - len(pending)

        def attempt() -> list[IndexRequest]:
            nonlocal pending
            outcome.attempts += 1
            pending = self._write_once(pending, outcome)
            return pending

        def count_retry(state: RetryCallState) -> None:
            self.stats.retries += 1

        if pending:
            Retrying(
                retry=retry_if_result(bool),  # documents not acknowledged yet
                wait=self.backoff,
                stop=stop_never,
                sleep=self._sleep,  # raises SinkStopped when the stop signal is set
                before_sleep=count_retry,
            )(attempt)
        outcome.written += folded
        metrics.observe_es_bulk(rejected=len(outcome.rejected))
        return outcome

    def _write_once(self, pending: Sequence[IndexRequest], outcome: BulkOutcome) -> list[IndexRequest]:
        """One bulk request; what it did not settle (acknowledged, stale or rejected) is returned."""
        from elastic_transport import TransportError
        from elasticsearch import ApiError, NotFoundError

        try:
            targets = self._targets(pending)
            operations: list[Mapping[str, Any]] = []
            for r in pending:
                target = targets.get((r.alias, r.doc_id))
                action: dict[str, Any] = {"_index": target or r.alias, "_id": r.doc_id}
                if target is None:
                    # Never let a missing alias auto-create a concrete index named like the alias.
                    action["require_alias"] = True
                if r.version is not None:
                    action["version"] = r.version
                    action["version_type"] = "external_gte"
                operations.append({"index": action})
                operations.append(r.source)
            started = time.perf_counter()
            resp = self.client.bulk(operations=operations, refresh=self.refresh)
            metrics.observe_es_bulk(time.perf_counter() - started)
        except NotFoundError as exc:
            # get_alias: the alias is gone (a wiped cluster); put it back, then retry.
            metrics.observe_es_bulk(failure="alias_missing")
            self._warn(f"alias missing: {exc}")
            self._rebootstrap(pending)
            return list(pending)
        except (ApiError, TransportError) as exc:
            self._warn(f"bulk of {len(pending)} failed: {type(exc).__name__}: {exc}")
            metrics.observe_es_bulk(failure=type(exc).__name__)
            return list(pending)
        retry: list[IndexRequest] = []
        missing_alias: set[str] = set()
        for r, item in zip(pending, resp["items"], strict=True):
            result = item.get("index") or next(iter(item.values()))
            status = int(result.get("status", 500))
            error = result.get("error")
            if status < 300 and not error:
                outcome.written += 1
            elif status == 409 and r.version is not None:
                outcome.stale += 1
            elif status in _RETRIABLE_ITEM_STATUS:
                retry.append(r)
            elif status == 404 and isinstance(error, dict) and error.get("type") == "index_not_found_exception":
                missing_alias.add(r.alias)
                retry.append(r)
            else:
                reason = error.get("reason", str(error)) if isinstance(error, dict) else str(error)
                etype = error.get("type", "error") if isinstance(error, dict) else "error"
                outcome.rejected.append((r, f"elasticsearch rejected the document ({status} {etype}): {reason}"))
        if retry:
            self._warn(f"{len(retry)} of {len(pending)} documents not accepted yet")
        if missing_alias:
            self._rebootstrap([r for r in retry if r.alias in missing_alias])
        return retry

    def _rebootstrap(self, requests: Sequence[IndexRequest]) -> None:
        if self._bootstrap is None:
            return
        for alias in sorted({r.alias for r in requests}):
            try:
                self._bootstrap(alias)
            except Exception as exc:  # the next attempt retries; the outage may still be going on
                self._warn(f"could not re-create {alias}: {exc}")
                log.debug("re-creating %s failed", alias, exc_info=True)
