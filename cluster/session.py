"""The broker's ZooKeeper session, and the lease that fences a broker that lost it.

ZooKeeper ends a session when it has heard nothing from the client for the session
timeout; only then are the broker's ephemeral nodes removed, and only then can the
controller give its partitions to another broker. So a broker may act as a leader while
it knows it was heard recently: a heartbeat thread asks ZooKeeper something every
``timeout / 6`` and each answer renews a lease from the moment the question was sent
(the server cannot have ended the session before it answered). A broker whose lease
ran out (its heartbeats went unanswered, or the whole process was paused with SIGSTOP)
refuses to append or acknowledge until a heartbeat is answered again, well before
ZooKeeper could have ended the session and the controller moved the partitions.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (
    ConnectionDropped,
    ConnectionLoss,
    KazooException,
    OperationTimeoutError,
    SessionExpiredError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.retry import KazooRetry

from log_tables.errors import LakelogError

log = logging.getLogger(__name__)

LEASE_FRACTION = 0.5  # of the session timeout: the margin covers clock rates and a slow append

UNREACHABLE = (ConnectionLoss, ConnectionDropped, SessionExpiredError, OperationTimeoutError,
               KazooTimeoutError)
"""What kazoo raises when ZooKeeper is out of reach or the session ended (ZooKeeper
restarting, this broker paused or cut off): passing, so the caller may try again."""


@contextlib.contextmanager
def unreachable_as(error: type[LakelogError], what: str) -> Iterator[None]:
    """ZooKeeper out of reach during ``what``: a retriable ``error`` saying so, instead of
    kazoo's exception (which a request would answer as a 500)."""
    try:
        yield
    except UNREACHABLE as exc:
        raise error(f"{what}: ZooKeeper is out of reach ({type(exc).__name__}); "
                    f"try again") from None


class ZkSession:
    """A KazooClient that reconnects forever, with a lease and a callback per new session
    (the broker re-registers and the controller election runs again)."""

    def __init__(self, connect: str, session_timeout_ms: int,
                 on_new_session: Callable[[], None] | None = None) -> None:
        self.connect = connect
        self.session_timeout_s = session_timeout_ms / 1000
        self.client = KazooClient(
            hosts=connect, timeout=self.session_timeout_s,
            connection_retry=KazooRetry(max_tries=-1, max_delay=1.0),
            command_retry=KazooRetry(max_tries=3, max_delay=1.0))
        self.on_new_session = on_new_session
        self.on_lease_change: Callable[[bool], None] | None = None
        """Called (on the heartbeat thread) when the lease is lost or held again."""
        self._lease_from = float("-inf")
        self._session_id: int | None = None
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._heartbeat, name="zk-heartbeat",
                                        daemon=True)
        self.client.add_listener(self._state_changed)

    def start(self, timeout_s: float = 30) -> None:
        hosts, _, chroot = self.connect.partition("/")
        try:
            if chroot.strip("/"):  # the chroot node must exist before a client can use it
                root = KazooClient(hosts=hosts, timeout=self.session_timeout_s)
                root.start(timeout=timeout_s)
                try:
                    root.ensure_path("/" + chroot.strip("/"))
                finally:
                    root.stop()
                    root.close()
            self.client.start(timeout=timeout_s)
        except KazooTimeoutError:
            self.client.stop()
            raise ConnectionError(f"ZooKeeper at {self.connect} did not answer within "
                                  f"{timeout_s:g}s; is it running?") from None
        for path in ("/brokers/ids", "/brokers/topics", "/lakelog"):
            self.client.ensure_path(path)
        self._session_id = self.client.client_id[0] if self.client.client_id else None
        self._renew()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(5)
        self.client.stop()
        self.client.close()

    @property
    def has_lease(self) -> bool:
        """Whether ZooKeeper surely still holds this broker's session (so that no other
        broker can have been given its partitions)."""
        return time.monotonic() - self._lease_from < self.session_timeout_s * LEASE_FRACTION

    def lease_left_s(self) -> float:
        return self._lease_from + self.session_timeout_s * LEASE_FRACTION - time.monotonic()

    def _renew(self) -> bool:
        if self.client.state != KazooState.CONNECTED:
            return False
        sent = time.monotonic()
        try:
            self.client.exists("/brokers")
        except (KazooException, KazooTimeoutError):
            return False
        if self.client.state != KazooState.CONNECTED:
            return False
        ident = self.client.client_id[0] if self.client.client_id else None
        if ident != self._session_id:
            return False  # a new session: the callback re-registers, then it renews
        self._lease_from = max(self._lease_from, sent)
        return True

    def _heartbeat(self) -> None:
        every = self.session_timeout_s / 6
        held = self.has_lease
        while not self._stop.is_set():
            self._renew()
            if self.has_lease != held:
                held = not held
                if self.on_lease_change is not None:
                    try:
                        self.on_lease_change(held)
                    except Exception:
                        log.exception("acting on the ZooKeeper lease's change failed")
            self._wake.wait(min(every, max(0.05, self.lease_left_s())) if held else every)
            self._wake.clear()

    def _state_changed(self, state: str) -> None:
        # Called on kazoo's event thread: never block here.
        if state == KazooState.SUSPENDED:
            # The session may well live on (ZooKeeper restarting, a blip): the lease runs
            # out on its own time, which is before ZooKeeper could end the session.
            log.warning("ZooKeeper connection lost; this broker leads for at most %.1fs "
                        "more unless it is back", max(0.0, self.lease_left_s()))
            return
        if state != KazooState.CONNECTED:
            self._lease_from = float("-inf")
            log.warning("ZooKeeper session %s: this broker stops leading until it is "
                        "registered again", state.lower())
            return
        ident = self.client.client_id[0] if self.client.client_id else None
        if ident != self._session_id and self._session_id is not None:
            log.warning("ZooKeeper session expired; a new session: registering again")
            threading.Thread(target=self._new_session, args=(ident,), name="zk-new-session",
                             daemon=True).start()
        else:
            self._wake.set()

    def _new_session(self, ident: int | None) -> None:
        try:
            if self.on_new_session is not None:
                self.on_new_session()
        except Exception:
            log.exception("re-registering with ZooKeeper after a new session failed")
            return
        self._session_id = ident
        self._renew()
