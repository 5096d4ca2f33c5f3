"""The Kafka listener: an asyncio server on the broker's event loop, one task per
connection reading size-prefixed requests and answering each in order (Kafka's
clients pipeline requests and match answers by correlation id, in order).

Bounds: requests being read and answered hold at most ``max_in_flight_bytes`` together
(a connection waits to read its next request until there is room: TCP holds the client
back, as Kafka's brokers mute a channel when their memory pool is spent); at most
``max_connections`` connections (more are closed at once); a connection idle for
``IDLE_S`` is closed (Kafka's ``connections.max.idle.ms``).

A request larger than ``max_request_bytes`` closes the connection (the size says where
the next request starts: there is nothing else to answer). An ApiVersions request of a
version the listener does not serve is answered in version 0 with
UNSUPPORTED_VERSION and the versions served (KIP-511), as Kafka does; any other API or
version not served is logged and the connection closed, as Kafka's brokers do.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from ingest_api.broker.core import Broker
from ingest_api.kafka.handlers import (
    API_VERSIONS,
    SUPPORTED,
    UNSUPPORTED_VERSION,
    CloseConnection,
    Handlers,
    api_versions_answer,
)
from ingest_api.kafka.messages import peek, read_request, write_response

log = logging.getLogger(__name__)
IDLE_S = 600.0


class KafkaListener:
    """Serves Kafka's protocol for ``broker`` on ``host:port`` (0: a free port, in
    ``port`` once started), advertising ``advertised`` (host) in Metadata."""

    def __init__(self, broker: Broker, host: str, port: int, advertised: str,
                 max_request_bytes: int, max_in_flight_bytes: int = 256 << 20,
                 max_connections: int = 4096) -> None:
        self.broker = broker
        self.host, self.port, self.advertised = host, port, advertised
        self.max_request_bytes = max_request_bytes
        self.max_in_flight_bytes = max_in_flight_bytes
        self.max_connections = max_connections
        self.in_flight = 0
        self.room = asyncio.Condition()
        self.server: asyncio.Server | None = None
        self.connections: set[asyncio.Task[None]] = set()
        self.handlers: Handlers | None = None

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._connection, self.host, self.port)
        self.port = self.server.sockets[0].getsockname()[1]
        node = self.broker.settings.broker_id or 1
        self.handlers = Handlers(self.broker, (node, self.advertised, self.port))
        log.info("Kafka listener on %s:%d", self.host, self.port)

    async def stop(self) -> None:
        if self.server is None:
            return
        self.server.close()
        for task in list(self.connections):
            task.cancel()
        for task in list(self.connections):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.server.wait_closed(), 5)
        self.server = None

    async def _connection(self, reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        if len(self.connections) >= self.max_connections:
            log.warning("Kafka connection from %s refused: %d open already",
                        writer.get_extra_info("peername"), len(self.connections))
            writer.close()
            return
        self.connections.add(task)
        try:
            while True:
                head = await asyncio.wait_for(reader.readexactly(4), IDLE_S)
                size = int.from_bytes(head, "big", signed=True)
                if not 8 <= size <= self.max_request_bytes:
                    log.warning("Kafka request of %d bytes from %s: closing",
                                size, writer.get_extra_info("peername"))
                    return
                await self._reserve(size)
                try:
                    answer = await self._answer(await reader.readexactly(size))
                    if answer is not None:
                        writer.write(len(answer).to_bytes(4, "big") + answer)
                        await writer.drain()
                finally:
                    await self._release(size)
        except (asyncio.IncompleteReadError, ConnectionError, TimeoutError):
            pass
        except (_Close, CloseConnection) as exc:
            log.warning("Kafka connection from %s closed: %s",
                        writer.get_extra_info("peername"), exc)
        except Exception:  # a defect: the client sees a closed connection and retries
            log.exception("Kafka connection from %s failed",
                          writer.get_extra_info("peername"))
        finally:
            self.connections.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _reserve(self, nbytes: int) -> None:
        async with self.room:
            await self.room.wait_for(lambda: not self.in_flight or
                                     self.in_flight + nbytes <= self.max_in_flight_bytes)
            self.in_flight += nbytes

    async def _release(self, nbytes: int) -> None:
        async with self.room:
            self.in_flight -= nbytes
            self.room.notify_all()

    async def _answer(self, frame: bytes) -> bytes | None:
        api_key, version, correlation_id = peek(frame)
        served = SUPPORTED.get(api_key)
        if served is None or not served[0] <= version <= served[1]:
            if api_key == API_VERSIONS:
                return write_response(API_VERSIONS, 0, correlation_id,
                                      api_versions_answer(UNSUPPORTED_VERSION))
            raise _Close(f"API {api_key} version {version} is not served")
        try:
            request = read_request(frame)
        except Exception as exc:
            raise _Close(f"API {api_key} v{version}: the request does not decode: {exc}") \
                from None
        assert self.handlers is not None
        values = await self.handlers.by_key[api_key](request.body, version)
        if values is None:
            return None  # (acks=0: no answer)
        return write_response(api_key, version, correlation_id, values)


class _Close(Exception):
    """The connection is closed: the request cannot be answered."""
