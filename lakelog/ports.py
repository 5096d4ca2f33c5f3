"""Whether a TCP port can be listened on, and, when not, which process holds it.

``serve`` checks its SQL endpoint's ports and ``cluster up`` every port of the brokers it
starts before anything starts, so that a port taken (by another ``lakelog serve``, say)
is said once, naming the holder, instead of a child failing to bind and being started
again. The holder is read from Linux's ``/proc`` (the socket's inode in
``/proc/net/tcp*``, then the process with a descriptor on it); elsewhere, or for another
user's process, it is not named. It is named by its pid and its executable's name, and
for lakelog by its command (``lakelog serve``) or module, never with its arguments: the
line goes into the endpoint's state file (the dashboard shows it) and error messages,
and a command line may carry a key or a password.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import socket
from pathlib import Path

LISTEN = "0A"
"""A socket's state in /proc/net/tcp: listening."""
MAX_PROCESSES = 100_000
"""Most processes looked at for the holder of a port."""
COMMAND_GROUPS = frozenset({"acls", "cluster", "groups", "jobs", "keys", "topics"})
"""lakelog's commands that take a command of their own (``lakelog cluster up``)."""
PACKAGES = ("lakelog", "log_tables", "cluster", "ingest_api", "compaction_jobs",
            "consumer_groups")
"""lakelog's packages: ``python -m`` one of their modules is a lakelog process."""
_WORD = re.compile(r"[a-z][a-z-]{0,31}")
_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_.]{0,99}")


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
    """``pid N (its name)`` of the process listening on ``port``, or None."""
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
    """The executable's name (the kernel's, not a word of the command line), or for
    lakelog which command or module it runs; never arguments."""
    try:
        name = (proc / "comm").read_text().strip() or "?"
        words = (proc / "cmdline").read_bytes().rstrip(b"\0").split(b"\0")
    except OSError:
        return "?"
    return lakelog_command([w.decode(errors="replace") for w in words]) or name


def lakelog_command(words: list[str]) -> str | None:
    """``lakelog serve``, ``lakelog cluster up`` or ``python3 -m lakelog.endpoint.process``
    for a command line of lakelog's (the words of ``/proc/N/cmdline``), else None."""
    program = [os.path.basename(w) for w in words[:2]]
    if program[:1] == ["lakelog"]:  # the console script
        return " ".join(["lakelog", *_subcommand(words[1:])])
    if program[0].startswith("python") and program[1:] == ["lakelog"]:  # by its shebang
        return " ".join(["lakelog", *_subcommand(words[2:])])
    if len(words) > 2 and words[1] == "-m" and _MODULE.fullmatch(words[2]) and \
            words[2].split(".")[0] in PACKAGES:
        if words[2] == "lakelog":
            return " ".join(["lakelog", *_subcommand(words[3:])])
        return f"{program[0]} -m {words[2]}"
    return None


def _subcommand(arguments: list[str]) -> list[str]:
    """The command words of lakelog's arguments: the root options (each but --version
    takes a value) skipped, then one command, two for a group's."""
    found: list[str] = []
    skip = False
    for word in arguments:
        if skip:
            skip = False
        elif word.startswith("-") and not found:
            skip = "=" not in word and word != "--version"
        elif _WORD.fullmatch(word) and (not found or found[0] in COMMAND_GROUPS):
            found.append(word)
            if len(found) == 2 or word not in COMMAND_GROUPS:
                break
        else:
            break
    return found
