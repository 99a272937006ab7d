"""POST one rendered notification until it is accepted or its budget is spent.

- Retries (tenacity, `RetryPolicy.backoff`): exponential backoff with jitter (half fixed, half random, so attempts still spread
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
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

import aiohttp
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_result,
    stop_after_attempt,
    stop_before_delay,
)
from tenacity.stop import stop_base

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
    # The retries ran out on failures that may pass (connection errors, timeouts, 5xx, 429): the
    # receiver may come back. False for a final answer (another 4xx, a Retry-After beyond the limit).
    exhausted: bool = False

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
# Told about every failed attempt that will be retried: the attempt and the wait before the next one.
RetryFn = Callable[[Attempt, float], None]


def _last_attempt(state: RetryCallState) -> Attempt:
    assert state.outcome is not None
    attempt: Attempt = state.outcome.result()
    return attempt


def _honoured_retry_after(attempt: Attempt) -> float | None:
    if attempt.retry_after_s is not None and attempt.status in (429, 503):
        return attempt.retry_after_s
    return None


def _outcome(attempt: Attempt) -> int | str | None:
    return attempt.status if attempt.status is not None else attempt.error


class stop_if_retry_after_beyond(stop_base):  # named like tenacity's own stop conditions
    """Stop when the receiver asks for a longer wait than allowed: the caller dead-letters at once."""

    def __init__(self, limit_s: float) -> None:
        self.limit_s = limit_s

    def __call__(self, retry_state: RetryCallState) -> bool:
        retry_after = _honoured_retry_after(_last_attempt(retry_state))
        return retry_after is not None and retry_after > self.limit_s


class Deliverer:
    def __init__(
        self,
        policy: RetryPolicy | None = None,
        *,
        sleep: SleepFn = asyncio.sleep,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.policy = policy or RetryPolicy()
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

    def _retrying(self, result: DeliveryResult, on_retry: RetryFn | None, single_attempt: bool) -> AsyncRetrying:
        policy = self.policy
        backoff = policy.backoff()

        def wait(state: RetryCallState) -> float:
            retry_after = _honoured_retry_after(_last_attempt(state))
            return retry_after if retry_after is not None else backoff(state)

        retry_after_too_long = stop_if_retry_after_beyond(policy.max_retry_after_s)

        def give_up(state: RetryCallState) -> Attempt:
            """Records why the retries stopped (for the dead letter) and returns the last attempt."""
            attempt, number = _last_attempt(state), state.attempt_number
            result.exhausted = True
            if retry_after_too_long(state):
                result.exhausted = False
                result.reason = (f"Retry-After {attempt.retry_after_s:.0f}s beyond the allowed "
                                 f"{policy.max_retry_after_s:.0f}s")
            elif single_attempt:
                result.reason = f"retry failed: {_outcome(attempt)}"
            elif number >= policy.max_attempts:
                result.reason = f"{number} attempts failed, last: {_outcome(attempt)}"
            else:
                result.reason = f"budget {policy.budget_s:.0f}s spent after {number} attempts, last: {_outcome(attempt)}"
            return attempt

        def log_retry(state: RetryCallState) -> None:
            log.warning(
                "webhook %s to %s (%s) attempt %d failed (%s); retrying in %.1fs",
                result.delivery_id, result.destination, result.target, state.attempt_number,
                _outcome(_last_attempt(state)), state.upcoming_sleep,
            )
            if on_retry is not None:
                on_retry(_last_attempt(state), state.upcoming_sleep)

        attempts = 1 if single_attempt else policy.max_attempts
        return AsyncRetrying(
            retry=retry_if_result(lambda attempt: not attempt.ok and attempt.retryable),
            wait=wait,
            # A wait that would end past the budget is not started: the caller dead-letters now.
            stop=stop_after_attempt(attempts) | retry_after_too_long | stop_before_delay(policy.budget_s),
            sleep=self.sleep,
            before_sleep=log_retry,
            retry_error_callback=give_up,
        )

    async def deliver(self, request: OutboundRequest, delivery_id: str, destination: str, target: str, *,
                      on_retry: RetryFn | None = None, single_attempt: bool = False) -> DeliveryResult:
        """Attempts until one is accepted, one is final, or the policy's attempts or budget are spent.
        `single_attempt`: one attempt only (a destination that gave up earlier, tried again)."""
        started = time.monotonic()
        result = DeliveryResult(delivery_id, destination, target, delivered=False)

        async def attempt_once() -> Attempt:
            attempt = await self._attempt(request, delivery_id)
            result.attempts.append(attempt)
            return attempt

        last: Attempt = await self._retrying(result, on_retry, single_attempt)(attempt_once)
        result.elapsed_s = time.monotonic() - started
        if last.ok:
            result.delivered = True
            log.info(
                "webhook %s delivered to %s (%s) on attempt %d: %s",
                delivery_id, destination, target, len(result.attempts), _outcome(last),
            )
            return result
        result.reason = result.reason or f"final answer {last.status}"
        log.error("webhook %s to %s (%s) not delivered: %s", delivery_id, destination, target, result.reason)
        return result
