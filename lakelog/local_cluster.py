"""A cluster on this machine for trying lakelog: ZooKeeper and N brokers on loopback.

``up`` starts ZooKeeper (unless one is given) and brokers 1..N as detached ``lakelog
serve`` processes (sessions of their own: they outlive the command), each with its data
directory ``DIR/broker-<i>``, one shared ``DIR/warehouse``, and records what it started in
``DIR/cluster.json``; ``down`` reads that file, stops the processes and removes it. Data
stays, so the next ``up`` on DIR finds the topics again. ``up`` on a DIR whose cluster
is up starts again those of its processes that are not running (a broker that died), on
the ports they had, and leaves the others alone. Every port is checked before anything
starts: one that is taken is said, with the process that holds it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NamedTuple

import httpx

from lakelog.endpoint import DEFAULT_SQL_PORT
from lakelog.local import free_port
from lakelog.ports import describe_taken, port_free
from lakelog.zookeeper import ZooKeeperMissing, ZooKeeperServer
from log_tables.errors import LakelogError

STATE_FILE = "cluster.json"
MAX_BROKERS = 32
START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 30.0
HOST = "127.0.0.1"


@dataclass(frozen=True, slots=True)
class Pid:
    """A process we started: its pid and its start time, so that a pid the system has
    since given to another process is not taken for ours."""

    pid: int
    start_ticks: int

    @classmethod
    def of(cls, pid: int) -> Pid:
        ticks = _start_ticks(pid)
        return cls(pid, ticks if ticks is not None else -1)

    def alive(self) -> bool:
        return _start_ticks(self.pid) == self.start_ticks


def _start_ticks(pid: int) -> int | None:
    """``starttime`` from /proc/PID/stat, or None for no such process (a zombie is none)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
    return None if fields[0] == "Z" else int(fields[19])


@dataclass(frozen=True, slots=True)
class Broker:
    id: int
    port: int
    url: str
    data_dir: str
    log: str
    process: Pid
    sql_port: int = 0
    """Its SQL endpoint's port; 0: none (one broker of the cluster runs one)."""


@dataclass(frozen=True, slots=True)
class Cluster:
    """What ``up`` started, as ``DIR/cluster.json`` keeps it."""

    directory: str
    zookeeper: str
    """The brokers' connect string (HOST:PORT[/chroot])."""
    zookeeper_process: Pid | None
    """None: a ZooKeeper given with --zookeeper, which ``down`` leaves running."""
    zookeeper_log: str | None
    warehouse: str
    auth: str
    brokers: tuple[Broker, ...]

    @property
    def admin_key(self) -> Path | None:
        """The admin key, for the CLI (``LAKELOG_DATA_DIR``) when auth is api-key: in the
        data directory of the broker whose first start made it (keys are cluster-wide, so
        it works on every broker)."""
        if self.auth != "api-key" or not self.brokers:
            return None
        for broker in self.brokers:
            key = Path(broker.data_dir) / "security" / "admin.key"
            if key.exists():
                return key
        return Path(self.brokers[0].data_dir) / "security" / "admin.key"

    def alive(self) -> list[str]:
        """The processes of this cluster still running, named."""
        names = [f"broker {b.id} (pid {b.process.pid})" for b in self.brokers
                 if b.process.alive()]
        if self.zookeeper_process is not None and self.zookeeper_process.alive():
            names.append(f"ZooKeeper (pid {self.zookeeper_process.pid})")
        return names

    def save(self) -> None:
        path = Path(self.directory) / STATE_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2) + "\n")
        tmp.replace(path)

    @classmethod
    def load(cls, directory: Path) -> Cluster | None:
        path = directory / STATE_FILE
        try:
            raw: dict[str, Any] = json.loads(path.read_text())
            zk = raw["zookeeper_process"]
            return cls(raw["directory"], raw["zookeeper"], zk and Pid(**zk),
                       raw["zookeeper_log"], raw["warehouse"], raw["auth"],
                       tuple(Broker(**{  # a file from before sql_port: broker 1's default
                           "sql_port": DEFAULT_SQL_PORT if b["id"] == 1 else 0, **b,
                           "process": Pid(**b["process"])}) for b in raw["brokers"]))
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError) as exc:
            raise LakelogError(f"{path}: not a cluster file lakelog wrote ({exc}); "
                               f"stop its processes by hand and remove it") from None


