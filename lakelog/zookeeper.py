"""A standalone Apache ZooKeeper on loopback, for ``lakelog cluster up`` and the tests.

It runs Debian's ``zookeeper`` package (``apt-get install zookeeper``) in the foreground
with its own configuration, data and log directories, so several can run side by side
and none needs root or systemd::

    zk = ZooKeeperServer(Path("zk")).start()
    print(zk.connect)          # 127.0.0.1:PORT
    zk.stop()
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

ZK_HOMES = (Path("/usr/share/zookeeper"), Path("/opt/zookeeper"))
TICK_MS = 500


class ZooKeeperMissing(RuntimeError):
    pass


def zk_server_script() -> Path:
    """``zkServer.sh`` of the installed ZooKeeper (``$ZOOKEEPER_HOME`` first)."""
    homes = [Path(h) for h in [os.environ.get("ZOOKEEPER_HOME")] if h] + list(ZK_HOMES)
    for home in homes:
        script = home / "bin" / "zkServer.sh"
        if script.exists():
            return script
    raise ZooKeeperMissing(
        "ZooKeeper is not installed: 'sudo apt-get install zookeeper' (Debian's package), "
        "or set ZOOKEEPER_HOME to a ZooKeeper release")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ZooKeeperServer:
    """One ZooKeeper server process on ``host``:``port`` (loopback by default) keeping its
    data in ``directory`` (kept across ``stop``/``start``, as a restarted ZooKeeper keeps
    its data)."""

    def __init__(self, directory: Path, port: int | None = None, *,
                 host: str = "127.0.0.1") -> None:
        self.directory = directory
        self.host = host
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def connect(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.directory / "zookeeper.out"

    def _configure(self) -> Path:
        conf = self.directory / "conf"
        for sub in (conf, self.directory / "data", self.directory / "logs"):
            sub.mkdir(parents=True, exist_ok=True)
        # Sessions from 2 ticks (1 s) to 120 s: tests use short ones, Kafka's default is 18 s.
        (conf / "zoo.cfg").write_text(
            f"tickTime={TICK_MS}\n"
            f"dataDir={self.directory / 'data'}\n"
            f"clientPort={self.port}\n"
            f"clientPortAddress={self.host}\n"
            "maxSessionTimeout=120000\n"
            "admin.enableServer=false\n"
            "4lw.commands.whitelist=ruok,srvr\n"
            "maxClientCnxns=0\n")
        log4j = Path(zk_server_script()).parents[1] / "conf" / "log4j.properties"
        if log4j.exists():
            shutil.copy(log4j, conf / "log4j.properties")
        return conf

    def start(self, timeout_s: float = 60) -> ZooKeeperServer:
        script = zk_server_script()
        conf = self._configure()
        env = {**os.environ, "ZOOCFGDIR": str(conf), "ZOO_LOG_DIR": str(self.directory / "logs"),
               "ZOO_LOG4J_PROP": "WARN,CONSOLE", "SERVER_JVMFLAGS": "-Xmx256m"}
        with self.log_path.open("ab") as out:
            self.proc = subprocess.Popen(
                [str(script), "start-foreground", str(conf / "zoo.cfg")], env=env,
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ZooKeeper exited with {self.proc.returncode}: "
                                   f"{self.log()}")
            if self.ready():
                return self
            time.sleep(0.1)
        self.kill()
        raise RuntimeError(f"ZooKeeper on {self.connect} did not answer within {timeout_s}s: "
                           f"{self.log()}")

    def ready(self) -> bool:
        """Serving: it answers ``srvr`` with its mode (it refuses while starting)."""
        try:
            with socket.create_connection((self.host, self.port), timeout=1) as s:
                s.sendall(b"srvr")
                answer = b""
                while chunk := s.recv(4096):
                    answer += chunk
        except OSError:
            return False
        return b"Mode:" in answer

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:] if self.log_path.exists() else ""

    def _signal(self, sig: signal.Signals, timeout_s: float) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):  # the JVM and whatever it started
                os.killpg(self.proc.pid, sig)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout_s)
        self.proc = None

    def stop(self, timeout_s: float = 30) -> None:
        self._signal(signal.SIGTERM, timeout_s)

    def kill(self) -> None:
        self._signal(signal.SIGKILL, 30)

    def restart(self) -> ZooKeeperServer:
        self.stop()
        return self.start()
