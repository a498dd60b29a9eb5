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
import select
import socket
import struct
import threading
import time
from typing import Any, Dict, Optional, Set

import grpc

from . import _host_memory
from ._errors import Error
from .v1 import gpuexec_pb2 as pb

# Re-exported: callers name them as _ring.X.
from ._ring_layout import (  # noqa: F401
    ALLOCATE, ANSWER_AREA, ANSWER_AREA_VERSION, BARRIER, BEGIN_GRAPH, COMPLETE, COPY_BUFFER,
    END_GRAPH, FREE, HEAD, HEADER_BYTES, LAUNCH, LAUNCH_GRAPH, LAYOUT, MAGIC, MAX_MESSAGE_BYTES,
    MAX_PARAM_BLOCK_BYTES, MAX_RECORD_BYTES, MEMSET, OPEN, PAD, REGION_COPY, RELEASE_REGION, REPLY,
    SLOT, SYNCHRONIZE, VERSION)
from ._ring_sys import (  # noqa: F401
    FUTEX_WAIT, FUTEX_WAKE, SYS_FUTEX, Timespec, get_libc, supported)

# The ring's sizes: 256 KiB holds about 2,000 launches of a few arguments.
SUBMISSION_BYTES = 256 << 10
COMPLETION_BYTES = 64 << 10
# The answer area's: 256 answers, more than a session's threads wait for at
# once. Ids answered there are kept this long to drop a second answer.
ANSWER_BYTES = 16 << 10
DIRECT_KEPT = 1024
# The longest a waiting thread sleeps before it looks at the ring's state
# and its lifeline again.
PARK_LIMIT_S = 0.1

_CODES = {code.value[0]: code for code in grpc.StatusCode}


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
                 spin_wait: float, answer_area: bool = False) -> None:
        self._sq_bytes = SUBMISSION_BYTES
        self._cq_bytes = COMPLETION_BYTES
        # With an answer area (a daemon of layout version 2), the device's
        # worker posts the successes of waiting launches there itself.
        self._aq_bytes = ANSWER_BYTES if answer_area else 0
        self._bytes = HEADER_BYTES + self._sq_bytes + self._cq_bytes + self._aq_bytes
        self._spin_wait = spin_wait
        self._socket_path = socket_path
        self._libc = get_libc()
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
                c.layout_version = ANSWER_AREA_VERSION if self._aq_bytes else VERSION
                c.submission_bytes = self._sq_bytes
                c.completion_bytes = self._cq_bytes
                c.answer_bytes = self._aq_bytes
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
        self._aq_head = 0
        # The last ids answered in the answer area, whose second answer in
        # the completion ring (a worker that ended right after its post) is
        # dropped: the first counts.
        self._direct: Dict[int, None] = {}
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
        self._aq_tail_word = u64.from_address(a + LAYOUT["header.aq_tail"][0])
        self._aq_head_word = u64.from_address(a + LAYOUT["header.aq_head"][0])
        self._daemon_wait_at = a + LAYOUT["header.daemon_wait"][0]
        self._client_wait_at = a + LAYOUT["header.client_wait"][0]

    def _write_header(self) -> None:
        struct.pack_into("<QIIQQQQI", self._view, 0, MAGIC, VERSION, HEADER_BYTES,
                         HEADER_BYTES, self._sq_bytes, HEADER_BYTES + self._sq_bytes,
                         self._cq_bytes, SLOT)
        if self._aq_bytes:
            struct.pack_into("<I", self._view, LAYOUT["header.flags"][0], ANSWER_AREA)
            struct.pack_into("<QQ", self._view, LAYOUT["header.aq_offset"][0],
                             HEADER_BYTES + self._sq_bytes + self._cq_bytes, self._aq_bytes)

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
            libc.syscall(SYS_FUTEX, ctypes.c_void_p(self._daemon_wait_at), FUTEX_WAKE, 1,
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
        # Without an area, its tail word stays 0 and so does the head.
        aq_seen, aq_tail = self._aq_head, self._aq_tail_word
        self._cond.release()
        moved = False
        try:
            if self._spin_wait > 0:
                now = time.monotonic()
                until = now + self._spin_wait
                if deadline is not None and deadline < until:
                    until = deadline
                while True:
                    if (cq_tail.value != cq_seen or aq_tail.value != aq_seen or state.value
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
                    if (cq_tail.value != cq_seen or aq_tail.value != aq_seen or state.value
                            or (watch_head and sq_head.value != sq_seen)):
                        break
                    left = until - time.monotonic()
                    if left <= 0:
                        break
                    ts = Timespec(int(left), int((left - int(left)) * 1e9))
                    libc.syscall(SYS_FUTEX, ctypes.c_void_p(self._client_wait_at), FUTEX_WAIT,
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
        completion head; then the answer area's answers, up to its tail as
        read before the completion tail (a failure posted before a later
        command's answer is taken first)."""
        aq_tail = self._aq_tail_word.value if self._aq_bytes else 0
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
            if command_id in self._direct:
                del self._direct[command_id]
                continue  # answered in the answer area already: the first counts
            r = Result(code, message, kind, gpu_ns, value0, value1)
            if command_id in self._awaited:
                self._results[command_id] = r
            elif command_id in self._abandoned:
                self._abandoned.discard(command_id)
            elif code != 0 and self._deferred is None:
                self._deferred = error_of(code, message)
        self._cq_head = head
        self._cq_head_word.value = head
        if self._aq_bytes and aq_tail != self._aq_head:
            self._take_answers_locked(aq_tail)

    def _take_answers_locked(self, tail: int) -> None:
        """Takes the worker's answers up to ``tail`` (each a success of one
        slot) and publishes the answer area's head."""
        head, aq_bytes = self._aq_head, self._aq_bytes
        if tail < head or tail - head > aq_bytes or tail % SLOT:
            self._break_locked(Error(
                grpc.StatusCode.DATA_LOSS,
                f"gpuexec client: the daemon's answer area tail {tail} is out of bounds (head "
                f"{head}, command ring {self.number})"))
            return
        view = self._view
        base = HEADER_BYTES + self._sq_bytes + self._cq_bytes
        direct = self._direct
        while head < tail:
            (kind, slots, code, command_id, _, gpu_ns, _, _, _,
             _) = COMPLETE.unpack_from(view, base + head % aq_bytes)
            if slots != 1 or code != 0:
                self._break_locked(Error(
                    grpc.StatusCode.DATA_LOSS,
                    f"gpuexec client: an answer at {head} of command ring {self.number} is not "
                    f"a success of one slot ({slots} slots, code {code})"))
                return
            head += SLOT
            if command_id in self._results:
                continue  # answered in the completion ring first: that one counts
            direct[command_id] = None
            if len(direct) > DIRECT_KEPT:
                del direct[next(iter(direct))]
            if command_id in self._awaited:
                self._results[command_id] = Result(0, "", kind, gpu_ns, 0, 0)
            else:
                self._abandoned.discard(command_id)
        self._aq_head = head
        self._aq_head_word.value = head

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
