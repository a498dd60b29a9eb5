"""A session's command stream: its launches and synchronizes as commands on
one open Execute call, as the C++ client sends them.

- A waiting command (a launch, a synchronize, the barrier before a copy)
  is sent by the calling thread and answered on it: the calling thread
  polls the call's completion queue itself, as grpcio's own blocking unary
  call does, so no thread hand-off lies on the way out or back. grpcio's
  public streaming API consumes a request iterator on a thread of its own
  and delivers answers through another: two hand-offs per round trip, which
  made a message on the stream answer later than a unary call.
- Commands queued without waiting (``Function.launch_async``) are sent in
  batches: each message carries everything queued since the last one went
  out (up to 2048 commands), sent by the caller when the stream is idle and
  otherwise by the stream's pump thread once the message before is on the
  wire.
- A failure the daemon finds in a command nobody waits for is raised by the
  session's next waiting call (a launch, a synchronize, or a copy, read,
  write, memset or free, each of which first waits on a barrier for the
  launches queued before it), once, with the daemon's code and message, as
  CUDA reports asynchronous errors. A stream that breaks fails the commands
  waiting on it with its status; the next command opens a new one.

The Execute call itself, on grpcio's core or its public API: _execute_call.py.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Dict, List, Optional

import grpc

from . import _wire
from ._errors import Error, naming_daemon
from ._execute_call import CODES, INITIAL, RECV, SEND, STATUS, Call
from .v1 import gpuexec_pb2 as pb

if TYPE_CHECKING:
    from ._client import Client

# Commands in one message (the daemon takes at most 4096; the C++ client
# sends at most 1024), and bytes: a launch's parameters are at most 32 KiB.
# While the caller keeps queueing, the pump waits for the interpreter lock
# between messages (the 90th percentile of the gaps between sends was
# 9.4-15.5 ms on the 2-core test host), so one message must carry what is
# queued meanwhile: there, 2048 queued 107-273k launches/s where 1024 did
# 85-188k and 4096 86-167k (runs in turn, test double).
MAX_COMMANDS_PER_MESSAGE = 2048
MAX_MESSAGE_BYTES = 4 << 20
# Commands queued without waiting and not yet sent, beyond which
# launch_async waits for the wire.
MAX_QUEUED = 8192
# An idle pump thread ends after this long (the next queued launch starts
# another).
PUMP_IDLE_S = 1.0

# A command's answer: its gpuexec.v1.CommandResult, or the Error that ended
# its wait.
Answer = Any


def _error_of(result: Any) -> Error:
    return Error(CODES.get(result.code, grpc.StatusCode.UNKNOWN), result.message)


class Later:
    """The answer to come of a command queued with CommandStream.submit_later."""

    __slots__ = ("_stream", "_id", "_answer", "_lock")

    def __init__(self, stream: CommandStream, command_id: int) -> None:
        self._stream = stream
        self._id = command_id
        self._answer: Answer = None
        self._lock = threading.Lock()  # one thread collects the answer

    def result(self) -> Any:
        """The command's CommandResult, once answered; raises its error."""
        with self._lock:
            if self._answer is None:
                try:
                    self._answer = self._stream._result_of(self._id)
                except Error as e:
                    self._answer = e
        if isinstance(self._answer, Error):
            raise self._answer
        return self._answer


