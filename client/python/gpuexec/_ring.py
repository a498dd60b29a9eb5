"""A session's command ring, the client's side (proto/gpuexec/command_ring.h;
docs/command-ring-plan.md): shared memory through which a client on the
daemon's host posts the session's launches and synchronizes, and reads
their answers, with no gRPC call on the way.

- The ring is a sealed memfd (a header page, a submission ring this client
  writes, a completion ring the daemon writes), registered on the daemon's
  host memory socket. That connection stays open as the ring's lifeline:
  when this process ends, the daemon stops serving the ring and closes the
  session.
- Records are written with precompiled ``struct`` packing into the
  mapping; the daemon copies each one out before it reads it. The shared
  words (positions, futex words) are read and written through ctypes
  integers at their addresses: one aligned 8- or 4-byte access each, never
  torn (``struct``'s little-endian formats go byte by byte).
- The daemon is woken through a futex word only when it sleeps. Posting a
  record and then reading that word is a store followed by a load, which
  the processor may reorder; a locked instruction between them (libc's
  pthread_spin_trylock on a lock of this module's) forbids it, as the C++
  client's atomic exchange does. Everything else leans on x86-64's memory
  order (stores seen in order, loads in order), which Python cannot ask
  for elsewhere: on other processors sessions use the Execute stream (the
  C++ client rides rings there).
- A waiting call spins for ``spin_wait`` seconds, then sleeps on its own
  futex word (at most 100 ms at a time, so that it sees a closed ring or a
  dead daemon), with the interpreter lock released.

Everything here is the standard library and ctypes: the package needs no
build. What the daemon writes is trusted no further than its bounds: a
completion tail out of range or a completion crossing the ring's end breaks
the ring (DATA_LOSS), and the session's commands go on the Execute stream.
"""

from __future__ import annotations

import ctypes
import os
import platform
import select
import socket
import struct
import threading
import time
from typing import Any, Dict, Optional, Set, Tuple

import grpc

from . import _host_memory
from ._errors import Error
from .v1 import gpuexec_pb2 as pb

# ---- gpuexec/command_ring.h. test_command_ring.py checks LAYOUT against the
# header's own `// LAYOUT name offset size` lines, and the structs below
# against LAYOUT.
MAGIC = 0x0031474E49525847  # "GXRING1\0" as a little-endian u64
VERSION = 1
HEADER_BYTES = 4096
SLOT = 64
MAX_RECORD_BYTES = 40960
MAX_MESSAGE_BYTES = 1024
MAX_PARAM_BLOCK_BYTES = 32764  # a kernel's parameters, CUDA 12.1 and later

