"""Where the CLI and the client find the server and an API key.

The profile is ``$XDG_CONFIG_HOME/lakelog/config.toml`` (``~/.config/lakelog/config.toml``
when ``XDG_CONFIG_HOME`` is unset), for example::

    url = "https://lakelog.example.com:8443"
    api_key = "llk_0123456789abcdef:secret"

An API key is taken from, in order: the ``--api-key`` flag (``api_key=`` in Python),
``LAKELOG_API_KEY``, the profile (sent only to the profile's ``url``), and for a server
on this machine only, the admin key a local server wrote in
``$LAKELOG_DATA_DIR/security/admin.key`` (``./lakelog-data`` by default). The url: the
``--url``/``--bootstrap-server`` flag, ``LAKELOG_URL``, the profile, then
``http://127.0.0.1:8080``.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import httpx

from ingest_api.addresses import is_loopback
from log_tables.errors import LakelogError

DEFAULT_URL = "http://127.0.0.1:8080"
PROFILE_KEYS = ("url", "api_key")


def profile_path() -> Path:
    """``$XDG_CONFIG_HOME/lakelog/config.toml``; a relative XDG_CONFIG_HOME is ignored, as
    the XDG spec says."""
    base = os.environ.get("XDG_CONFIG_HOME", "")
    root = Path(base) if base and Path(base).is_absolute() else Path.home() / ".config"
    return root / "lakelog" / "config.toml"


@dataclass(frozen=True, slots=True)
class Profile:
    path: Path
    found: bool
    url: str | None = None
    api_key: str | None = None


def load_profile() -> Profile:
    """The profile (``found`` False when there is no file); a bad file is a clear error."""
    path = profile_path()
    try:
        text = path.read_text()
    except FileNotFoundError:
        return Profile(path, False)
    except OSError as exc:
        raise LakelogError(f"cannot read the profile {path}: {exc.strerror}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise LakelogError(f"the profile {path} is not valid TOML: {exc}") from None
    unknown = sorted(set(data) - set(PROFILE_KEYS))
    if unknown:
        raise LakelogError(f"the profile {path} has unknown key(s) {', '.join(unknown)}; "
                           f"it may hold {' and '.join(PROFILE_KEYS)}")
    for name in PROFILE_KEYS:
        if name in data and not isinstance(data[name], str):
            raise LakelogError(f"the profile {path}: {name} must be a string")
    url = data.get("url")
    return Profile(path, True, normalize_url(url) if url else None, data.get("api_key") or None)


def normalize_url(url: str) -> str:
    """A server address as given (``host:port`` as Kafka's ``--bootstrap-server`` takes it,
    or a full URL) as a base URL without a trailing slash; several, separated by commas
    (brokers of one cluster, Kafka's ``bootstrap.servers``), each so, joined by commas."""
    if "," in url:
        parts = [normalize_url(part) for part in url.split(",") if part.strip()]
        if not parts:
            raise LakelogError(f"{url!r} names no server: give host:port")
        return ",".join(dict.fromkeys(parts))
    given = url.strip()
    url = given if "://" in given else "http://" + given
    why = ""
    try:
        parsed: httpx.URL | None = httpx.URL(url)
    except httpx.InvalidURL as exc:
        parsed, why = None, f" ({exc})"
    if parsed is None or parsed.scheme not in ("http", "https") or not parsed.host:
        raise LakelogError(f"{given!r} is not a server address{why}: give host:port or "
                           "http(s)://host:port")
    return url.rstrip("/")


def resolve_url(flag: str | None) -> str:
    """The server to call: the flag (or LAKELOG_URL, which the CLI reads into it), else the
    profile's url, else the default."""
    if flag:
        return normalize_url(flag)
    if env := os.environ.get("LAKELOG_URL"):
        return normalize_url(env)
    return load_profile().url or DEFAULT_URL


def same_server(a: str, b: str) -> bool:
    ua, ub = httpx.URL(normalize_url(a)), httpx.URL(normalize_url(b))
    default = {"http": 80, "https": 443}
    return (ua.scheme, ua.host, ua.port or default[ua.scheme]) == (
        ub.scheme, ub.host, ub.port or default[ub.scheme])


class ApiKey(NamedTuple):
    """The key found (None: none), where it came from, and every place looked at."""

    key: str | None
    source: str
    looked: tuple[str, ...]


def admin_key_path() -> Path:
    return Path(os.environ.get("LAKELOG_DATA_DIR", "lakelog-data")) / "security" / "admin.key"


def find_api_key(url: str, given: str | None = None, given_as: str = "api_key") -> ApiKey:
    """The API key for ``url``, in the order the module docstring gives. For several
    brokers (separated by commas), the key every one of them gets; none when they differ
    (a key is never sent to a broker it was not found for)."""
    if given:
        return ApiKey(given, given_as, (given_as,))
    if "," in url:
        found = [find_api_key(u) for u in url.split(",") if u.strip()]
        if len({f.key for f in found}) == 1:
            return found[0]
        seen = tuple(dict.fromkeys(x for f in found for x in f.looked))
        return ApiKey(None, "", (*seen, f"(the brokers of {url} would get different keys: "
                                        "give one)"))
    looked = [given_as, "LAKELOG_API_KEY"]
    if env := os.environ.get("LAKELOG_API_KEY"):
        return ApiKey(env, "LAKELOG_API_KEY", tuple(looked))
    profile = load_profile()
    if profile.api_key and same_server(profile.url or DEFAULT_URL, url):
        return ApiKey(profile.api_key, str(profile.path), (*looked, str(profile.path)))
    looked.append(f"{profile.path} (" + (
        "no such file" if not profile.found else "no api_key in it" if not profile.api_key
        else f"its key is for {profile.url or DEFAULT_URL}") + ")")
    path = admin_key_path().absolute()
    if not is_loopback(httpx.URL(url).host):
        looked.append(f"{path} (not used: the server is not on this machine)")
        return ApiKey(None, "", tuple(looked))
    try:
        key = path.read_text().strip()
    except FileNotFoundError:
        looked.append(f"{path} (no such file; LAKELOG_DATA_DIR names the data directory)")
    except OSError as exc:
        looked.append(f"{path} ({exc.strerror})")
    else:
        if key:
            return ApiKey(key, str(path), (*looked, str(path)))
        looked.append(f"{path} (empty)")
    return ApiKey(None, "", tuple(looked))


def auth_hint(found: ApiKey) -> str:
    """What to tell a user whose call was answered 401."""
    if found.key is not None:
        return f"the API key from {found.source} was refused"
    return ("no API key was found; looked at " + ", ".join(found.looked) + ". Give one with "
            "--api-key KEY_ID:SECRET or LAKELOG_API_KEY, put api_key (and url) in "
            f"{profile_path()}, or set LAKELOG_DATA_DIR to the local server's data directory")
