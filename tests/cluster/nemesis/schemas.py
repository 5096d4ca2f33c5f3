"""The schema registry under the nemesis: ``Registering`` registers a new schema version
after another (each compatible: one more field with a default) through a broker chosen
in turn, with Confluent's REST calls as a registry client makes them, and keeps every id
a broker answered. ``check_schemas`` then reads the registry through every broker:

- ``schemas_lost``: an answered (subject, schema) the registry no longer has, or whose id
  now gives another schema;
- ``schema_ids_reused``: one id answered for two different schemas.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence

import httpx

from tests.cluster.nemesis.checker import Verdict

SUBJECT = "nemesis-schemas-value"
MEDIA = "application/vnd.schemaregistry.v1+json"


def schema(n: int) -> str:
    fields = [{"name": "id", "type": "long"}] + [
        {"name": f"f{i}", "type": "string", "default": ""} for i in range(n)]
    return json.dumps({"type": "record", "name": "Nemesis", "fields": fields})


class Registering(threading.Thread):
    def __init__(self, urls: Sequence[str], *, every_s: float = 0.2) -> None:
        super().__init__(name="nemesis-registry", daemon=True)
        self.urls = list(urls)
        self.every_s = every_s
        self.acked: dict[int, int] = {}
        """Version n's schema (``schema(n)``) -> the id a broker answered."""
        self.errors: list[str] = []
        self._halt = threading.Event()

    def run(self) -> None:
        n = turn = 0
        with httpx.Client(timeout=10, headers={"content-type": MEDIA}) as http:
            while not self._halt.wait(self.every_s):
                url = self.urls[turn % len(self.urls)]
                turn += 1
                try:
                    r = http.post(f"{url}/subjects/{SUBJECT}/versions",
                                  content=json.dumps({"schema": schema(n)}))
                except httpx.HTTPError as exc:
                    self._note(f"{url}: {type(exc).__name__}")
                    continue
                if r.status_code == 200:
                    self.acked[n] = int(r.json()["id"])
                    n += 1  # the next version; a failed one is tried again
                else:
                    self._note(f"{url}: {r.status_code} {r.text[:120]}")

    def _note(self, error: str) -> None:
        if len(self.errors) < 20:
            self.errors.append(error)

    def stop(self) -> None:
        self._halt.set()
        self.join(30)


def check_schemas(verdict: Verdict, registering: Registering, urls: Sequence[str],
                  deadline_s: float = 60) -> None:
    """Count what the registry lost or gave twice, asked through every broker (each
    must answer once the cluster is whole)."""
    acked = dict(registering.acked)
    verdict.schemas_registered = len(acked)
    by_id: dict[int, set[int]] = {}
    for n, schema_id in acked.items():
        by_id.setdefault(schema_id, set()).add(n)
    reused = {i: sorted(ns) for i, ns in by_id.items() if len(ns) > 1}
    verdict.schema_ids_reused = len(reused)
    lost: list[str] = []
    with httpx.Client(timeout=10) as http:
        for url in urls:
            seen = _ask(http, url, f"/subjects/{SUBJECT}/versions", deadline_s)
            ids: dict[int, str] = {}
            for version in seen or []:
                doc = _ask(http, url, f"/subjects/{SUBJECT}/versions/{version}", deadline_s)
                if doc is not None:
                    ids[int(doc["id"])] = json.dumps(json.loads(doc["schema"]))
            for n, schema_id in acked.items():
                want = json.dumps(json.loads(schema(n)))
                if ids.get(schema_id) != want:
                    lost.append(f"{url}: version of schema {n} (id {schema_id})")
    verdict.schemas_lost = len(lost)
    verdict.examples["schemas_lost"] = lost[:10]
    verdict.examples["schema_ids_reused"] = list(reused.items())[:10]
    verdict.examples["schema_errors"] = registering.errors[:10]


def _ask(http: httpx.Client, url: str, path: str, deadline_s: float) -> object | None:
    """The JSON answer to a GET, retried while the registry moves (503) or a connection
    is refused; None if none came by the deadline."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        try:
            r = http.get(url + path)
            if r.status_code == 200:
                return r.json()
            if r.status_code == 404:
                return None
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    return None
