"""Where the CLI and the client find the server and the API key (no server needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lakelog.profile import find_api_key, load_profile, normalize_url, profile_path, resolve_url
from log_tables.errors import LakelogError


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("LAKELOG_DATA_DIR", str(tmp_path / "data"))
    for name in ("LAKELOG_API_KEY", "LAKELOG_URL"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def _profile(home: Path, text: str) -> Path:
    path = home / "xdg" / "lakelog" / "config.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_addresses_as_kafka_users_give_them() -> None:
    assert normalize_url("127.0.0.1:8080") == "http://127.0.0.1:8080"
    assert normalize_url(" https://h.example:8443/ ") == "https://h.example:8443"
    # Several brokers of a cluster, as Kafka's bootstrap.servers: each normalized, once.
    assert normalize_url("a:1, https://b:2/,a:1") == "http://a:1,https://b:2"
    for bad, why in ((",", "names no server"), ("ftp://x", "not a server address"),
                     ("h:port", "Invalid port"), ("a:1,ftp://x", "not a server address")):
        with pytest.raises(LakelogError, match=why):
            normalize_url(bad)


def test_a_local_key_goes_to_a_list_of_brokers_only_when_all_are_local(
        home: Path) -> None:
    (home / "data" / "security").mkdir(parents=True)
    (home / "data" / "security" / "admin.key").write_text("llk_1:file\n")
    assert find_api_key("http://127.0.0.1:1,http://127.0.0.2:2").key == "llk_1:file"
    mixed = find_api_key("http://127.0.0.1:1,https://remote.example:8443")
    assert mixed.key is None
    assert "different keys" in mixed.looked[-1]


def test_the_key_is_found_flag_then_environment_then_profile_then_key_file(
        home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = "http://127.0.0.1:8080"
    nothing = find_api_key(url, None, "--api-key")
    assert nothing.key is None
    assert nothing.looked[:2] == ("--api-key", "LAKELOG_API_KEY")
    assert "config.toml (no such file)" in nothing.looked[2]
    assert "admin.key (no such file" in nothing.looked[3]
    (home / "data" / "security").mkdir(parents=True)
    (home / "data" / "security" / "admin.key").write_text("llk_1:file\n")
    assert find_api_key(url).key == "llk_1:file"
    path = _profile(home, 'api_key = "llk_2:profile"\n')  # no url: the default server's
    assert find_api_key(url) == ("llk_2:profile", str(path), ("api_key", "LAKELOG_API_KEY",
                                                               str(path)))
    monkeypatch.setenv("LAKELOG_API_KEY", "llk_3:env")
    assert find_api_key(url).source == "LAKELOG_API_KEY"
    assert find_api_key(url, "llk_4:flag", "--api-key").key == "llk_4:flag"


def test_a_profile_key_goes_only_to_its_server(home: Path) -> None:
    _profile(home, 'url = "https://prod.example:8443"\napi_key = "llk_1:prod"\n')
    assert resolve_url(None) == "https://prod.example:8443"
    assert find_api_key("https://prod.example:8443/").key == "llk_1:prod"
    other = find_api_key("https://evil.example:8443")
    assert other.key is None and "its key is for https://prod.example:8443" in other.looked[2]
    assert "not used: the server is not on this machine" in other.looked[3]


def test_a_bad_profile_is_a_clear_error(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _profile(home, "url = [1]\n")
    with pytest.raises(LakelogError, match=f"the profile {path}: url must be a string"):
        load_profile()
    _profile(home, "url = \n")
    with pytest.raises(LakelogError, match="is not valid TOML"):
        load_profile()
    monkeypatch.setenv("XDG_CONFIG_HOME", "relative/dir")  # ignored, as the XDG spec says
    assert profile_path() == Path.home() / ".config" / "lakelog" / "config.toml"
