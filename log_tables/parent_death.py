"""Child processes that end with their parent: Linux's ``PR_SET_PDEATHSIG``.

A process whose parent is SIGKILLed is reparented (to pid 1 or a subreaper) and
runs on. ``prctl(PR_SET_PDEATHSIG, sig)`` asks the kernel to send it ``sig``
when its parent goes. Two catches, both handled by the callers:

- the signal comes when the *thread* that forked the child ends, not the
  process: fork from the main thread or one that lives as long as the child
  should, and check ``os.getppid()`` when the signal arrives (after the
  parent's death the child is already reparented, so the pid differs);
- it is set inside the child, so a parent that died before that is missed:
  compare ``os.getppid()`` with the expected parent right after setting it.

Elsewhere than Linux there is no such call; callers keep a pipe from the
parent as well, whose end-of-file says the same thing portably.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import signal
import sys
from collections.abc import Callable

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None
    fn: Callable[..., int] = libc.prctl
    return fn


_PRCTL = _prctl()


def supported() -> bool:
    """Whether this platform can signal a child when its parent dies."""
    return _PRCTL is not None


def die_with_parent(sig: int) -> bool:
    """Ask the kernel to send ``sig`` to this process when its parent (thread) ends;
    False where that cannot be done (not Linux)."""
    if _PRCTL is None:
        return False
    if _PRCTL(PR_SET_PDEATHSIG, ctypes.c_ulong(sig), 0, 0, 0) != 0:
        log.warning("prctl(PR_SET_PDEATHSIG) failed: errno %d", ctypes.get_errno())
        return False
    return True


def main(argv: list[str]) -> None:
    """``python -m log_tables.parent_death PARENT_PID SIGNAL PROGRAM ARG...``: exec
    PROGRAM with SIGNAL as its parent-death signal (it is kept across exec), unless
    PARENT_PID is gone already. A trampoline, so that the parent needs no
    ``preexec_fn`` (unsafe in a process with threads)."""
    parent_pid, sig, program = int(argv[0]), signal.Signals[argv[1]], argv[2:]
    die_with_parent(sig)
    if os.getppid() != parent_pid:
        sys.exit(f"parent {parent_pid} is gone; not starting {program[0]}")
    os.execv(program[0], program)


if __name__ == "__main__":
    main(sys.argv[1:])
