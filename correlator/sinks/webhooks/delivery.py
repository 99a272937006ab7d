"""POST one rendered notification until it is accepted or its budget is spent.

- Retries: exponential backoff with jitter (half fixed, half random, so attempts still spread
  out while the wait keeps growing), on connection errors, timeouts, 408, 425, 429 and 5xx.
- `Retry-After` (seconds or an HTTP date) on 429/503 is honoured as the wait, not shortened.
- Other 4xx and redirects are final at once: retrying cannot fix them, and following a redirect
  would send a signed body somewhere nobody registered.
- The budget is both a number of attempts and a wall-clock span; past it the caller dead-letters.
- The request body is rendered once, so every attempt carries the same bytes and the same
  `webhook-id`; only `webhook-timestamp` and the signature are fresh per attempt (Standard Webhooks).
Logs name the destination and a redacted target: never URLs, headers, bodies or secrets.
"""

from __future__ import annotations

import asyncio
import email.utils
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

import aiohttp

from correlator.config import RetryPolicy
from correlator.sinks.webhooks.receivers.base import OutboundRequest
from correlator.sinks.webhooks.receivers.generic_json import signature_headers

log = logging.getLogger("rootrank.webhooks")

USER_AGENT = "rootrank-webhooks/0.1"
RETRYABLE_STATUS = frozenset({408, 425, 429})


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    current = datetime.now(UTC).timestamp() if now is None else now
    return max(0.0, when.timestamp() - current)


@dataclass
class Attempt:
    status: int | None
    error: str | None
    elapsed_s: float
    retry_after_s: float | None = None

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300

    @property
    def retryable(self) -> bool:
        if self.status is None:
            return True
        return self.status in RETRYABLE_STATUS or self.status >= 500


@dataclass
class DeliveryResult:
    delivery_id: str
    destination: str
    target: str
    delivered: bool
    attempts: list[Attempt] = field(default_factory=list)
    elapsed_s: float = 0.0
    reason: str | None = None
    dead_lettered: bool = False

    @property
    def statuses(self) -> list[int | None]:
        return [a.status for a in self.attempts]


def describe_error(exc: BaseException) -> str:
    """Error kind without the message: aiohttp messages can carry the full request URL."""
    if isinstance(exc, asyncio.TimeoutError):
        return "timeout"
    if isinstance(exc, aiohttp.ClientConnectorError):
        return f"connect failed ({exc.os_error.__class__.__name__})"
    return exc.__class__.__name__


SleepFn = Callable[[float], Awaitable[None]]


class Deliverer:
    def __init__(
        self,
        policy: RetryPolicy | None = None,
        *,
        rng: random.Random | None = None,
        sleep: SleepFn = asyncio.sleep,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.policy = policy or RetryPolicy()
        self.rng = rng or random.Random()
        self.sleep = sleep
        self.clock = clock
        self._session: aiohttp.ClientSession | None = None

    async def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.policy.timeout_s),
                headers={"User-Agent": USER_AGENT},
                # Proxies from the environment would see bodies; rootrank talks to targets directly.
                trust_env=False,
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _attempt(self, request: OutboundRequest, delivery_id: str) -> Attempt:
        headers = {"Content-Type": "application/json", **request.headers}
        headers.update(signature_headers(request.signing_key, delivery_id, int(self.clock()), request.body))
        started = time.monotonic()
        session = await self._client()
        try:
            async with session.post(request.url, data=request.body, headers=headers, allow_redirects=False) as resp:
                # Drain (bounded) so the connection can be reused; the content is not used.
                await resp.content.read(64 * 1024)
                retry_after = parse_retry_after(resp.headers.get("Retry-After"))
                return Attempt(resp.status, None, time.monotonic() - started, retry_after)
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            return Attempt(None, describe_error(exc), time.monotonic() - started)

    async def deliver(self, request: OutboundRequest, delivery_id: str, destination: str, target: str) -> DeliveryResult:
        policy = self.policy
        started = time.monotonic()
        result = DeliveryResult(delivery_id, destination, target, delivered=False)
        for number in range(1, policy.max_attempts + 1):
            attempt = await self._attempt(request, delivery_id)
            result.attempts.append(attempt)
            result.elapsed_s = time.monotonic() - started
            outcome = attempt.status if attempt.status is not None else attempt.error
            if attempt.ok:
                result.delivered = True
                log.info(
                    "webhook %s delivered to %s (%s) on attempt %d: %s",
                    delivery_id, destination, target, number, outcome,
                )
                return result
            if not attempt.retryable:
                result.reason = f"final answer {attempt.status}"
                break
            if number == policy.max_attempts:
                result.reason = f"{number} attempts failed, last: {outcome}"
                break
            if attempt.retry_after_s is not None and attempt.status in (429, 503):
                if attempt.retry_after_s > policy.max_retry_after_s:
                    result.reason = f"Retry-After {attempt.retry_after_s:.0f}s beyond the allowed {policy.max_retry_after_s:.0f}s"
                    break
                delay = attempt.retry_after_s
            else:
                delay = policy.backoff(number, self.rng)
            if result.elapsed_s + delay > policy.budget_s:
                result.reason = f"budget {policy.budget_s:.0f}s spent after {number} attempts, last: {outcome}"
                break
            log.warning(
                "webhook %s to %s (%s) attempt %d failed (%s); retrying in %.1fs",
                delivery_id, destination, target, number, outcome, delay,
            )
            await self.sleep(delay)
        result.elapsed_s = time.monotonic() - started
        log.error("webhook %s to %s (%s) not delivered: %s", delivery_id, destination, target, result.reason)
        return result
