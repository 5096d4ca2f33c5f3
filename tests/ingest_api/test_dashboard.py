"""The dashboard (``/ui``), its sign-in, the request log and the new ``/metrics`` lines,
against one real ``lakelog serve`` with authentication on; the page itself in a real
headless Chromium (Debian's ``chromium``, driven by playwright), whose screenshot is
kept in ``test-artifacts/dashboard.png`` at the repository root."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ingest_api.http.auth import UI_COOKIE
from log_tables.cold import job_runs
from log_tables.layout import Layout
from tests.server import CLUSTER, ServerProcess

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM = Path("/usr/bin/chromium")
TOPIC, GROUP = "orders", "billing"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One server with authentication on, a request log and fast sampling; the job runs
    a job process would have written are in its ``_job_runs`` before anything reads it."""
    base = tmp_path_factory.mktemp("ui")
    srv = ServerProcess(base / "data", env={
        "LAKELOG_AUTH": "api-key", "LAKELOG_UI_SAMPLE_INTERVAL_MS": "250",
        "LAKELOG_ACCESS_LOG": str(base / "access.log")}).start()
    now = job_runs.now_ms()
    job_runs.record(Layout.of(srv.data_dir).warehouse, [
        job_runs.JobRun("tier", "run-1", TOPIC, p, now - 900, now - 400, job_runs.SUCCEEDED,
                        records_in=10, detail="tiered offsets 0..9") for p in (0, 1)])
    job_runs.record(Layout.of(srv.data_dir).warehouse, [
        job_runs.JobRun("compact", "run-2", TOPIC, 0, now - 300, now - 100, job_runs.FAILED,
                        error="OSError: disk full")])
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def admin_key(server: ServerProcess) -> str:
    return (server.data_dir / "security" / "admin.key").read_text().strip()


@pytest.fixture(scope="module")
def admin(server: ServerProcess, admin_key: str) -> Iterator[httpx.Client]:
    key_id, _, secret = admin_key.partition(":")
    with server.client(auth=(key_id, secret)) as c:
        yield c


def make_topic(admin: httpx.Client, name: str) -> str:
    r = admin.post("/topics", json={"topic_name": name, "partitions_count": 2})
    assert r.status_code == 201, r.text
    return name


@pytest.fixture(scope="module")
def topic(admin: httpx.Client) -> str:
    """The topic of the job runs and the HTTP tests."""
    return make_topic(admin, TOPIC)


def produce(admin: httpx.Client, topic: str, n: int, partition: int = 0) -> None:
    r = admin.post(f"/topics/{topic}/records:batch", json={"entries": [
        {"id": str(i), "partition_id": partition, "value": {"type": "STRING", "data": f"v{i}"}}
        for i in range(n)]})
    assert r.status_code == 207 and not r.json()["failures"], r.text


def commit(admin: httpx.Client, group: str, topic: str, offset: int) -> None:
    r = admin.post(f"/consumer-groups/{group}/offsets", json={"offsets": [
        {"topic_name": topic, "partition_id": 0, "offset": offset}]})
    assert r.status_code == 200, r.text


def data(server: ServerProcess, **kwargs: Any) -> httpx.Response:
    return httpx.get(server.url + "/ui/data", timeout=30, **kwargs)