def up(directory: Path, brokers: int | None = None, zookeeper: str | None = None,
       auth: str | None = None, timeout_s: float = START_TIMEOUT_S,
       sql_port: int | None = None) -> Cluster:
    """Start ZooKeeper (unless ``zookeeper`` names one) and brokers 1..``brokers`` (3 by
    default), broker 1 with a SQL endpoint on ``sql_port`` (0: none; None: as
    ``LAKELOG_SQL_PORT`` says, else 15002, as for ``serve``); or, where
    DIR/cluster.json names a cluster, those of its processes that are not running; wait
    until each answers /healthz, and write ``DIR/cluster.json``.

    Steps: 1. read DIR/cluster.json: a cluster there keeps its brokers, ports, ZooKeeper
    and auth (a different count or auth is refused), its running processes are left
    alone; 2. check that every port to be listened on is free (else say which, and who
    holds it); 3. start ZooKeeper in DIR/zookeeper (or check the given one answers);
    4. spawn each broker not running; 5. wait for each /healthz; 6. write cluster.json.
    A failure at 3-5 stops what this call started.
    """
    directory = directory.absolute()
    old = Cluster.load(directory)
    if sql_port is None:
        sql_port = int(os.environ.get("LAKELOG_SQL_PORT") or DEFAULT_SQL_PORT)
    plan = _plan(directory, old, brokers, zookeeper, auth, sql_port)
    zk_port = None if plan.zookeeper is not None else _zookeeper_port(old)
    _check_ports(plan, zk_port)
    if plan.zookeeper is not None and plan.zookeeper_process is None:
        _check_reachable(plan.zookeeper)
    directory.mkdir(parents=True, exist_ok=True)
    zk_server = None
    connect = plan.zookeeper
    if connect is None:
        zk_server = _start_zookeeper(directory / "zookeeper", timeout_s, zk_port)
        connect = zk_server.connect
    started: list[tuple[Broker, subprocess.Popen[bytes]]] = []
    try:
        for broker in plan.to_start:
            started.append(_spawn_broker(directory, broker, connect, plan.auth))
        deadline = time.monotonic() + timeout_s
        for broker, proc in started:
            _wait_healthy(broker, proc, deadline, timeout_s)
    except BaseException:
        _stop_all([broker.process for broker, _ in started], 0)
        if zk_server is not None:
            zk_server.kill()
        raise
    fresh = {broker.id: broker for broker, _ in started}
    zk_process = Pid.of(zk_server.proc.pid) if zk_server and zk_server.proc else \
        plan.zookeeper_process
    zk_log = str(zk_server.log_path) if zk_server else old.zookeeper_log if old else None
    cluster = Cluster(str(directory), connect, zk_process, zk_log, str(directory / "warehouse"),
                      plan.auth, tuple(fresh.get(b.id, b) for b in plan.brokers))
    cluster.save()
    return cluster


class _Plan(NamedTuple):
    """What ``up`` keeps and what it starts."""

    brokers: tuple[Broker, ...]
    """Every broker of the cluster, as recorded (the running) or to be (the others)."""
    to_start: tuple[Broker, ...]
    zookeeper: str | None
    """The connect string of a ZooKeeper that runs (or is given); None: start one."""
    zookeeper_process: Pid | None
    """The running ZooKeeper ``up`` started earlier, kept."""
    auth: str


def _plan(directory: Path, old: Cluster | None, brokers: int | None, zookeeper: str | None,
          auth: str | None, sql_port: int) -> _Plan:
    if old is None:
        count = 3 if brokers is None else brokers
        if not 1 <= count <= MAX_BROKERS:
            raise LakelogError(f"--brokers {count}: from 1 to {MAX_BROKERS}")
        ports: list[int] = []
        while len(ports) < count:  # distinct, and none the SQL endpoint's
            if (port := free_port()) not in ports and port != sql_port:
                ports.append(port)
        made = tuple(Broker(i, port, f"http://{HOST}:{port}", str(directory / f"broker-{i}"),
                            str(directory / f"broker-{i}.log"), Pid(0, -1),
                            sql_port if i == 1 else 0)
                     for i, port in enumerate(ports, 1))
        return _Plan(made, made, zookeeper, None, auth or "api-key")
    where = f"the cluster in {directory} ({directory / STATE_FILE})"
    if brokers is not None and brokers != len(old.brokers):
        raise LakelogError(f"{where} has {len(old.brokers)} broker(s), not {brokers}: 'up' "
                           f"starts those not running; for another count, 'lakelog cluster "
                           f"down --dir {directory}' first")
    if auth is not None and auth != old.auth:
        raise LakelogError(f"{where} runs with --auth {old.auth}, not {auth}")
    if zookeeper is not None and zookeeper != old.zookeeper:
        raise LakelogError(f"{where} uses the ZooKeeper at {old.zookeeper}, not {zookeeper}")
    zk_running = old.zookeeper_process is not None and old.zookeeper_process.alive()
    return _Plan(old.brokers, tuple(b for b in old.brokers if not b.process.alive()),
                 old.zookeeper if old.zookeeper_process is None or zk_running else None,
                 old.zookeeper_process if zk_running else None, old.auth)


def _zookeeper_port(old: Cluster | None) -> int | None:
    """The port of the ZooKeeper ``up`` started before (its brokers were told it)."""
    if old is None:
        return None
    return int(old.zookeeper.split("/", 1)[0].rsplit(":", 1)[1])


