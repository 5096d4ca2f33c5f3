"""The root command: its options, the options its commands share, and the server they call."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NamedTuple

import typer

from lakelog import __version__
from lakelog.cli.help import LakelogGroup
from log_tables.errors import LakelogError

if TYPE_CHECKING:
    from collections.abc import Iterable

    import httpx

    from lakelog.client import AdminClient
    from lakelog.profile import ApiKey

app = typer.Typer(help="lakelog: a Kafka-style event log stored in Delta Lake tables.",
                  no_args_is_help=True, add_completion=False, cls=LakelogGroup)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"lakelog {__version__}")
        raise typer.Exit()


DEFAULT_RETRY_TIMEOUT_MS = 30_000


@dataclass(slots=True)
class Options:
    """The root command's options, for every command that calls the server."""

    api_key: str | None = None
    retry_timeout_ms: int = DEFAULT_RETRY_TIMEOUT_MS
    wait_for_server: bool = False
    """--retry-timeout-ms was given: wait that long for a server nothing answers at yet."""


options = Options()


@app.callback()
def main_options(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
    api_key: Annotated[str | None, typer.Option(
        help="API key '<key id>:<secret>' for commands that call the server. Else "
             "LAKELOG_API_KEY, else api_key in the profile ($XDG_CONFIG_HOME/lakelog/"
             "config.toml, for its url), else the admin key in "
             "$LAKELOG_DATA_DIR/security/admin.key (a server on this machine).")] = None,
    retry_timeout_ms: Annotated[int | None, typer.Option(
        envvar="LAKELOG_RETRY_TIMEOUT_MS", show_envvar=False, min=0, show_default=False,
        help="How long a command keeps trying a server it cannot reach (a restart takes "
             "seconds) before it gives up [LAKELOG_RETRY_TIMEOUT_MS; default 30000]. "
             "Without it, a command whose server refuses every connection for its first "
             "1.2 s says at once that no server runs there; with it, the command waits "
             "for one that is starting.")
    ] = None,
) -> None:
    """lakelog: a Kafka-style event log stored in Delta Lake tables."""
    options.api_key = api_key
    options.retry_timeout_ms = DEFAULT_RETRY_TIMEOUT_MS if retry_timeout_ms is None \
        else retry_timeout_ms
    options.wait_for_server = retry_timeout_ms is not None


DataDir = Annotated[Path, typer.Option(help="Data directory [LAKELOG_DATA_DIR].",
                                       envvar="LAKELOG_DATA_DIR")]
Warehouse = Annotated[str | None, typer.Option(help="Delta warehouse [LAKELOG_WAREHOUSE]; "
                                               "default <data-dir>/warehouse.",
                                               envvar="LAKELOG_WAREHOUSE")]
Master = Annotated[str | None, typer.Option("--master", help="Spark master (default local[*]).",
                                            envvar="LAKELOG_SPARK_MASTER")]

Url = Annotated[str | None, typer.Option(
    "--url", "--bootstrap-server", envvar="LAKELOG_URL", show_envvar=False, show_default=False,
    help="The server: http(s)://host:port, or host:port as Kafka's --bootstrap-server takes "
         "it; several brokers of a cluster separated by commas (any live one answers) "
         "[LAKELOG_URL; else url in the profile; else http://127.0.0.1:8080].")]
DEFAULT_URL = None


class Server(NamedTuple):
    url: str
    key: ApiKey


def server(url: str | None) -> Server:
    """The server to call (flag > LAKELOG_URL > profile > default) and its API key
    (--api-key > LAKELOG_API_KEY > profile > local admin key file)."""
    from lakelog.client import http_auth
    from lakelog.profile import find_api_key, resolve_url

    resolved = resolve_url(url)
    if not options.wait_for_server:
        refused_everywhere(resolved)
    found = find_api_key(resolved, options.api_key, "--api-key")
    try:
        http_auth(found.key)
    except ValueError as exc:
        raise LakelogError(f"bad API key from {found.source}: {exc}") from None
    return Server(resolved, found)


REFUSED_FOR_S = 1.2
"""How long every broker given may refuse connections before a command says nothing runs
there (instead of retrying for --retry-timeout-ms, which is for a server restarting)."""


def refused_everywhere(url: str, for_s: float = REFUSED_FOR_S) -> None:
    """Raise if every broker of ``url`` refused every TCP connection for ``for_s``: nothing
    listens there. Any other outcome (a connection, a timeout, a name that does not
    resolve) is left to the client's retries and their messages."""
    import socket

    import httpx

    from lakelog.client.bootstrap import bootstrap_urls

    urls = bootstrap_urls(url)
    addresses = []
    for u in urls:
        parsed = httpx.URL(u)
        if _proxied(parsed):
            return  # a proxy carries the requests: a refused direct connection says nothing
        addresses.append((parsed.host, parsed.port or (443 if parsed.scheme == "https" else 80)))
    deadline = time.monotonic() + for_s
    while True:
        for address in addresses:
            try:
                socket.create_connection(address, timeout=min(1.0, for_s)).close()
                return
            except ConnectionRefusedError:
                continue
            except OSError:
                return  # not a plain refusal: the client's retries say what it is
        if time.monotonic() >= deadline:
            break
        time.sleep(0.2)
    where = ", ".join(urls)
    raise LakelogError(
        f"no server at {where}: every connection was refused for {for_s:g} s. Start one "
        "with `lakelog serve` (a cluster: `lakelog cluster up`), or name the server with "
        "--url or LAKELOG_URL")


def _proxied(url: httpx.URL) -> bool:
    import urllib.request

    proxies = urllib.request.getproxies()
    return url.scheme in proxies and not urllib.request.proxy_bypass(url.host)


def retry_setting() -> str:
    return f"--retry-timeout-ms={options.retry_timeout_ms} (LAKELOG_RETRY_TIMEOUT_MS)"


def client_error(exc: Exception, to: Server, what: str = "") -> LakelogError:
    """A client's error as one line; a 401 says where the key was looked for."""
    from lakelog.client import LakelogClientError
    from lakelog.profile import auth_hint

    if not isinstance(exc, LakelogClientError):
        return LakelogError(f"{what}{exc}")
    if exc.status == 0:  # no answer: the message says what was tried
        setting = "" if "--retry-timeout-ms" in exc.message else (
            f" [the wait is --retry-timeout-ms={options.retry_timeout_ms} "
            "(LAKELOG_RETRY_TIMEOUT_MS)]")
        return LakelogError(f"{what}{exc.message}{setting}")
    hint = f"; {auth_hint(to.key)}" if exc.status == 401 else ""
    return LakelogError(f"{what}{exc.status}: {exc.message}{hint}")


def admin(url: str | None) -> AdminClient:
    """The admin client of the server (see ``server``): each call is retried while the server
    cannot be reached (a GET after any failure, other methods only when they surely never
    arrived) for --retry-timeout-ms, one attempt may take a minute (a slow answer is not an
    unreachable server), and an error answer becomes a one-line LakelogError."""
    from lakelog.client import AdminClient, LakelogClientError

    to = server(url)

    class CliAdmin(AdminClient):
        def request(self, method: str, path: str, body: object | None = None,
                    ok: Iterable[int] = (200,)) -> Any:
            try:
                return super().request(method, path, body, ok)
            except LakelogClientError as exc:
                raise client_error(exc, to) from None

    return CliAdmin(to.url, api_key=to.key.key, request_timeout_ms=60_000,
                    default_api_timeout_ms=options.retry_timeout_ms,
                    deadline_setting=retry_setting())