def test_ui_sign_in_never_weakens_the_api(server: ServerProcess, admin: httpx.Client,
                                          admin_key: str, topic: str) -> None:
    page = httpx.get(server.url + "/ui")
    assert page.status_code == 200 and 'id="signin"' in page.text and topic not in page.text
    assert "script-src 'sha256-" in page.headers["content-security-policy"]
    assert httpx.get(server.url + "/").headers["location"] == "/ui"
    no_key = data(server)
    assert no_key.status_code == 401 and no_key.json()["error"] == "authentication_failed"
    assert "www-authenticate" not in no_key.headers  # a browser would pop up its own dialog
    key_id, _, secret = admin_key.partition(":")
    for wrong in (f"{key_id}:{secret}x", "llk_0000:nope", "not a key"):
        r = httpx.post(server.url + "/ui/login", json={"key": wrong})
        assert r.status_code == 401 and "unknown API key or wrong secret" in r.json()["message"]
        assert "set-cookie" not in r.headers and secret not in r.text
    form = httpx.post(server.url + "/ui/login", data={"key": admin_key})  # JSON only
    assert form.status_code == 415 and "set-cookie" not in form.headers
    assert data(server, cookies={UI_COOKIE: f"{key_id}.{secret}x"}).status_code == 401

    signed = httpx.post(server.url + "/ui/login", json={"key": admin_key})
    assert signed.status_code == 200 and signed.json() == {"principal": "admin"}
    cookie = signed.headers["set-cookie"]
    assert re.search(r"(?i)httponly", cookie) and re.search(r"(?i)samesite=strict", cookie)
    assert "Path=/ui" in cookie and "secure" not in cookie.lower()  # http here: no Secure
    jar = {UI_COOKIE: signed.cookies[UI_COOKIE]}
    body = data(server, cookies=jar)
    assert body.status_code == 200 and body.json()["principal"] == "admin"
    assert topic in [t["name"] for t in body.json()["topics"]]
    # The cookie is good for the page's data and nothing else.
    assert httpx.get(server.url + "/metrics", cookies=jar).status_code == 401
    assert httpx.get(server.url + CLUSTER + "/topics", cookies=jar).status_code == 401
    assert httpx.post(server.url + CLUSTER + "/topics", cookies=jar, json={
        "topic_name": "via-cookie", "partitions_count": 1}).status_code == 401
    # The API's own credentials work on the data too.
    assert data(server, headers={"Authorization": f"Bearer {key_id}.{secret}"}).status_code == 200

    # A principal that may not describe the cluster is told what it lacks.
    viewer = admin.post("/api-keys", json={"principal": "viewer"}).json()
    viewer_key = f"{viewer['key_id']}:{viewer['secret']}"
    assert admin.post("/acls", json={"principal": "viewer", "resource_type": "topic",
                                     "resource_name": topic, "pattern_type": "literal",
                                     "operation": "consume"}).status_code == 201
    denied = httpx.post(server.url + "/ui/login", json={"key": viewer_key})
    assert denied.status_code == 403 and "--operation describe --cluster" in denied.json()["message"]
    assert data(server, auth=(viewer["key_id"], viewer["secret"])).status_code == 403
    assert admin.post("/acls", json={"principal": "viewer", "resource_type": "cluster",
                                     "resource_name": "lakelog", "pattern_type": "literal",
                                     "operation": "describe"}).status_code == 201
    allowed = httpx.post(server.url + "/ui/login", json={"key": viewer_key})
    assert allowed.status_code == 200
    viewer_jar = {UI_COOKIE: allowed.cookies[UI_COOKIE]}
    assert data(server, cookies=viewer_jar).json()["principal"] == "viewer"
    # A revoked key stops working at the next refresh; signing out drops the cookie.
    assert admin.delete(f"/api-keys/{viewer['key_id']}").status_code == 204
    assert data(server, cookies=viewer_jar).status_code == 401
    out = httpx.post(server.url + "/ui/logout", cookies=jar)
    assert out.status_code == 204 and 'Max-Age=0' in out.headers["set-cookie"]
    assert secret not in server.log() and viewer["secret"] not in server.log()


def test_access_log_and_metrics(server: ServerProcess, admin: httpx.Client, admin_key: str,
                                topic: str) -> None:
    produce(admin, topic, 3, partition=1)
    commit(admin, "metered", topic, 0)  # on partition 0, which holds nothing yet
    metrics = admin.get(server.url + "/metrics").text
    assert f'lakelog_partition_tiering_backlog_records{{partition="1",topic="{topic}"}}' in metrics
    assert re.search(rf'lakelog_partition_tiering_backlog_records\{{partition="1",topic="{topic}"\}} [1-9]',
                     metrics)
    assert re.search(r'lakelog_consumer_group_total_lag\{group="metered"\} [0-9]', metrics)
    assert 'lakelog_job_runs{job="tier",status="succeeded"} 1.0' in metrics
    assert 'lakelog_job_runs{job="compact",status="failed"} 1.0' in metrics
    assert 'lakelog_job_last_run_failed{job="compact"} 1.0' in metrics
    assert 'lakelog_job_last_run_failed{job="tier"} 0.0' in metrics
    assert re.search(r'lakelog_job_last_run_duration_seconds\{job="tier"\} 0\.5\b', metrics)

    assert data(server).status_code == 401  # logged with no principal
    # A path with a line break and a space in it stays on one line of the log.
    key_id, _, secret = admin_key.partition(":")
    odd = httpx.get(server.url + CLUSTER + "/topics/a%0Ab%20c", auth=(key_id, secret))
    assert odd.status_code == 404
    log_path = server.data_dir.parent / "access.log"
    deadline = time.monotonic() + 10
    while "a%0Ab%20c" not in (text := log_path.read_text() if log_path.exists() else ""):
        assert time.monotonic() < deadline, "the request log was not written within 10 s"
        time.sleep(0.05)
    line = next(x for x in text.splitlines() if "a%0Ab%20c" in x)
    when, client, principal, method, path, status, size, took = line.split(" ")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", when)
    assert client.startswith("127.0.0.1:") and principal == "admin" and method == "GET"
    assert path == "/v3/clusters/lakelog/topics/a%0Ab%20c" and status == "404"
    assert int(size) == len(odd.content) and float(took) >= 0
    assert re.search(r" - GET /ui/data 401 \d+ ", text)  # refused: no principal
    assert secret not in text and UI_COOKIE not in text and "Basic" not in text