class CommandStream:
    """The Execute call of one session, opened on first use (and again after
    one breaks). Thread-safe."""

    def __init__(self, client: Client, token: str) -> None:
        self._client = client
        self._token = token
        self._cond = threading.Condition(threading.Lock())
        self._call: Optional[Call] = None  # the current call
        self._first = True  # the next message opens the call (names the session)
        self._pending: List[bytes] = []  # commands (ExecuteRequest fields) not yet sent
        self._next_id = 1
        # The last command queued without waiting, and the last command the
        # daemon is known to have started every command up to.
        self._last_unwaited = 0
        self._ordered_through = 0
        self._awaited: Dict[int, Answer] = {}  # id -> None, then its CommandResult or Error
        # The first failure nobody waited for, not yet raised.
        self._deferred: Optional[Error] = None
        self._sending = False  # a message of the current call is on its way
        self._polling = False  # a thread waits in the call's next_event
        self._waiters = 0  # threads waiting for an answer (they poll themselves)
        # The thread that polls for queued commands' sends.
        self._pump: Optional[threading.Thread] = None
        self._closing = False

    # ------------------------------------------------------------ commands

    def submit(self, op: bytes, wait: bool) -> Any:
        """Sends a command (``op``: a Command's operation field, see _wire).
        With ``wait``, returns its CommandResult once answered, or raises its
        error, or first an earlier command's; without, returns None once
        queued."""
        with self._cond:
            self._open_locked()
            command_id = self._next_id
            self._next_id += 1
            command = _wire.command_field(command_id, wait, op)
            if not wait:
                if len(self._pending) >= MAX_QUEUED:
                    self._wait_for_room_locked()
                    self._open_locked()
                self._pending.append(command)
                self._last_unwaited = command_id
                if not self._sending:
                    self._flush_locked()
                return None
            self._awaited[command_id] = None
            self._pending.append(command)
            self._waiters += 1
            try:
                if not self._sending:
                    self._flush_locked()
                answer = self._await_locked(command_id)
            finally:
                self._waiters -= 1
                self._awaited.pop(command_id, None)
                if self._sending and not self._polling:
                    self._wake_pump_locked()
            deferred, self._deferred = self._deferred, None
        if deferred is not None:
            raise deferred
        if isinstance(answer, Error):
            raise answer
        if answer.code != 0:
            raise _error_of(answer)
        return answer

    def submit_later(self, op: bytes) -> Later:
        """Queues a command whose answer is wanted, without waiting for it:
        returns a Later whose ``result()`` waits for the answer (the
        CommandResult, or raises its error). Earlier commands' failures are
        raised by the session's next waiting call, not by this one."""
        with self._cond:
            self._open_locked()
            command_id = self._next_id
            self._next_id += 1
            self._awaited[command_id] = None
            self._pending.append(_wire.command_field(command_id, True, op))
            self._last_unwaited = command_id
            if not self._sending:
                self._flush_locked()
        return Later(self, command_id)

    def _result_of(self, command_id: int) -> Any:
        with self._cond:
            if command_id not in self._awaited:  # taken already (an interrupted wait)
                raise Error(grpc.StatusCode.FAILED_PRECONDITION,
                            f"gpuexec client: command {command_id}'s answer is no longer "
                            "held (a wait for it was interrupted)")
            self._waiters += 1
            try:
                answer = self._await_locked(command_id)
            finally:
                self._waiters -= 1
                self._awaited.pop(command_id, None)
                if self._sending and not self._polling:
                    self._wake_pump_locked()
        if isinstance(answer, Error):
            raise answer
        if answer.code != 0:
            raise _error_of(answer)
        return answer

    def order(self) -> None:
        """Waits until the commands queued without waiting have been started
        by the daemon (a barrier), so that a call outside the stream sees
        their effects; raises an earlier command's failure."""
        with self._cond:
            needed = self._last_unwaited > self._ordered_through
            deferred = None
            if not needed and self._deferred is not None:
                deferred, self._deferred = self._deferred, None
        if deferred is not None:
            raise deferred
        if needed:
            self.submit(_wire.BARRIER_OP, wait=True)

    def close(self) -> None:
        """Ends the call (commands not yet sent are dropped) and waits until
        it has given its last event. A later command opens another."""
        with self._cond:
            self._closing = True
            try:
                call = self._call
                if call is not None and not call.ended:
                    call.cancel("gpuexec client: the session's command stream was closed")
                self._drain_locked(call)
            finally:
                self._closing = False
                self._cond.notify_all()

    # ------------------------------------------------------------ internals

    def _open_locked(self) -> None:
        call = self._call
        if call is not None and call.ended:
            # A call that broke is replaced once it has given its last event.
            self._drain_locked(call)
            call = self._call
        if call is None:
            try:
                call = self._client._open_execute()
            except ValueError as e:  # grpcio's word for a closed channel
                raise Error(grpc.StatusCode.FAILED_PRECONDITION,
                            f"gpuexec client: cannot open the session's command stream: {e}") \
                    from None
            self._call = call
            self._first = True
            self._sending = False
            self._client._stream_opened(self)

    def _drain_locked(self, call: Optional[Call]) -> None:
        """Polls ``call`` (or waits for the thread polling it) until it has
        given all its events."""
        while call is not None and self._call is call:
            if call.due == 0:
                self._retire_locked(call)
                break
            if self._polling:
                self._cond.wait()
            else:
                self._poll_locked(call)

    def _wait_for_room_locked(self) -> None:
        call = self._call
        self._wake_pump_locked()
        while (len(self._pending) >= MAX_QUEUED and call is not None and self._call is call
               and not call.ended):
            self._cond.wait()

    def _flush_locked(self) -> None:
        """Sends the commands pending as one message if none is on its way."""
        call = self._call
        if self._sending or not self._pending or call is None or call.ended:
            return
        pending = self._pending
        count, size = 0, 0
        for command in pending:
            if count == MAX_COMMANDS_PER_MESSAGE or (count and size + len(command) >
                                                      MAX_MESSAGE_BYTES):
                break
            count += 1
            size += len(command)
        batch = pending[:count]
        if self._first:
            batch.insert(0, _wire.session_field(self._token))
        data = b"".join(batch)
        # A receive goes with the send as one batch (one event, not two) when
        # an answer is sure to come: someone waits for one, and what it
        # answers is sent by now. Otherwise the two go apart: queued launches
        # need the send's event as soon as it is on the wire.
        send_receive = call.send_receive
        together = (not call.receiving and send_receive is not None
                    and count == len(pending) and None in self._awaited.values())
        if together and send_receive is not None:
            sent = send_receive(data)
        else:
            sent = call.send(data)
        if sent:
            call.due += 1
            self._sending = True
            self._first = False
            del pending[:count]
            if together:
                call.receiving = True
            else:
                self._receive_locked(call)
            if len(pending) < MAX_QUEUED:
                self._cond.notify_all()  # a caller waiting for room
            if self._waiters == 0 and not self._polling:
                self._wake_pump_locked()
        else:
            # The call is ending: its events say why; the commands are
            # dropped with it.
            call.ended = True
            self._wake_pump_locked()

    def _receive_locked(self, call: Call) -> None:
        if not call.receiving and not call.ended and call.receive():
            call.due += 1
            call.receiving = True

    def _await_locked(self, command_id: int) -> Answer:
        while True:
            answer = self._awaited.get(command_id)
            if answer is not None:
                return answer
            call = self._call
            if call is None or call.due == 0:
                return Error(grpc.StatusCode.UNAVAILABLE,
                             "gpuexec client: the session's command stream ended")
            if self._polling:
                self._cond.wait()
            else:
                self._poll_locked(call)

    def _poll_locked(self, call: Call) -> None:
        """Takes and handles one event of ``call`` (called holding the lock,
        which is let go while waiting)."""
        self._polling = True
        try:
            self._cond.release()
            try:
                tag, ok, payload = call.next_event()
            finally:
                self._cond.acquire()
        except BaseException:
            self._polling = False
            self._interrupted_locked(call)
            raise
        self._polling = False
        call.due -= 1
        if tag == STATUS:
            code, details = payload
            self._break_locked(call, code, details)
        elif tag != INITIAL:
            sent = tag != RECV  # a send's event (or a send and a receive's)
            if sent:
                self._sending = False
                if not ok:
                    call.ended = True
            if tag != SEND:
                call.receiving = False
                if payload is not None:
                    self._answers_locked(call, payload)
                    # Another receive now while answers are due or messages
                    # are going out (the daemon's answers to queued launches
                    # must not pile up unread); else with the next message.
                    if self._sending or None in self._awaited.values():
                        self._receive_locked(call)
            if sent and ok and call is self._call:
                self._flush_locked()
        if call.due == 0 and call.ended:
            self._retire_locked(call)
        self._cond.notify_all()

    def _answers_locked(self, call: Call, message: bytes) -> None:
        try:
            response = pb.ExecuteResponse.FromString(message)
        except Exception:  # pylint: disable=broad-except
            call.cancel("gpuexec client: a message of the daemon is not an ExecuteResponse")
            return
        for r in response.results:
            if r.id in self._awaited:
                self._awaited[r.id] = r
                # The daemon starts commands in order: all before it started.
                if r.id > self._ordered_through:
                    self._ordered_through = r.id
            elif r.code != 0 and self._deferred is None:
                self._deferred = _error_of(r)

    def _break_locked(self, call: Call, code: grpc.StatusCode, details: str) -> None:
        call.ended = True
        if self._closing:
            why = Error(grpc.StatusCode.CANCELLED,
                        "gpuexec client: the session's command stream was closed while this "
                        "command waited")
        elif code == grpc.StatusCode.OK:
            daemon = f"daemon {self._client.target}" if self._client.target else "the daemon"
            why = Error(grpc.StatusCode.UNAVAILABLE,
                        f"gpuexec client: {daemon} ended the session's command stream")
        else:
            why = Error(code, naming_daemon(code, details, self._client.target))
        call.why = why
        if call is not self._call:
            return
        for command_id, answer in self._awaited.items():
            if answer is None:
                self._awaited[command_id] = why
        if self._last_unwaited > self._ordered_through:
            # Closing drops them knowingly; otherwise the next waiting call
            # says they may be lost.
            if self._deferred is None and not self._closing:
                self._deferred = Error(why.code, f"{why.message} (launches queued without "
                                                 "waiting may not have run)")
            self._ordered_through = self._last_unwaited
        self._pending.clear()

    def _retire_locked(self, call: Call) -> None:
        if self._call is call:
            self._call = None
            self._sending = False
            self._pending.clear()
            self._client._stream_closed(self)
        self._cond.notify_all()

    def _interrupted_locked(self, call: Call) -> None:
        """A signal's exception interrupted a wait for ``call``'s next event."""
        try:
            call.cancel("gpuexec client: interrupted")
        except Exception:  # pylint: disable=broad-except
            pass
        if not call.alive():
            # grpcio tore the call down: no event will come.
            self._break_locked(call, grpc.StatusCode.CANCELLED, "gpuexec client: interrupted")
            call.due = 0
            self._retire_locked(call)
        else:
            call.ended = True
            self._wake_pump_locked()
        self._cond.notify_all()

    # ------------------------------------------------------------ the pump

    def _wake_pump_locked(self) -> None:
        if self._pump is None:
            self._pump = threading.Thread(target=self._pump_loop, name="gpuexec-execute-pump",
                                          daemon=True)
            self._pump.start()
        else:
            self._cond.notify_all()

    def _pump_work_locked(self) -> bool:
        call = self._call
        return (call is not None and call.due > 0 and (self._sending or call.ended)
                and not self._polling and self._waiters == 0)

    def _pump_loop(self) -> None:
        me = threading.current_thread()
        with self._cond:
            while self._pump is me:
                call = self._call
                if call is not None and self._pump_work_locked():
                    try:
                        self._poll_locked(call)
                    except BaseException:  # pylint: disable=broad-except
                        pass
                    continue
                if not self._cond.wait(PUMP_IDLE_S) and not self._pump_work_locked():
                    if self._pump is me:
                        self._pump = None
                    return
