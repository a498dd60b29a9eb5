"""A session's commands on its command ring where the daemon serves one
(_ring), and on the Execute stream (_commands) otherwise.

The ring is registered at the session's first launch or synchronize. A
registration the daemon refuses, a command the ring has no record for, and
a ring the daemon closed all go to the stream, each said once on the
"gpuexec" logger at DEBUG. Whichever carries a command, it starts after the
session's earlier ones: a switch between the two first waits for the
other's commands to have started (the ring's submission head, the stream's
barrier).
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Optional

from . import _ring
from ._commands import CommandStream, Later
from ._errors import Error

_log = logging.getLogger("gpuexec")


class SessionCommands:
    """What a Session calls ``_commands``: CommandStream's calls, and
    ``ring()``/``post()`` for the callers that have a record."""

    def __init__(self, stream: CommandStream,
                 open_ring: Optional[Callable[[], _ring.CommandRing]]) -> None:
        self._stream = stream
        self._open_ring = open_ring
        self._lock = threading.Lock()
        self._ring: Optional[_ring.CommandRing] = None
        self._tried = open_ring is None
        self._closed = False
        # Commands went on the stream since the ring last carried one (the
        # ring's next waits for them to start), and the other way round.
        self._stream_since_ring = False
        self._ring_since_stream = False
        # A dropped ring's failure nobody has been told of yet.
        self._deferred: Optional[Error] = None

    def ring(self) -> Optional[_ring.CommandRing]:
        """The ring to post on, registered at the first call; None where
        the stream carries everything."""
        ring = self._ring
        if ring is not None and ring.broken is None:
            return ring
        if self._tried and ring is None:
            return None
        with self._lock:
            if self._closed:
                return None
            if not self._tried:
                assert self._open_ring is not None
                try:
                    self._ring = self._open_ring()
                    _log.debug("command ring: ring %d carries session commands",
                               self._ring.number)
                except Error as e:
                    self._ring = None
                    _log.debug("command ring: %s; using the Execute stream", e.message)
                finally:
                    # Only now: a thread that comes meanwhile waits for the
                    # lock rather than take the stream.
                    self._tried = True
            ring = self._ring
            if ring is not None and ring.broken is not None:
                self._drop_locked(ring)
                ring = None
            return ring

    def _drop_locked(self, ring: _ring.CommandRing) -> None:
        why = ring.broken
        deferred = ring.take_deferred()
        if deferred is not None and self._deferred is None:
            self._deferred = deferred
        _log.debug("command ring: %s; using the Execute stream",
                   why.message if why is not None else "closed")
        ring.close()
        self._ring = None

    def post(self, ring: _ring.CommandRing, kind: int, body: bytes, wait: bool) -> Any:
        """Posts a record on ``ring`` (from ring()), after the stream's
        earlier commands have started."""
        if self._stream_since_ring:
            self._stream_since_ring = False
            self._stream.order()
        self._ring_since_stream = True
        try:
            return ring.post(kind, body, wait)
        except Error:
            if ring.broken is not None:
                with self._lock:
                    if self._ring is ring:
                        self._drop_locked(ring)
            raise

    def _to_stream(self, wait: bool) -> Optional[Error]:
        """Before a command goes on the stream: the ring's earlier commands
        started; returns the failure the ring (or a dropped one) has not
        reported, for a waiting command to raise."""
        ring = self.ring()
        if ring is not None and self._ring_since_stream:
            try:
                ring.order()
            except Error:
                if ring.broken is None:
                    raise
        self._ring_since_stream = False
        self._stream_since_ring = True
        if not wait:
            return None
        with self._lock:
            deferred, self._deferred = self._deferred, None
        if deferred is None and ring is not None:
            deferred = ring.take_deferred()
        return deferred

    def submit(self, op: bytes, wait: bool, record: Optional[tuple] = None) -> Any:
        """CommandStream.submit; on the ring where ``record`` (kind, body)
        is given and a ring serves."""
        if record is not None:
            ring = self.ring()
            if ring is not None:
                return self.post(ring, record[0], record[1], wait)
        deferred = self._to_stream(wait)
        answer = self._stream.submit(op, wait)
        if deferred is not None:
            raise deferred
        return answer

    def submit_later(self, op: bytes) -> Later:
        """CommandStream.submit_later, on the stream."""
        self._to_stream(False)
        return self._stream.submit_later(op)

    def order(self) -> None:
        """Waits until the commands queued without waiting have started;
        raises an earlier command's failure."""
        ring = self._ring
        if ring is not None:
            if ring.broken is None:
                try:
                    ring.barrier()
                except Error:
                    if ring.broken is None:
                        raise
            with self._lock:
                if self._ring is ring and ring.broken is not None:
                    self._drop_locked(ring)
        with self._lock:
            deferred, self._deferred = self._deferred, None
        if deferred is None and ring is not None:
            deferred = ring.take_deferred()
        if deferred is not None:
            raise deferred
        self._stream.order()

    def close(self) -> None:
        """Ends both: the ring takes no more commands (its lifeline stays
        open until finish(), since its end closes the session on the
        daemon) and the stream is closed."""
        with self._lock:
            self._closed = True
            ring = self._ring
        if ring is not None:
            ring.shutdown()
        self._stream.close()

    def finish(self) -> None:
        """After the session's close: the ring's lifeline and memory go."""
        with self._lock:
            self._closed = True
            ring, self._ring = self._ring, None
        if ring is not None:
            ring.close()