def _total_lag_line_rose() -> str:
    """JS: whether the group's total-lag line ends higher than it starts (SVG y grows
    downwards)."""
    return f"""() => {{
        const ys = [...document.querySelectorAll(
            '[data-group="{GROUP}"] polyline[data-series="total"]')].flatMap(
            (p) => p.getAttribute("points").trim().split(" ").map((xy) => +xy.split(",")[1]));
        return ys.length > 1 && ys[ys.length - 1] < ys[0] - 20;
    }}"""


def test_dashboard_in_a_real_browser(server: ServerProcess, admin: httpx.Client,
                                     admin_key: str) -> None:
    from playwright.sync_api import sync_playwright

    topic = make_topic(admin, "clicks")
    assert CHROMIUM.exists(), "install Debian's chromium (apt-get install chromium): .ci/run does"
    produce(admin, topic, 5)
    commit(admin, GROUP, topic, 0)  # lag 5 on partition 0
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" and
                    "401" not in m.text else None)  # the first, unsigned data fetch
            page.goto(server.url + "/ui")
            page.wait_for_selector("#signin", state="visible", timeout=30_000)
            page.fill("#key", "llk_0000:wrong")
            page.click("#signin button[type=submit]")
            page.wait_for_function("() => document.querySelector('#signin-error').textContent"
                                   ".includes('unknown API key')", timeout=30_000)
            assert page.is_hidden("#board")
            page.fill("#key", admin_key)
            page.click("#signin button[type=submit]")
            page.wait_for_selector(f'tr[data-topic="{topic}"]', timeout=30_000)
            assert page.inner_text("#principal") == "signed in as admin"
            # Both of lakelog serve's rows: no jobs and no SQL endpoint in these tests.
            assert "off" in page.inner_text('[data-service="jobs"]')
            assert "off" in page.inner_text('[data-service="sql"]')
            # A service's times read as times, its durations as durations (issue 35).
            shown = page.evaluate("""() => [detail("since_ms", 1795679046495),
                                             detail("restart_backoff_ms", 1500),
                                             detail("restarts", 16)]""")
            assert shown == ["since: 2026-11-26 07:44:06Z", "restart_backoff: 1.5 s",
                             "restarts: 16"], shown
            jobs = page.inner_text("#jobs")
            assert "OSError: disk full" in jobs and "tiered offsets 0..9" in jobs
            lag = f'[data-group="{GROUP}"] .total-lag'
            page.wait_for_function(f"() => document.querySelector('{lag}')?.textContent === '5'",
                                   timeout=30_000)
            # Two samples at lag 5 make a flat line: the check below can fail.
            page.wait_for_function(f"""() => document.querySelectorAll(
                '[data-group="{GROUP}"] polyline[data-series="total"]').length > 0""",
                timeout=30_000)
            assert not page.evaluate(_total_lag_line_rose())

            produce(admin, topic, 40)
            page.wait_for_function(f"() => document.querySelector('{lag}')?.textContent === '45'",
                                   timeout=45_000)
            page.wait_for_function(_total_lag_line_rose(), timeout=45_000)
            backlog = page.inner_text(f'[data-backlog="{topic}"]')
            assert backlog.split() == [topic, "45"], backlog
            page.screenshot(path=str(ARTIFACTS / "dashboard.png"), full_page=True)
            assert errors == [], errors
        finally:
            browser.close()
