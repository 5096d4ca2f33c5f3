"""Whether a TCP port can be listened on, and, when not, which process holds it.

``serve`` checks its SQL endpoint's ports and ``cluster up`` every port of the brokers it
starts before anything starts, so that a port taken (by another ``lakelog serve``, say)
is said once, naming the holder, instead of a child failing to bind and being started
again. The holder is read from Linux's ``/proc`` (the socket's inode in
``/proc/net/tcp*``, then the process with a descriptor on it); elsewhere, or for another
user's process, it is not named.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
from pathlib import Path

LISTEN = "0A"
"""A socket's state in /proc/net/tcp: listening."""
MAX_PROCESSES = 100_000
"""Most processes looked at for the holder of a port."""


def port_free(host: str, port: int) -> bool:
    """Nothing listens on ``host``:``port`` (a bind there succeeds). Other errors than
    "in use" (an address not of this machine) are the caller's to meet when it binds."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        # As servers bind: a port whose last connection is in TIME_WAIT is free.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            return exc.errno != errno.EADDRINUSE
    return True


def port_holder(port: int) -> str | None:
    """``pid N (its command line)`` of the process listening on ``port``, or None."""
    inodes = _listening_inodes(port)
    if not inodes:
        return None
    wanted = {f"socket:[{inode}]" for inode in inodes}
    for count, proc in enumerate(Path("/proc").glob("[0-9]*")):
        if count >= MAX_PROCESSES:
            break
        with contextlib.suppress(OSError):
            for fd in (proc / "fd").iterdir():
                with contextlib.suppress(OSError):
                    if os.readlink(fd) in wanted:
                        return f"pid {proc.name} ({_command(proc)})"
    return None


def describe_taken(host: str, port: int, what: str) -> str:
    """A line saying ``port`` (for ``what``) is taken, and by what when that can be told."""
    holder = port_holder(port)
    return f"port {port} ({what}) on {host} is taken" + (f" by {holder}" if holder else "")


def _listening_inodes(port: int) -> set[str]:
    found: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if len(fields) > 9 and fields[3] == LISTEN and \
                        int(fields[1].rsplit(":", 1)[1], 16) == port:
                    found.add(fields[9])
    return found


def _command(proc: Path) -> str:
    try:
        words = (proc / "cmdline").read_bytes().rstrip(b"\0").split(b"\0")
    except OSError:
        return "?"
    # The program's name, not its path, and its arguments: enough to recognise it.
    text = " ".join([os.path.basename(words[0].decode(errors="replace")),
                     *(w.decode(errors="replace") for w in words[1:])])
    return text if len(text) <= 160 else text[:157] + "..."