LAYOUT: Dict[str, Tuple[int, int]] = {
    "header.magic": (0, 8), "header.version": (8, 4), "header.header_bytes": (12, 4),
    "header.sq_offset": (16, 8), "header.sq_bytes": (24, 8), "header.cq_offset": (32, 8),
    "header.cq_bytes": (40, 8), "header.slot_bytes": (48, 4), "header.flags": (52, 4),
    "header.sq_tail": (64, 8), "header.sq_head": (128, 8), "header.daemon_wait": (192, 4),
    "header.cq_tail": (256, 8), "header.cq_head": (320, 8), "header.client_wait": (384, 4),
    "header.state": (448, 4), "header.close_code": (452, 4),
    "header.close_message_bytes": (456, 4), "header.close_message": (512, 1024),
    "header.aq_offset": (1536, 8), "header.aq_bytes": (1544, 8), "header.aq_tail": (1600, 8),
    "header.aq_head": (1664, 8),
    "submit.kind": (0, 2), "submit.slots": (2, 2), "submit.flags": (4, 4), "submit.id": (8, 8),
    "submit.seq": (16, 8), "submit.body_bytes": (24, 4), "submit.reserved": (28, 4),
    "launch.function": (0, 8), "launch.grid": (8, 12), "launch.block": (20, 12),
    "launch.cluster": (32, 12), "launch.shared_bytes": (44, 4), "launch.flags": (48, 4),
    "launch.cluster_policy": (52, 4), "launch.nargs": (56, 2), "launch.reserved": (58, 2),
    "launch.blob_bytes": (60, 4),
    "arg.kind": (0, 2), "arg.reserved": (2, 2), "arg.aux": (4, 4), "arg.a": (8, 8),
    "arg.b": (16, 8),
    "launch_graph.graph": (0, 8), "launch_graph.flags": (8, 4), "launch_graph.npatches": (12, 2),
    "launch_graph.reserved": (14, 2), "launch_graph.blob_bytes": (16, 4),
    "launch_graph.reserved2": (20, 4),
    "patch.node": (0, 4), "patch.argument": (4, 4), "patch.value": (8, 24),
    "tensor_map.buffer": (0, 8), "tensor_map.offset": (8, 8), "tensor_map.data_type": (16, 4),
    "tensor_map.rank": (20, 4), "tensor_map.dims": (24, 40), "tensor_map.strides": (64, 32),
    "tensor_map.box": (96, 20), "tensor_map.element_strides": (116, 20),
    "tensor_map.interleave": (136, 4), "tensor_map.swizzle": (140, 4),
    "tensor_map.l2_promotion": (144, 4), "tensor_map.oob_fill": (148, 4),
    "allocate.size": (0, 8), "free.buffer": (0, 8), "release_region.region": (0, 8),
    "memset.buffer": (0, 8), "memset.offset": (8, 8), "memset.size": (16, 8),
    "memset.value": (24, 4), "memset.reserved": (28, 4),
    "copy_buffer.dst": (0, 8), "copy_buffer.dst_offset": (8, 8), "copy_buffer.src": (16, 8),
    "copy_buffer.src_offset": (24, 8), "copy_buffer.size": (32, 8),
    "region_copy.region": (0, 8), "region_copy.region_offset": (8, 8),
    "region_copy.buffer": (16, 8), "region_copy.buffer_offset": (24, 8),
    "region_copy.size": (32, 8), "region_copy.direction": (40, 4),
    "region_copy.reserved": (44, 4),
    "complete.kind": (0, 2), "complete.slots": (2, 2), "complete.code": (4, 4),
    "complete.id": (8, 8), "complete.seq": (16, 8), "complete.gpu_time_ns": (24, 8),
    "complete.value0": (32, 8), "complete.value1": (40, 8), "complete.message_bytes": (48, 4),
    "complete.flags": (52, 4), "complete.reserved": (56, 8),
}

# Record kinds and flags.
PAD, BARRIER, LAUNCH, SYNCHRONIZE = 1, 2, 3, 4
ALLOCATE, FREE, MEMSET, COPY_BUFFER, REGION_COPY, RELEASE_REGION = 5, 6, 7, 8, 9, 10
LAUNCH_GRAPH, BEGIN_GRAPH, END_GRAPH = 11, 12, 13
REPLY = 1
OPEN = 0

# Records: every multi-byte field little-endian.
HEAD = struct.Struct("<HHIQQII")  # SubmitHead, 32 bytes
COMPLETE = struct.Struct("<HHiQQQQQII8x")  # CompleteHead, 64 bytes

# The ring's sizes: 256 KiB holds about 2,000 launches of a few arguments.
SUBMISSION_BYTES = 256 << 10
COMPLETION_BYTES = 64 << 10
# The longest a waiting thread sleeps before it looks at the ring's state
# and its lifeline again.
PARK_LIMIT_S = 0.1

_X86 = platform.machine().lower() in ("x86_64", "amd64")
_SYS_FUTEX = {"x86_64": 202, "amd64": 202}.get(platform.machine().lower())
_FUTEX_WAIT, _FUTEX_WAKE = 0, 1
_CODES = {code.value[0]: code for code in grpc.StatusCode}


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Libc:
    """The few libc calls the ring needs, typed once."""

    def __init__(self) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        self.syscall = libc.syscall
        self.syscall.restype = ctypes.c_long
        self.trylock = libc.pthread_spin_trylock
        self.lock_word = ctypes.c_int(0)
        self.lock_ref = ctypes.byref(self.lock_word)
        libc.pthread_spin_init(self.lock_ref, 0)

    def fence(self) -> None:
        """A full memory barrier. glibc's pthread_spin_trylock is one
        locked instruction (an exchange, or a compare-and-exchange) whether
        or not the lock is free, so the lock is never given back: one call,
        not two."""
        self.trylock(self.lock_ref)


_libc: Optional[_Libc] = None
_libc_lock = threading.Lock()


def _c() -> _Libc:
    global _libc
    with _libc_lock:
        if _libc is None:
            _libc = _Libc()
        return _libc


def supported() -> Optional[str]:
    """None where this process can run a ring; else why not, in words."""
    if not _X86 or _SYS_FUTEX is None:
        return (f"the Python client's rings need x86-64's memory order; this is "
                f"{platform.machine()[:40]}")
    if not hasattr(os, "memfd_create"):
        return "os.memfd_create is missing"
    return None


