"""Hosts of their own for the brokers, and cuts between them that a pause cannot make.

Each broker runs in a network namespace of its own (``ip netns``), joined to the test's
namespace by a veth pair on one bridge: broker ``i`` is ``10.A.B.(i+1)``, and the test's
side (ZooKeeper and the clients) is the bridge's ``10.A.B.1``. A cut is a pair of
iptables rules in a broker's namespace that drop what it sends to, and hears from, an
address (and port): a broker cut off from ZooKeeper but not from its clients or the
other brokers, or from the other brokers but not from ZooKeeper. Root is needed (CI and
these machines have it); names carry the test process's id, so that what a killed run
left behind is found and removed by the next.
"""

from __future__ import annotations

import contextlib
import os
import random
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path

PREFIX = "lakelog-nemesis"


class NetworkUnavailable(RuntimeError):
    pass


def _ip(*args: str) -> None:
    _run(["ip", *args])


def _run(argv: Sequence[str]) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise NetworkUnavailable(f"{' '.join(argv)}: {done.stderr.strip() or done.returncode}")


def _namespaces() -> list[str]:
    return sorted(p.name for p in Path("/run/netns").glob("*")) \
        if Path("/run/netns").is_dir() else []


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale() -> None:
    """Namespaces and bridges of runs whose process is gone."""
    for ns in _namespaces():
        if not ns.startswith(PREFIX + "-"):
            continue
        pid = ns.split("-")[2]
        if pid.isdigit() and not _alive(int(pid)):
            with contextlib.suppress(NetworkUnavailable):
                _ip("netns", "del", ns)
            with contextlib.suppress(NetworkUnavailable):
                _ip("link", "del", _bridge_name(int(pid)))


def _bridge_name(pid: int) -> str:
    return f"llb{pid:x}"  # interface names: at most 15 characters


class Network:
    """A bridge and ``hosts`` namespaces, removed on ``close``."""

    def __init__(self, hosts: int, seed: int | None = None) -> None:
        if os.geteuid() != 0:
            raise NetworkUnavailable("network namespaces need root (the nemesis cuts brokers "
                                     "off with iptables in namespaces of their own)")
        remove_stale()
        self.pid = os.getpid()
        rng = random.Random(f"{seed}-{self.pid}")  # runs side by side get apart subnets
        self.prefix = f"10.{rng.randrange(100, 250)}.{rng.randrange(0, 256)}"
        self.bridge = _bridge_name(self.pid)
        self.gateway = f"{self.prefix}.1"
        self.namespaces: dict[int, str] = {}
        self.veths: dict[int, str] = {}
        self._made_bridge = False
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            self._made_bridge = True
            _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for i in range(1, hosts + 1):
                self._add_host(i)
        except BaseException:
            self.close()
            raise

    def _add_host(self, i: int) -> None:
        ns = f"{PREFIX}-{self.pid}-{i}"
        veth = f"llv{self.pid:x}h{i}"
        _ip("netns", "add", ns)
        self.namespaces[i] = ns
        _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
        self.veths[i] = veth
        _ip("link", "set", veth, "master", self.bridge)
        _ip("link", "set", veth, "up")
        _ip("-n", ns, "addr", "add", f"{self.address(i)}/24", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
        _ip("-n", ns, "link", "set", "lo", "up")

    def address(self, i: int) -> str:
        """Host ``i``'s address (brokers 1..n)."""
        return f"{self.prefix}.{i + 1}"

    def command(self, i: int) -> list[str]:
        """What runs a program in host ``i``'s namespace (``ip netns exec`` execs it: the
        process is the program itself, so signals reach it)."""
        return ["ip", "netns", "exec", self.namespaces[i]]

    # -- cuts -----------------------------------------------------------------------------
    def _iptables(self, i: int, *args: str) -> None:
        _run(["ip", "netns", "exec", self.namespaces[i], "iptables", "-w", *args])

    def cut(self, i: int, peer: str, port: int | None = None) -> None:
        """Host ``i`` neither sends to nor hears from ``peer`` (on ``port`` there only:
        from ZooKeeper, say, but not from the clients at the same address)."""
        out = ["-d", peer] + (["-p", "tcp", "--dport", str(port)] if port else [])
        back = ["-s", peer] + (["-p", "tcp", "--sport", str(port)] if port else [])
        self._iptables(i, "-A", "OUTPUT", *out, "-j", "DROP")
        self._iptables(i, "-A", "INPUT", *back, "-j", "DROP")

    def heal(self, i: int) -> None:
        """Every cut of host ``i`` removed."""
        self._iptables(i, "-F", "OUTPUT")
        self._iptables(i, "-F", "INPUT")

    def close(self) -> None:
        # Each veth pair goes first, at once: a deleted namespace's interfaces go only when
        # the kernel's cleanup gets to it, and the next Network of this process (the next
        # seed) would find its veth's name taken ("File exists").
        for veth in self.veths.values():
            with contextlib.suppress(NetworkUnavailable):
                _ip("link", "del", veth)
        self.veths = {}
        for ns in self.namespaces.values():
            with contextlib.suppress(NetworkUnavailable):
                _ip("netns", "del", ns)
        self.namespaces = {}
        if self._made_bridge:
            with contextlib.suppress(NetworkUnavailable):
                _ip("link", "del", self.bridge)
            self._made_bridge = False


@contextlib.contextmanager
def network(hosts: int, seed: int | None = None) -> Iterator[Network]:
    net = Network(hosts, seed)
    try:
        yield net
    finally:
        net.close()
