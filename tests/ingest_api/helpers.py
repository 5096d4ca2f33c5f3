from __future__ import annotations

import base64
import json
import socket
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import httpx

from log_tables.cold.table import STAGE_DIR


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def string(data: str) -> dict[str, str]:
    return {"type": "STRING", "data": data}


def fetch_all(client: httpx.Client, topic: str, partition: int, start: int = 0,
              fmt: str = "BINARY") -> list[dict[str, Any]]:
    """Every record of a partition from ``start`` to the high watermark, over HTTP."""
    out: list[dict[str, Any]] = []
    offset = start
    while True:
        r = client.get(f"/topics/{topic}/partitions/{partition}/records",
                       params={"offset": offset, "max_records": 5000, "format": fmt})
        assert r.status_code == 200, r.text
        body = r.json()
        out.extend(body["records"])
        if body["next_offset"] >= body["high_watermark"]:
            return out
        offset = body["next_offset"]


def stream_produce(port: int, path: str, chunks: Iterable[bytes], timeout_s: float = 120
                   ) -> tuple[int, list[dict[str, Any]]]:
    """POST a chunked body while reading the streamed answer at the same time.

    httpx sends the whole body before it reads the answer; a server that streams its
    reports back while it reads would fill the socket buffers and both would wait. A
    producer streaming a long body reads as it writes, as this does (a raw socket, a
    writer thread). Returns the status and the answer's report lines.
    """
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout_s)
    sent: list[BaseException] = []

    def write() -> None:
        try:
            sock.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                         "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
                         "Connection: close\r\n\r\n".encode())
            for chunk in chunks:
                sock.sendall(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
            sock.sendall(b"0\r\n\r\n")
        except OSError as exc:  # the answer says why
            sent.append(exc)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    raw = bytearray()
    with sock:
        while data := sock.recv(1 << 16):
            raw += data
    writer.join(timeout_s)
    head, _, body = bytes(raw).partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    if b"transfer-encoding: chunked" in head.lower():
        decoded = bytearray()
        while body:
            size_line, _, body = body.partition(b"\r\n")
            size = int(size_line, 16)
            if size == 0:
                break
            decoded += body[:size]
            body = body[size + 2:]
        body = bytes(decoded)
    return status, [json.loads(line) for line in body.splitlines() if line.strip()]


def locked_inodes() -> set[int]:
    """Inodes of files with a flock held, from /proc/locks (read only: taking a lock to
    probe one could make a starting job fail to take its own)."""
    inodes = set()
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if "FLOCK" in fields:
            inodes.add(int(fields[fields.index("FLOCK") + 4].rsplit(":", 1)[1]))
    return inodes


def live_stages(table: Path) -> dict[str, list[str]]:
    """The stage directories of a table whose job is running (its lock is held): job id →
    the files in it. Those of killed jobs stay until a later job cleans them."""
    stage = table / STAGE_DIR
    if not stage.is_dir():
        return {}
    locked = locked_inodes()
    out = {}
    for job in stage.iterdir():
        try:
            if (job / ".lock").stat().st_ino in locked:
                out[job.name] = sorted(f.name for f in job.iterdir() if f.is_file())
        except FileNotFoundError:  # the job finished while we looked
            continue
    return out
