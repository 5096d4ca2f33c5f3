"""Retries as Kafka's clients make them.

A call is tried again after a failure that says nothing about the request itself: the
server could not be reached, the connection broke, or the answer said it is
``retriable`` (busy or unavailable: lakelog's body says so; a body that does not, e.g. a
proxy's, by its status, 429, 502, 503 or 504). Between attempts the client waits ``retry_backoff_ms``, doubling
up to ``retry_backoff_max_ms``, each wait jittered by 20 % (Kafka's
``retry.backoff.ms`` and ``retry.backoff.max.ms``). Each attempt is bounded by
``request_timeout_ms`` and all of them together by a deadline (the producer's
``delivery_timeout_ms``, the consumer's ``default_api_timeout_ms``); at most ``retries``
retries are made. When the deadline passes a ``LakelogTimeoutError`` names the server, the
call, the attempts and the last failure.

A request that must not run twice is retried only when it surely never reached the
server (the connection could not be made); after a broken connection its outcome is
unknown and ``LakelogConnectionError`` says so.
"""

from __future__ import annotations

import random
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from lakelog.client.errors import (
    LakelogClientError,
    LakelogConnectionError,
    LakelogTimeoutError,
    error_from,
)

MAX_RETRIES = 2**31 - 1  # Kafka's default: the deadline is the bound
MIN_ATTEMPT_S = 0.2


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Kafka's retry settings, in milliseconds."""

    retries: int = MAX_RETRIES
    retry_backoff_ms: float = 100
    retry_backoff_max_ms: float = 1000
    request_timeout_ms: float = 30_000

    def __post_init__(self) -> None:
        if self.retries < 0:
            raise ValueError("retries must be 0 or more")
        if self.retry_backoff_ms < 0 or self.retry_backoff_max_ms < self.retry_backoff_ms:
            raise ValueError("retry_backoff_ms must be 0 or more and at most retry_backoff_max_ms")
        if self.request_timeout_ms <= 0:
            raise ValueError("request_timeout_ms must be above 0")

    def backoff_s(self, attempt: int) -> float:
        """The wait before retry number ``attempt + 1``."""
        ms = min(self.retry_backoff_max_ms, self.retry_backoff_ms * 2 ** min(attempt, 30))
        return float(ms * random.uniform(0.8, 1.2) / 1000)


def resolve_request_timeout_ms(request_timeout_ms: float | None, timeout_s: float | None,
                       default: float) -> float:
    """``request_timeout_ms``, or the older ``timeout_s`` spelling (not both)."""
    if request_timeout_ms is not None and timeout_s is not None:
        raise ValueError("give request_timeout_ms or timeout_s (its older name), not both")
    if timeout_s is not None:
        return timeout_s * 1000
    return default if request_timeout_ms is None else request_timeout_ms


def never_sent(exc: httpx.TransportError) -> bool:
    """The request surely never reached the server: no connection was made."""
    return isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout)


def permanent(exc: httpx.TransportError) -> bool:
    """A failure that trying again cannot mend (a certificate the client does not trust)."""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, ssl.SSLCertVerificationError):
            return True
        cause = cause.__cause__ or cause.__context__
    return False


def describe(exc: BaseException) -> str:
    """A failure in a few words: the exception's kind and text."""
    text = str(exc) or type(exc).__name__
    return text if isinstance(exc, LakelogClientError) else f"{type(exc).__name__}: {text}"


class Attempts:
    """Counts attempts against ``retries`` and a deadline; waits the backoff between them."""

    def __init__(self, policy: RetryPolicy, deadline: float, what: str, url: str,
                 setting: str) -> None:
        self.policy = policy
        self.deadline = deadline
        self.what = what
        self.url = url
        self.setting = setting
        self.started = time.monotonic()
        self.made = 0
        self.last: BaseException | None = None

    def timeout_s(self) -> float:
        """The bound of the next attempt: ``request_timeout_ms`` within the deadline (a last
        attempt at the deadline still gets ``MIN_ATTEMPT_S``)."""
        left = self.deadline - time.monotonic()
        return max(MIN_ATTEMPT_S, min(self.policy.request_timeout_ms / 1000, left))

    def again(self, failure: BaseException) -> bool:
        """After a retriable failure: wait the backoff (cut at the deadline, where one last
        attempt is made) and say whether to try again."""
        wait_s = self.backoff(failure)
        if wait_s is None:
            return False
        time.sleep(wait_s)
        return True

    def backoff(self, failure: BaseException) -> float | None:
        """``again`` without the wait: how long to wait before the next attempt (None:
        give up), for a caller that waits otherwise (the producer's sender thread)."""
        self.last = failure
        self.made += 1
        left = self.deadline - time.monotonic()
        if self.made > self.policy.retries or left <= 0:
            return None
        return min(self.policy.backoff_s(self.made - 1), left)

    def gave_up(self) -> LakelogTimeoutError:
        took = time.monotonic() - self.started
        reason = (f"after {self.made} attempt(s) (retries={self.policy.retries})"
                  if self.made > self.policy.retries else
                  f"within {self.setting} ({took:.1f} s, {self.made} attempt(s))")
        return LakelogTimeoutError(
            f"gave up on {self.what} at {self.url} {reason}; last failure: "
            f"{describe(self.last) if self.last else 'none'}")


def call(send: Callable[[float], httpx.Response], attempts: Attempts, *,
         idempotent: bool) -> httpx.Response:
    """``send(timeout_s)`` until it gets an answer that is not a ``retriable`` error (an
    error answer is returned, not raised), retrying as the module docstring says."""
    while True:
        try:
            r = send(attempts.timeout_s())
        except httpx.TransportError as exc:
            if permanent(exc):
                raise LakelogConnectionError(
                    f"{attempts.what} at {attempts.url}: {describe(exc)}") from exc
            if not idempotent and not never_sent(exc):
                raise LakelogConnectionError(
                    f"{attempts.what} at {attempts.url}: the connection broke "
                    f"({describe(exc)}); whether it was done is unknown, so it was not "
                    "sent again") from exc
            if not attempts.again(exc):
                raise attempts.gave_up() from exc
            continue
        if r.status_code >= 400 and (error := error_from(r)).retriable:
            if attempts.again(error):
                continue
            raise attempts.gave_up()
        return r