def _check_ports(plan: _Plan, zk_port: int | None) -> None:
    """Step 2: every port the processes to start will listen on is free."""
    wanted = [(zk_port, "ZooKeeper's")] if zk_port else []
    for b in plan.to_start:
        wanted.append((b.port, f"broker {b.id}'s HTTP"))
        if b.sql_port:
            wanted.append((b.sql_port, f"broker {b.id}'s SQL endpoint"))
    taken = [describe_taken(HOST, port, what) for port, what in wanted
             if not port_free(HOST, port)]
    if taken:
        hint = " (--sql-port N picks another; 0: no SQL endpoint)" \
            if any("SQL" in t for t in taken) else ""
        raise LakelogError(f"{'; '.join(taken)}: stop it{hint}; nothing was started")


def down(directory: Path, timeout_s: float = STOP_TIMEOUT_S) -> tuple[Cluster, list[str]]:
    """Stop the brokers of ``DIR/cluster.json`` (SIGTERM, SIGKILL after ``timeout_s``),
    then the ZooKeeper ``up`` started, and remove the file; data directories stay.
    Returns the cluster and the processes that had to be killed."""
    directory = directory.absolute()
    cluster = Cluster.load(directory)
    if cluster is None:
        raise LakelogError(f"no {directory / STATE_FILE}: no cluster was started in "
                           f"{directory} ('lakelog cluster up --dir {directory}' starts one)")
    lingering = _stop_all([b.process for b in cluster.brokers], timeout_s)
    killed = [f"broker {b.id}" for b in cluster.brokers if b.process in lingering]
    if cluster.zookeeper_process is not None and \
            _stop_all([cluster.zookeeper_process], timeout_s):
        killed.append("ZooKeeper")
    (directory / STATE_FILE).unlink()
    return cluster, killed


def _start_zookeeper(directory: Path, timeout_s: float, port: int | None
                     ) -> ZooKeeperServer:
    server = ZooKeeperServer(directory, port)
    try:
        return server.start(timeout_s)
    except ZooKeeperMissing:
        raise LakelogError("ZooKeeper is not installed: 'sudo apt-get install zookeeper', "
                           "or give a running one with --zookeeper HOST:PORT") from None
    except RuntimeError:
        raise LakelogError(f"ZooKeeper did not start on port {server.port}: see "
                           f"{server.log_path}") from None


def _check_reachable(connect: str) -> None:
    """The first server of a connect string (HOST:PORT[,...][/chroot]) accepts a connection."""
    first = connect.split("/", 1)[0].split(",")[0]
    host, _, port = first.rpartition(":")
    if not host or not port.isdigit():
        raise LakelogError(f"--zookeeper {connect!r}: expected HOST:PORT[/chroot]")
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as exc:
        raise LakelogError(f"no ZooKeeper answers at {host}:{port} ({exc.strerror or exc})"
                           ) from None


def _spawn_broker(directory: Path, broker: Broker, zookeeper: str, auth: str
                  ) -> tuple[Broker, subprocess.Popen[bytes]]:
    Path(broker.data_dir).mkdir(exist_ok=True)
    lakelog = Path(sys.executable).parent / "lakelog"
    with open(broker.log, "ab") as out:
        proc = subprocess.Popen(
            [str(lakelog), "serve", "--broker-id", str(broker.id), "--zookeeper", zookeeper,
             "--data-dir", broker.data_dir, "--port", str(broker.port), "--host", HOST,
             "--warehouse", str(directory / "warehouse"), "--auth", auth,
             # One SQL endpoint (a JVM) for the cluster on one machine: broker 1's.
             "--sql-port", str(broker.sql_port)],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True)
    return dataclasses.replace(broker, process=Pid.of(proc.pid)), proc


def _wait_healthy(broker: Broker, proc: subprocess.Popen[bytes], deadline: float,
                  timeout_s: float) -> None:
    while time.monotonic() < deadline:
        if (code := proc.poll()) is not None:
            raise LakelogError(f"broker {broker.id} (port {broker.port}) exited with {code}: "
                               f"see {broker.log}")
        try:
            if httpx.get(broker.url + "/healthz", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise LakelogError(f"broker {broker.id} did not answer on port {broker.port} within "
                       f"{timeout_s:g}s: see {broker.log}")


def _stop_all(processes: list[Pid], timeout_s: float) -> list[Pid]:
    """SIGTERM each, wait up to ``timeout_s`` for all, then SIGKILL the rest (and their
    process groups); returns those it had to kill."""
    for p in processes:
        if p.alive():
            _signal(p.pid, signal.SIGTERM, group=False)
    deadline = time.monotonic() + timeout_s
    while any(p.alive() for p in processes) and time.monotonic() < deadline:
        time.sleep(0.05)
    lingering = [p for p in processes if p.alive()]
    for p in lingering:
        _signal(p.pid, signal.SIGKILL, group=True)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while any(p.alive() for p in lingering):
        if time.monotonic() > deadline:
            raise LakelogError(f"pid {lingering[0].pid} outlived SIGKILL for "
                               f"{STOP_TIMEOUT_S:g}s")
        time.sleep(0.05)
    return lingering


def _signal(pid: int, sig: signal.Signals, group: bool) -> None:
    try:
        if group:  # our processes lead their own sessions: the group is all they started
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except ProcessLookupError:
        pass
