"""A small Spark Connect client for ``lakelog sql``: one ExecutePlan call, Arrow back.

PySpark's own client (``SparkSession.builder.remote``) is what users' programs use; a
command line that must answer in under a second cannot afford it: importing it imports
pandas (0.4 s here) and opening a session costs round trips of its own. This sends the
query as one SQL relation under a limit and reads the Arrow batches of the answer, with
Spark Connect's generated protobuf classes (loaded without PySpark's package
initializers, which import pandas) and grpc.
"""

from __future__ import annotations

import contextlib
import getpass
import importlib
import importlib.util
import os
import sys
import types
import uuid
from typing import Any
from urllib.parse import unquote

import grpc
import pyarrow as pa

from log_tables.errors import EndpointUnavailableError, LakelogError

EXECUTE = "/spark.connect.SparkConnectService/ExecutePlan"
RELEASE = "/spark.connect.SparkConnectService/ReleaseSession"
_PACKAGES = ("pyspark", "pyspark.sql", "pyspark.sql.connect")


def protos() -> Any:
    """``pyspark.sql.connect.proto.base_pb2``, importing no more of PySpark than it needs:
    the packages above it are stand-ins while it loads, then taken out again (so a later
    ``import pyspark`` is the real one)."""
    loaded = sys.modules.get("pyspark.sql.connect.proto.base_pb2")
    if loaded is not None:
        return loaded
    spec = importlib.util.find_spec("pyspark")
    assert spec is not None and spec.origin is not None
    root = os.path.dirname(spec.origin)
    standing_in = []
    for name in _PACKAGES:
        if name not in sys.modules:
            package = types.ModuleType(name)
            package.__path__ = [os.path.join(root, *name.split(".")[1:])]
            sys.modules[name] = package
            standing_in.append(name)
    try:
        return importlib.import_module("pyspark.sql.connect.proto.base_pb2")
    finally:
        for name in standing_in:
            del sys.modules[name]


def parse_url(url: str) -> tuple[str, dict[str, str]]:
    """(host:port, parameters) of ``sc://host:port/;name=value;...``."""
    if not url.startswith("sc://"):
        raise LakelogError(f"a Spark Connect URL starts with sc:// (got {url!r})")
    address, _, rest = url[5:].partition("/")
    params = dict(unquote(p).split("=", 1) for p in rest.split(";") if "=" in p)
    if ":" not in address.rsplit("]", 1)[-1]:
        address += ":15002"
    return address, params


def channel(url: str) -> tuple[grpc.Channel, dict[str, str]]:
    """A channel as PySpark's client makes one: a token travels over local credentials
    to ``localhost``, else over TLS; without one, plain (loopback, auth off)."""
    address, params = parse_url(url)
    token = params.get("token")
    host = address.rsplit(":", 1)[0]
    if token is None and params.get("use_ssl", "").lower() != "true":
        return grpc.insecure_channel(address), params
    if host == "localhost" and params.get("use_ssl", "").lower() != "true":
        creds = grpc.local_channel_credentials()
    else:
        creds = grpc.ssl_channel_credentials()
    if token is not None:
        creds = grpc.composite_channel_credentials(
            creds, grpc.access_token_call_credentials(token))
    return grpc.secure_channel(address, creds), params


def query(url: str, sql: str, limit: int, timeout_s: float | None = None,
          session_id: str | None = None) -> pa.Table:
    """The first ``limit`` rows of ``sql`` on the endpoint at ``url``.

    Every call of one user to one endpoint uses the same Spark Connect session (its id
    derived from both), so the views the endpoint registered for earlier calls are
    reused where their data did not change. A session the endpoint has closed (idle
    too long) cannot be taken up again: then a new one is used, and released.
    ``session_id``: that session instead (no other is tried)."""
    pb = protos()
    user, stable = stable_session(url)
    if session_id is not None:
        return _query(pb, url, user, session_id, sql, limit, timeout_s, release_after=False)
    try:
        return _query(pb, url, user, stable, sql, limit, timeout_s, release_after=False)
    except _SessionClosed:
        return _query(pb, url, user, str(uuid.uuid4()), sql, limit, timeout_s,
                      release_after=True)


def stable_session(url: str) -> tuple[str, str]:
    """(user id, session id) of this user's calls to the endpoint at ``url``."""
    address, params = parse_url(url)
    user = params.get("user_id") or getpass.getuser()
    return user, str(uuid.uuid5(uuid.NAMESPACE_URL, f"lakelog-sql:{user}@{address}"))


def release(url: str, user_id: str, session_id: str) -> None:
    """Close a session on the endpoint (its views and temporary state go with it)."""
    pb = protos()
    chan, _ = channel(url)
    call = chan.unary_unary(RELEASE, request_serializer=pb.ReleaseSessionRequest.SerializeToString,
                            response_deserializer=pb.ReleaseSessionResponse.FromString)
    try:
        with contextlib.suppress(grpc.RpcError):  # the endpoint closes idle ones itself
            call(pb.ReleaseSessionRequest(session_id=session_id,
                                          user_context=pb.UserContext(user_id=user_id)),
                 timeout=5)
    finally:
        chan.close()


class _SessionClosed(Exception):
    pass


EndpointUnavailable = EndpointUnavailableError  # its old name here (lakelog.sql)

UNANSWERED = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)


def _query(pb: Any, url: str, user_id: str, session_id: str, sql: str, limit: int,
           timeout_s: float | None, release_after: bool) -> pa.Table:
    chan, _ = channel(url)
    user = pb.UserContext(user_id=user_id)
    request = pb.ExecutePlanRequest(session_id=session_id, user_context=user,
                                    client_type="lakelog-sql")
    request.plan.root.limit.limit = limit
    request.plan.root.limit.input.sql.query = sql
    execute = chan.unary_stream(EXECUTE, request_serializer=pb.ExecutePlanRequest.SerializeToString,
                                response_deserializer=pb.ExecutePlanResponse.FromString)
    batches: list[pa.RecordBatch] = []
    schema: pa.Schema | None = None
    names: list[str] = []
    try:
        for response in execute(request, timeout=timeout_s):
            if response.HasField("arrow_batch"):
                reader = pa.ipc.open_stream(response.arrow_batch.data)
                schema = reader.schema
                batches.extend(reader)
            elif response.HasField("schema") and response.schema.HasField("struct"):
                names = [f.name for f in response.schema.struct.fields]
    except grpc.RpcError as exc:
        details = (exc.details() if isinstance(exc, grpc.Call) else None) or str(exc)
        if "SESSION_CLOSED" in details and not release_after:
            raise _SessionClosed from None
        if isinstance(exc, grpc.Call) and exc.code() in UNANSWERED:
            raise EndpointUnavailable(details.strip().splitlines()[0]) from None
        raise LakelogError(f"SQL failed: {details.strip().splitlines()[0]}") from None
    finally:
        chan.close()
        if release_after:
            release(url, user_id, session_id)
    if schema is None:
        return pa.table({n: pa.array([], pa.string()) for n in names})
    return pa.Table.from_batches(batches, schema)