class Result:
    """A command's answer read from the completion ring: as much of a
    gpuexec.v1.CommandResult as the callers read."""

    __slots__ = ("code", "message", "kind", "gpu_time_ns", "value0", "value1")

    def __init__(self, code: int, message: str, kind: int, gpu_time_ns: int, value0: int,
                 value1: int) -> None:
        self.code = code
        self.message = message
        self.kind = kind
        self.gpu_time_ns = gpu_time_ns
        self.value0 = value0
        self.value1 = value1


def error_of(code: int, message: str) -> Error:
    return Error(_CODES.get(code, grpc.StatusCode.UNKNOWN), message)


class CommandRing:
    """A registered ring. Thread-safe: posts are serialized by its lock, and
    one waiting thread at a time polls the completions for all."""

    def __init__(self, socket_path: str, token: str, timeout: Optional[float],
                 spin_wait: float) -> None:
        self._sq_bytes = SUBMISSION_BYTES
        self._cq_bytes = COMPLETION_BYTES
        self._bytes = HEADER_BYTES + self._sq_bytes + self._cq_bytes
        self._spin_wait = spin_wait
        self._socket_path = socket_path
        self._libc = _c()
        fd = _host_memory.make_region_fd(self._bytes)
        try:
            self._address = _host_memory.map_region_fd(fd, self._bytes)
            try:
                self._memory = (ctypes.c_char * self._bytes).from_address(self._address)
                self._view = memoryview(self._memory).cast("B")
                self._words()
                self._write_header()
                request = pb.RegisterRegionRequest(session=token, bytes=self._bytes)
                c = request.command_ring
                c.layout_version = VERSION
                c.submission_bytes = self._sq_bytes
                c.completion_bytes = self._cq_bytes
                # A client that dies ends its session at once, not at its lease.
                c.close_session_on_hangup = True
                response, sock = _host_memory.register_on_socket(socket_path, request, fd,
                                                                 timeout, keep=True)
            except BaseException:
                self._view.release()
                _host_memory.unmap(self._address, self._bytes)
                raise
        finally:
            os.close(fd)
        assert sock is not None
        if not response.HasField("command_ring") or response.command_ring.ring == 0:
            sock.close()
            self._unmap()
            raise Error(grpc.StatusCode.DATA_LOSS,
                        f"gpuexec client: the daemon's host memory socket {socket_path} answered "
                        "a command ring's registration without a ring (a daemon that does not "
                        "serve them)")
        self.number = response.command_ring.ring
        # The lifeline, read only for its end from now on.
        sock.settimeout(0)
        self._lifeline: Optional[socket.socket] = sock
        self._cond = threading.Condition(threading.Lock())
        self._tail = 0
        self._seq = 1
        self._next_id = 1
        self._cq_head = 0
        self._polling = False
        self._rounds = 0
        # Threads waiting for the submission head to move (for room, or for
        # order()): the polling thread ends its round when it moves. With
        # none, a round waits for completions only, so that a waiting
        # command takes one round, not one for its start and one for its
        # answer.
        self._head_waiters = 0
        self._last_unwaited = 0
        self._ordered_through = 0
        self._awaited: Set[int] = set()
        self._abandoned: Set[int] = set()
        self._results: Dict[int, Result] = {}
        self._deferred: Optional[Error] = None
        self.broken: Optional[Error] = None

    def _words(self) -> None:
        a = self._address
        u64, u32 = ctypes.c_uint64, ctypes.c_uint32
        self._sq_tail_word = u64.from_address(a + LAYOUT["header.sq_tail"][0])
        self._sq_head_word = u64.from_address(a + LAYOUT["header.sq_head"][0])
        self._daemon_wait = u32.from_address(a + LAYOUT["header.daemon_wait"][0])
        self._cq_tail_word = u64.from_address(a + LAYOUT["header.cq_tail"][0])
        self._cq_head_word = u64.from_address(a + LAYOUT["header.cq_head"][0])
        self._client_wait = u32.from_address(a + LAYOUT["header.client_wait"][0])
        self._state = u32.from_address(a + LAYOUT["header.state"][0])
        self._daemon_wait_at = a + LAYOUT["header.daemon_wait"][0]
        self._client_wait_at = a + LAYOUT["header.client_wait"][0]

    def _write_header(self) -> None:
        struct.pack_into("<QIIQQQQI", self._view, 0, MAGIC, VERSION, HEADER_BYTES,
                         HEADER_BYTES, self._sq_bytes, HEADER_BYTES + self._sq_bytes,
                         self._cq_bytes, SLOT)

    def _unmap(self) -> None:
        view: Optional[memoryview] = getattr(self, "_view", None)
        if view is not None:
            view.release()
            self._view = None  # type: ignore[assignment]
            _host_memory.unmap(self._address, self._bytes)

    # ------------------------------------------------------------ posting

    def post(self, kind: int, body: bytes, wait: bool,
             timeout: Optional[float] = None) -> Optional[Result]:
        """Posts a record of ``kind`` with ``body`` (its bytes, at most a
        record's). With ``wait``, returns its answer, or raises its error or
        first an earlier command's failure; without, returns None once
        posted."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            if self.broken is not None:
                raise self.broken
            command_id = self._next_id
            self._next_id += 1
            if wait:
                self._awaited.add(command_id)
            try:
                self._post_locked(kind, body, REPLY if wait else 0, command_id, deadline)
            except BaseException:
                self._awaited.discard(command_id)
                raise
            if not wait:
                self._last_unwaited = command_id
                return None
            try:
                while True:
                    r = self._results.pop(command_id, None)
                    if r is not None:
                        if command_id > self._ordered_through:
                            self._ordered_through = command_id
                        if r.code != 0:
                            raise error_of(r.code, r.message)
                        deferred, self._deferred = self._deferred, None
                        if deferred is not None:
                            raise deferred
                        return r
                    if self.broken is not None:
                        raise self.broken
                    if deadline is not None and time.monotonic() >= deadline:
                        self._abandoned.add(command_id)
                        raise Error(grpc.StatusCode.DEADLINE_EXCEEDED,
                                    f"gpuexec client: no answer from the daemon within "
                                    f"{timeout} s on the session's command ring (work the "
                                    "daemon had received goes on)")
                    self._poll_locked(deadline, head=False)
            finally:
                self._awaited.discard(command_id)

    def _post_locked(self, kind: int, body: bytes, flags: int, command_id: int,
                     deadline: Optional[float]) -> None:
        size = (HEAD.size + len(body) + SLOT - 1) // SLOT * SLOT
        sq_bytes = self._sq_bytes
        while True:
            if self.broken is not None:  # the memory may be unmapped
                raise self.broken
            tail = self._tail
            at = tail % sq_bytes
            to_end = sq_bytes - at
            need = size + (to_end if size > to_end else 0)
            head = self._sq_head_word.value
            if head > tail:
                self._break_locked(Error(
                    grpc.StatusCode.DATA_LOSS,
                    f"gpuexec client: the daemon's submission head {head} is past the ring's "
                    f"tail {tail} (command ring {self.number})"))
            if self.broken is not None:
                raise self.broken
            if tail + need - head <= sq_bytes:
                break
            if deadline is not None and time.monotonic() >= deadline:
                raise Error(grpc.StatusCode.DEADLINE_EXCEEDED,
                            "gpuexec client: the session's command ring had no room for a "
                            "command within the call's timeout (the daemon has not started "
                            f"the {(tail - head) // SLOT} slots of commands before it)")
            self._poll_for_head_locked(deadline)
        view = self._view
        base = HEADER_BYTES
        if size > to_end:
            HEAD.pack_into(view, base + at, PAD, to_end // SLOT, 0, 0, 0, 0, 0)
            tail += to_end
            at = 0
        HEAD.pack_into(view, base + at, kind, size // SLOT, flags, command_id, self._seq,
                       len(body), 0)
        if body:
            start = base + at + HEAD.size
            view[start:start + len(body)] = body
        tail += size
        self._tail = tail
        self._seq += 1
        self._sq_tail_word.value = tail
        self._wake_daemon()

    def _wake_daemon(self) -> None:
        """After a store the daemon may sleep waiting for (a tail, a
        completion head): wakes it if it says it sleeps."""
        libc = self._libc
        libc.fence()  # the store before the look at daemon_wait
        if self._daemon_wait.value:
            self._daemon_wait.value = 0
            libc.syscall(_SYS_FUTEX, ctypes.c_void_p(self._daemon_wait_at), _FUTEX_WAKE, 1,
                         None, None, 0)

    # ------------------------------------------------------------ waiting

    def _poll_for_head_locked(self, deadline: Optional[float]) -> None:
        """_poll_locked for a thread that waits for the submission head to
        move (room to post, order()): counted, so that another thread's
        round ends at the move too."""
        self._head_waiters += 1
        try:
            self._poll_locked(deadline)
        finally:
            self._head_waiters -= 1

    def _poll_locked(self, deadline: Optional[float], head: bool = True) -> None:
        """One round of waiting for the daemon, without the lock: spins,
        then sleeps on the client futex word; then reads the completions
        posted meanwhile. The round ends at a completion, the ring's close,
        or (with ``head``, or while a thread waits for it) the submission
        head's move. A thread that finds another at it waits for that one's
        round instead."""
        if self._polling:
            seen = self._rounds
            limit = PARK_LIMIT_S
            if deadline is not None:
                limit = max(0.0, min(limit, deadline - time.monotonic()))
            self._cond.wait_for(lambda: self._rounds != seen, limit)
            return
        self._polling = True
        cq_seen = self._cq_head
        sq_seen = self._sq_head_word.value
        cq_tail, sq_head, state = self._cq_tail_word, self._sq_head_word, self._state
        self._cond.release()
        moved = False
        try:
            if self._spin_wait > 0:
                now = time.monotonic()
                until = now + self._spin_wait
                if deadline is not None and deadline < until:
                    until = deadline
                while True:
                    if (cq_tail.value != cq_seen or state.value
                            or ((head or self._head_waiters) and sq_head.value != sq_seen)):
                        moved = True
                        break
                    if time.monotonic() >= until:
                        break
            if not moved:
                libc = self._libc
                until = time.monotonic() + PARK_LIMIT_S
                if deadline is not None:
                    until = min(until, deadline)
                while True:
                    # The flag, then a last look: a daemon that posts after
                    # the look sees the flag and wakes this thread.
                    self._client_wait.value = 1
                    libc.fence()
                    watch_head = head or self._head_waiters
                    if (cq_tail.value != cq_seen or state.value
                            or (watch_head and sq_head.value != sq_seen)):
                        break
                    left = until - time.monotonic()
                    if left <= 0:
                        break
                    ts = _Timespec(int(left), int((left - int(left)) * 1e9))
                    libc.syscall(_SYS_FUTEX, ctypes.c_void_p(self._client_wait_at), _FUTEX_WAIT,
                                 1, ctypes.byref(ts), None, 0)
                    if watch_head:
                        break  # woken: the round ends, as for a completion
                self._client_wait.value = 0
        finally:
            self._cond.acquire()
            self._polling = False
            self._rounds += 1
            self._cond.notify_all()
        self._drain_locked()
        if not moved:
            self._check_closed_locked()

    def _drain_locked(self) -> None:
        """Takes the completions posted, wakes a daemon parked for their
        room, then looks at the ring's state."""
        if self.broken is not None:
            return
        self._take_completions_locked()
        if self.broken is not None:
            return
        # Room in the completion ring is what the daemon waits for only
        # while records are left to start (it parks for room before taking
        # one); one that took them all waits for records, and the next post
        # wakes it.
        if self._sq_head_word.value < self._tail:
            self._wake_daemon()
        # The state word only: a daemon that answers is there. The lifeline
        # is a system call (about 1-2 us), asked by rounds that saw nothing.
        self._check_closed_locked(lifeline=False)

    def _take_completions_locked(self) -> None:
        """Takes the completions posted up to the completion tail as read
        now into the results (or the deferred failure), and publishes the
        completion head."""
        tail = self._cq_tail_word.value
        head = self._cq_head
        cq_bytes = self._cq_bytes
        if tail < head or tail - head > cq_bytes or tail % SLOT:
            self._break_locked(Error(
                grpc.StatusCode.DATA_LOSS,
                f"gpuexec client: the daemon's completion tail {tail} is out of bounds (head "
                f"{head}, command ring {self.number})"))
            return
        view = self._view
        base = HEADER_BYTES + self._sq_bytes
        while head < tail:
            at = head % cq_bytes
            (kind, slots, code, command_id, _, gpu_ns, value0, value1, message_bytes,
             _) = COMPLETE.unpack_from(view, base + at)
            size = slots * SLOT
            if slots == 0 or size > cq_bytes - at or size > tail - head:
                self._break_locked(Error(
                    grpc.StatusCode.DATA_LOSS,
                    f"gpuexec client: a completion at {head} of command ring {self.number} "
                    f"takes {slots} slots, past what the daemon posted"))
                return
            head += size
            if kind == PAD:
                continue
            message = ""
            if code != 0:
                n = min(message_bytes, MAX_MESSAGE_BYTES, size - COMPLETE.size)
                start = base + at + COMPLETE.size
                message = bytes(view[start:start + n]).decode("utf-8", "replace")
            r = Result(code, message, kind, gpu_ns, value0, value1)
            if command_id in self._awaited:
                self._results[command_id] = r
            elif command_id in self._abandoned:
                self._abandoned.discard(command_id)
            elif code != 0 and self._deferred is None:
                self._deferred = error_of(code, message)
        self._cq_head = head
        self._cq_head_word.value = head

    def _check_closed_locked(self, lifeline: bool = True) -> None:
        """Breaks the ring when the daemon closed it (after taking the
        answers it posted before it said so), and with ``lifeline`` also
        when it hung up the ring's connection."""
        if self.broken is not None:
            return
        if self._state.value != OPEN:
            # The daemon posts a ring's last answers before it says closed:
            # those posted after the last drain read the completion tail are
            # taken now, so that a waiting command gets its answer rather
            # than the close.
            self._take_completions_locked()
            if self.broken is not None:
                return
            close = LAYOUT["header.close_message"][0]
            n = min(struct.unpack_from("<I", self._view, LAYOUT["header.close_message_bytes"][0])[0],
                    MAX_MESSAGE_BYTES)
            code = struct.unpack_from("<i", self._view, LAYOUT["header.close_code"][0])[0]
            message = bytes(self._view[close:close + n]).decode("utf-8", "replace")
            if not 0 < code <= 16:
                code = grpc.StatusCode.UNAVAILABLE.value[0]
            self._break_locked(error_of(code, message))
            return
        sock = self._lifeline if lifeline else None
        if sock is not None:
            ready, _, _ = select.select([sock], [], [], 0)
            if ready:
                self._break_locked(Error(
                    grpc.StatusCode.UNAVAILABLE,
                    f"gpuexec client: the daemon's host memory socket {self._socket_path} ended "
                    "the command ring's connection (the daemon went away or stopped serving "
                    "it)"))

    def _break_locked(self, why: Error) -> None:
        if self.broken is not None:
            return
        self.broken = why
        if self._last_unwaited > self._ordered_through and self._deferred is None:
            self._deferred = Error(why.code, "gpuexec client: launches queued without waiting "
                                             f"may not have run: {why.message}")
        self._cond.notify_all()

    # ------------------------------------------------------------ the rest

    def order(self, timeout: Optional[float] = None) -> None:
        """Waits until every record posted so far has started (the daemon's
        submission head reached them): an Execute barrier without a round
        trip."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            through = self._tail
            while True:
                if self.broken is not None:  # the memory may be unmapped
                    raise self.broken
                if self._sq_head_word.value >= through:
                    break
                if deadline is not None and time.monotonic() >= deadline:
                    raise Error(grpc.StatusCode.DEADLINE_EXCEEDED,
                                "gpuexec client: the daemon did not start the session's "
                                f"earlier commands within {timeout} s (command ring "
                                f"{self.number})")
                self._poll_for_head_locked(deadline)
            if self._last_unwaited > self._ordered_through:
                self._ordered_through = self._last_unwaited

    def barrier(self) -> None:
        """Where commands were posted without waiting since the last wait,
        a barrier that waits for them to start (and raises the first
        failure among them, as the Execute stream's barrier does)."""
        with self._cond:
            needed = self._last_unwaited > self._ordered_through
        if needed:
            self.post(BARRIER, b"", True)

    def take_deferred(self) -> Optional[Error]:
        """The first failure of a command posted without waiting, not yet
        raised; cleared."""
        with self._cond:
            deferred, self._deferred = self._deferred, None
            return deferred

    def check(self) -> Optional[Error]:
        """Why the ring no longer serves (None while it does), looking at
        the answers posted meanwhile."""
        with self._cond:
            if self.broken is None and not self._polling:
                self._drain_locked()
                self._check_closed_locked()
            return self.broken

    def shutdown(self) -> None:
        """Takes no more commands; waiting calls end with the same error."""
        with self._cond:
            self._break_locked(Error(grpc.StatusCode.FAILED_PRECONDITION,
                                     "gpuexec client: the session is closed"))

    def close(self) -> None:
        """Ends the ring: the lifeline closes (the daemon stops serving it)
        and the memory is unmapped once no thread waits on it."""
        with self._cond:
            self._break_locked(Error(grpc.StatusCode.FAILED_PRECONDITION,
                                     "gpuexec client: the session is closed"))
            while self._polling:
                self._cond.wait(PARK_LIMIT_S)
            lifeline, self._lifeline = self._lifeline, None
            if lifeline is not None:
                lifeline.close()
            self._unmap()
