"""Object-store access for a warehouse URI: the one place the standard AWS variables
(``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_SESSION_TOKEN``, ``AWS_REGION``, ``AWS_PROFILE``, and ``AWS_ALLOW_HTTP`` for a
loopback endpoint) become delta-rs ``storage_options`` and a pyarrow ``S3FileSystem``.

Local paths get ``None`` options and the local file system. Secrets are never logged:
``describe`` names the endpoint, region and where the credentials come from, nothing more.
``gs://``, ``az://`` and ``abfss://`` warehouses go to delta-rs with its own environment
variables (``GOOGLE_APPLICATION_CREDENTIALS``, ``AZURE_STORAGE_ACCOUNT_NAME`` and
``AZURE_STORAGE_ACCOUNT_KEY``...) and to pyarrow's ``FileSystem.from_uri``, which reads the
same; only S3 is tested here (against a real S3 server on loopback).
"""

from __future__ import annotations

import functools
import os
from urllib.parse import urlparse

import pyarrow.fs as pafs

from log_tables.errors import StorageError
from log_tables.layout import is_local, local_path

S3_SCHEMES = ("s3", "s3a")
OBJECT_STORE_SCHEMES = (*S3_SCHEMES, "gs", "az", "abfs", "abfss")
"""Warehouse URI schemes lakelog accepts besides local paths."""
_ENV = ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
        "AWS_REGION", "AWS_PROFILE", "AWS_ALLOW_HTTP")


def scheme(uri: str) -> str:
    return "file" if is_local(uri) else urlparse(uri).scheme


def bucket(uri: str) -> str:
    return urlparse(uri).netloc


def _env() -> tuple[tuple[str, str], ...]:
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    found = {name: os.environ[name] for name in _ENV if os.environ.get(name)}
    if region:
        found["AWS_REGION"] = region
    return tuple(sorted(found.items()))


def object_store_env(uri: str) -> tuple[tuple[str, str], ...]:
    """This process's AWS settings for ``uri`` as plain pairs, for a Spark task to use
    (an executor's environment need not hold them); () for a local path."""
    return () if scheme(uri) not in S3_SCHEMES else _env()


def adopt_env(env: tuple[tuple[str, str], ...]) -> None:
    """Make ``env`` (``object_store_env`` of another process) this process's AWS settings:
    a Spark worker reading for a driver whose environment held them."""
    for name, value in env:
        if os.environ.get(name) != value:
            os.environ[name] = value


def storage_options(uri: str) -> dict[str, str] | None:
    """delta-rs ``storage_options`` for ``uri`` (None: local, or delta-rs's own defaults)."""
    if scheme(uri) not in S3_SCHEMES:
        return None
    return dict(_env())


@functools.lru_cache(maxsize=8)
def _s3(env: tuple[tuple[str, str], ...]) -> pafs.S3FileSystem:
    opts = dict(env)
    endpoint = opts.get("AWS_ENDPOINT_URL")
    kwargs: dict[str, object] = {"region": opts.get("AWS_REGION", "us-east-1")}
    if endpoint:
        parsed = urlparse(endpoint)
        kwargs["endpoint_override"] = parsed.netloc or endpoint
        kwargs["scheme"] = parsed.scheme or "https"
    if "AWS_ACCESS_KEY_ID" in opts:
        kwargs["access_key"] = opts["AWS_ACCESS_KEY_ID"]
        kwargs["secret_key"] = opts.get("AWS_SECRET_ACCESS_KEY", "")
        if "AWS_SESSION_TOKEN" in opts:
            kwargs["session_token"] = opts["AWS_SESSION_TOKEN"]
    # Bounded waits: a warehouse that does not answer fails a request, not the process.
    return pafs.S3FileSystem(connect_timeout=10, request_timeout=60, **kwargs)


def filesystem(uri: str, env: tuple[tuple[str, str], ...] | None = None
               ) -> tuple[pafs.FileSystem, str]:
    """A pyarrow file system and the path on it of ``uri`` (a file, a table, a bucket);
    ``env``: the AWS settings to use instead of this process's (``object_store_env``)."""
    kind = scheme(uri)
    if kind == "file":
        return pafs.LocalFileSystem(), local_path(uri)
    if kind in S3_SCHEMES:
        parsed = urlparse(uri)
        return _s3(_env() if env is None else env), f"{parsed.netloc}{parsed.path}".rstrip("/")
    if kind in OBJECT_STORE_SCHEMES:
        try:
            fs, path = pafs.FileSystem.from_uri(uri)
        except (OSError, ValueError) as exc:
            raise StorageError(f"{uri}: cannot open the object store: {_short(exc)}") from None
        return fs, path.rstrip("/")
    raise StorageError(f"{uri}: lakelog's warehouse must be a local path or one of "
                       f"{', '.join(s + '://' for s in OBJECT_STORE_SCHEMES)}, not {kind}://")


def describe(uri: str) -> str:
    """Where ``uri`` is, for logs: endpoint, region and credential source, no secret."""
    if is_local(uri):
        return uri
    opts = dict(_env())
    creds = ("AWS_ACCESS_KEY_ID" if "AWS_ACCESS_KEY_ID" in opts else
             f"profile {opts['AWS_PROFILE']}" if "AWS_PROFILE" in opts else "none found")
    return (f"{uri} (endpoint {opts.get('AWS_ENDPOINT_URL', 'AWS')}, region "
            f"{opts.get('AWS_REGION', 'default')}, credentials: {creds})")


def check_warehouse(uri: str) -> None:
    """At start: refuse an object-store warehouse whose bucket cannot be reached with the
    credentials at hand, with one error naming the bucket (not a failure per request later).

    Only ``s3://`` is checked; credentials must come from the environment or a profile
    (instance roles are not looked for: that lookup can hang for seconds off AWS)."""
    if scheme(uri) not in S3_SCHEMES:
        return
    name = bucket(uri)
    opts = dict(_env())
    if "AWS_ACCESS_KEY_ID" not in opts and "AWS_PROFILE" not in opts:
        raise StorageError(
            f"warehouse {uri}: no credentials for bucket {name!r}: set AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY (or AWS_PROFILE), and AWS_ENDPOINT_URL for a store "
            "that is not AWS")
    fs, _ = filesystem(uri)
    try:
        info = fs.get_file_info(name)
    except OSError as exc:
        raise StorageError(
            f"warehouse {uri}: cannot reach bucket {name!r} with the credentials at hand "
            f"({describe(uri)}): {_short(exc)}") from None
    if info.type == pafs.FileType.NotFound:
        raise StorageError(f"warehouse {uri}: bucket {name!r} does not exist "
                           f"({describe(uri)})")


def _short(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300]


def delete_files(uris: list[str]) -> None:
    """Best-effort delete (files that no commit references): a failure leaves them for vacuum."""
    for uri in uris:
        try:
            fs, path = filesystem(uri)
            fs.delete_file(path)
        except (OSError, StorageError):
            pass
