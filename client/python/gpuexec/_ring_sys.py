"""What the command ring needs of the system (for _ring.py): the futex
system call, a full memory barrier, and whether this process can run a
ring at all. Standard library and ctypes only."""

from __future__ import annotations

import ctypes
import os
import platform
import threading
from typing import Optional

X86 = platform.machine().lower() in ("x86_64", "amd64")
SYS_FUTEX = {"x86_64": 202, "amd64": 202}.get(platform.machine().lower())
FUTEX_WAIT, FUTEX_WAKE = 0, 1


class Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class Libc:
    """The few libc calls the ring needs, typed once."""

    def __init__(self) -> None:
        c = ctypes.CDLL(None, use_errno=True)
        self.syscall = c.syscall
        self.syscall.restype = ctypes.c_long
        self.trylock = c.pthread_spin_trylock
        self.lock_word = ctypes.c_int(0)
        self.lock_ref = ctypes.byref(self.lock_word)
        c.pthread_spin_init(self.lock_ref, 0)

    def fence(self) -> None:
        """A full memory barrier. glibc's pthread_spin_trylock is one
        locked instruction (an exchange, or a compare-and-exchange) whether
        or not the lock is free, so the lock is never given back: one call,
        not two."""
        self.trylock(self.lock_ref)


_the_libc: Optional[Libc] = None
_THE_LIBC_LOCK = threading.Lock()


def get_libc() -> Libc:
    global _the_libc
    with _THE_LIBC_LOCK:
        if _the_libc is None:
            _the_libc = Libc()
        return _the_libc


def supported() -> Optional[str]:
    """None where this process can run a ring; else why not, in words."""
    if not X86 or SYS_FUTEX is None:
        return (f"the Python client's rings need x86-64's memory order; this is "
                f"{platform.machine()[:40]}")
    if not hasattr(os, "memfd_create"):
        return "os.memfd_create is missing"
    return None
