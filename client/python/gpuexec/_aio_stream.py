"""An asyncio session's command stream: its launches, synchronizes,
allocations, memsets and frees as commands on one open Execute call (grpc.aio),
and the order in which its copies (Read, Write: calls of their own) run
among them.

Everything a session is asked to do enters one queue, in the order the
calls started (a coroutine's first step puts its entry there, before any
await). One task of the session, the sequencer, takes the queue in order:

- commands go out in batches (each message carries what was queued since
  the last one, up to 2048 commands); a command someone waits for is
  answered through a future, resolved by the stream's reader task;
- a copy is a gate: once every command queued before it has been started
  by the daemon (a barrier on the stream, when any may not have been), the
  copy's caller is given its turn and makes its call; the sequencer goes on
  when that call has ended. Reads one after another share one turn.

A failure of a command nobody waits for (``launch_async``) is raised, once,
by the session's next call that waits (a launch, synchronize, a copy, an
allocation, a memset or free), as CUDA reports asynchronous errors. A stream
that breaks fails the commands waiting on it with its status; the next
command opens a new one.
"""

from __future__ import annotations

import asyncio
import collections
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple, Union

import grpc
import grpc.aio

from . import _wire
from ._commands import MAX_COMMANDS_PER_MESSAGE, MAX_MESSAGE_BYTES, MAX_QUEUED
from ._errors import Error, naming_daemon, short_token
from ._execute_call import METHOD
from .v1 import gpuexec_pb2 as pb

_CODES = {code.value[0]: code for code in grpc.StatusCode}


def error_of(result: Any) -> Error:
    """The Error of a failed CommandResult."""
    return Error(_CODES.get(result.code, grpc.StatusCode.UNKNOWN), result.message)


class Gate:
    """A copy's place in the session's queue: ``turn`` is resolved when the
    copy may start (or fails with an earlier command's error), and the
    caller resolves ``done`` (finish()) when its call has ended."""

    __slots__ = ("reading", "turn", "done")

    def __init__(self, loop: asyncio.AbstractEventLoop, reading: bool) -> None:
        self.reading = reading
        self.turn: asyncio.Future = loop.create_future()
        self.done: asyncio.Future = loop.create_future()

    def finish(self) -> None:
        """The copy's call has ended (or was never made)."""
        if not self.done.done():
            self.done.set_result(None)


_Entry = Union[Tuple[int, bytes], Gate]


class AsyncCommandStream:
    """The queue and Execute call of one asyncio session. Not thread-safe:
    all of its calls run on the event loop that made it."""

    def __init__(self, open_call: Callable[[], Any], token: str, target: Optional[str],
                 check_client: Callable[[], None]) -> None:
        self._open_call = open_call  # a new Execute call (grpc.aio StreamStreamCall)
        self._check_client = check_client  # raises once the client is closed
        self._token = token
        self._target = target
        self._loop = asyncio.get_running_loop()
        self._queue: Deque[_Entry] = collections.deque()
        self._queued_commands = 0  # commands in the queue, not yet sent
        self._room = asyncio.Event()
        self._awaited: Dict[int, asyncio.Future] = {}
        self._next_id = 1
        self._issued_through = 0  # the last command id sent
        self._ordered_through = 0  # every command up to it was started by the daemon
        self._unwaited_through = 0  # the last command sent that nobody waits for
        self._deferred: Optional[Error] = None
        self._call: Any = None
        self._first = True
        self._reader: Optional[asyncio.Task] = None
        self._sequencer: Optional[asyncio.Task] = None
        self._closed = False

    # ------------------------------------------------------------ callers

    def queue(self, op: bytes, wait: bool) -> Optional[asyncio.Future]:
        """Queues a command (``op``: a Command's operation field, see _wire),
        at once; with ``wait`` returns the future of its CommandResult."""
        self._check_open()
        command_id = self._next_id
        self._next_id += 1
        future = None
        if wait:
            future = self._loop.create_future()
            self._awaited[command_id] = future
        self._queue.append((command_id, _wire.command_field(command_id, wait, op)))
        self._queued_commands += 1
        self._kick()
        return future

    async def submit(self, op: bytes) -> Any:
        """Queues a command and returns its CommandResult once answered, or
        raises its error (or first an earlier unwaited command's)."""
        future = self.queue(op, wait=True)
        assert future is not None
        try:
            result = await future
        except Error:
            self.raise_deferred()
            raise
        self.raise_deferred()
        if result.code != 0:
            raise error_of(result)
        return result

    async def submit_unwaited(self, op: bytes) -> None:
        """Queues a command nobody waits for; waits only while more than
        MAX_QUEUED commands are queued and not yet sent."""
        self.queue(op, wait=False)
        while self._queued_commands > MAX_QUEUED and not self._closed:
            self._room.clear()
            await self._room.wait()

    def gate(self, reading: bool) -> Gate:
        """A place in the queue for a copy (see Gate), at once."""
        self._check_open()
        gate = Gate(self._loop, reading)
        self._queue.append(gate)
        self._kick()
        return gate

    def raise_deferred(self) -> None:
        """Raises, once, the failure of a command nobody waited for."""
        deferred, self._deferred = self._deferred, None
        if deferred is not None:
            raise deferred

    async def close(self) -> None:
        """Ends the call; commands not yet sent are dropped, and calls
        waiting fail with CANCELLED."""
        if self._closed:
            return
        self._closed = True
        why = Error(grpc.StatusCode.CANCELLED,
                    f"gpuexec client: session {short_token(self._token)} was closed while "
                    "this call waited")
        for entry in self._queue:
            if isinstance(entry, Gate) and not entry.turn.done():
                entry.turn.set_exception(why)
        self._queue.clear()
        self._queued_commands = 0
        self._room.set()
        tasks = [t for t in (self._sequencer, self._reader) if t is not None]
        if self._sequencer is not None:
            self._sequencer.cancel()
        if self._call is not None:
            self._call.cancel()
        for task in tasks:
            try:
                await task
            except BaseException:  # pylint: disable=broad-except
                pass
        for future in self._awaited.values():
            if not future.done():
                future.set_exception(why)
        self._awaited.clear()

    def _check_open(self) -> None:
        self._check_client()
        if self._closed:
            raise Error(grpc.StatusCode.FAILED_PRECONDITION,
                        f"gpuexec client: session {short_token(self._token)} was closed by "
                        "close(): open a new session")

    # ------------------------------------------------------------ sequencer

    def _kick(self) -> None:
        if self._sequencer is None:
            self._sequencer = self._loop.create_task(self._run())

    async def _run(self) -> None:
        try:
            while self._queue:
                head = self._queue[0]
                if isinstance(head, Gate):
                    self._queue.popleft()
                    gates = [head]
                    while head.reading and self._queue:
                        after = self._queue[0]
                        if not isinstance(after, Gate) or not after.reading:
                            break
                        gates.append(after)
                        self._queue.popleft()
                    await self._pass(gates)
                else:
                    await self._send_batch()
        finally:
            self._sequencer = None

    async def _pass(self, gates: List[Gate]) -> None:
        """Gives ``gates`` their turn once the commands before them are
        started, and waits until their calls have ended."""
        error: Optional[Error] = None
        if self._issued_through > self._ordered_through:
            barrier = self.queue(_wire.BARRIER_OP, wait=True)
            assert barrier is not None
            # The barrier goes out ahead of anything queued meanwhile.
            self._queue.rotate(1)
            await self._send_batch(limit=1)
            try:
                result = await barrier
                if result.code != 0:
                    error = error_of(result)
            except Error as e:
                error = e
        if error is None and self._deferred is not None:
            error, self._deferred = self._deferred, None
        for gate in gates:
            if gate.turn.done():  # its caller was cancelled meanwhile
                continue
            if error is not None:
                gate.turn.set_exception(error)
                error = None  # told once; the others go on
            else:
                gate.turn.set_result(None)
        for gate in gates:
            # Shielded: closing the session cancels this task, not the gate.
            await asyncio.shield(gate.done)

    async def _send_batch(self, limit: int = MAX_COMMANDS_PER_MESSAGE) -> None:
        """Sends the commands at the head of the queue (up to the next gate)
        as one message."""
        batch: List[bytes] = []
        size = 0
        last_id = self._issued_through
        while self._queue and len(batch) < limit:
            head = self._queue[0]
            if isinstance(head, Gate) or (batch and size + len(head[1]) > MAX_MESSAGE_BYTES):
                break
            self._queue.popleft()
            last_id, command = head
            batch.append(command)
            size += len(command)
            if last_id not in self._awaited:
                self._unwaited_through = last_id
        if not batch:
            return
        self._queued_commands -= len(batch)
        if self._queued_commands <= MAX_QUEUED:
            self._room.set()
        self._issued_through = last_id
        try:
            call = self._open()
        except Error as e:
            self._fail_sent(e)
            return
        if self._first:
            batch.insert(0, _wire.session_field(self._token))
            self._first = False
        try:
            await call.write(b"".join(batch))
        except asyncio.CancelledError:
            raise
        except grpc.RpcError as e:
            self._broken(call, e.code() or grpc.StatusCode.UNKNOWN, e.details() or "")
        except Exception:  # pylint: disable=broad-except
            # grpc.aio's word for a write to a call that ended: the reader
            # gives its status, or has given it.
            self._broken(call, grpc.StatusCode.UNAVAILABLE, "")

    # ------------------------------------------------------------ Execute call

    def _open(self) -> Any:
        if self._call is None:
            try:
                self._call = self._open_call()
            except (ValueError, RuntimeError, grpc.aio.UsageError) as e:  # a closed channel
                raise Error(grpc.StatusCode.FAILED_PRECONDITION,
                            f"gpuexec client: cannot open the session's command stream: {e}") \
                    from None
            self._first = True
            self._reader = self._loop.create_task(self._read(self._call))
        return self._call

    async def _read(self, call: Any) -> None:
        code, details = grpc.StatusCode.OK, ""
        try:
            while True:
                message = await call.read()
                if message is grpc.aio.EOF:
                    break
                self._answers(call, message)
            code = await call.code()
            details = await call.details()
        except asyncio.CancelledError:
            code, details = grpc.StatusCode.CANCELLED, ("gpuexec client: the session's command "
                                                        "stream was closed with its session "
                                                        "or client")
        except grpc.RpcError as e:
            code, details = e.code() or grpc.StatusCode.UNKNOWN, e.details() or ""
        self._broken(call, code, details)

    def _answers(self, call: Any, message: bytes) -> None:
        try:
            response = pb.ExecuteResponse.FromString(message)
        except Exception:  # pylint: disable=broad-except
            call.cancel()
            return
        for r in response.results:
            future = self._awaited.pop(r.id, None)
            if future is not None:
                # The daemon starts commands in order: all before it started.
                if r.id > self._ordered_through:
                    self._ordered_through = r.id
                if not future.done():
                    future.set_result(r)
                    continue
            if r.code != 0 and self._deferred is None:
                self._deferred = error_of(r)

    def _broken(self, call: Any, code: Any, details: str) -> None:
        """The Execute call ended: fails what waits on it; the next command
        opens another."""
        if call is not self._call:
            return
        self._call = None
        self._reader = None
        if code == grpc.StatusCode.OK:
            daemon = f"daemon {self._target}" if self._target else "the daemon"
            why = Error(grpc.StatusCode.UNAVAILABLE,
                        f"gpuexec client: {daemon} ended the session's command stream")
        else:
            why = Error(code, naming_daemon(code, details, self._target))
        self._fail_sent(why)

    def _fail_sent(self, why: Error) -> None:
        """Fails the commands sent so far that wait for an answer with
        ``why``; those nobody waits for are told by the next waiting call."""
        for command_id in [i for i in self._awaited if i <= self._issued_through]:
            future = self._awaited.pop(command_id)
            if not future.done():
                future.set_exception(why)
        if self._unwaited_through > self._ordered_through and not self._closed:
            if self._deferred is None:
                self._deferred = Error(why.code, f"{why.message} (launches queued without "
                                                 "waiting may not have run)")
        self._ordered_through = self._issued_through


def execute_opener(channel: Any, metadata: tuple) -> Callable[[], Any]:
    """How a client's sessions open their Execute calls on ``channel``."""
    multicallable = channel.stream_stream(METHOD, request_serializer=None,
                                          response_deserializer=None)
    return lambda: multicallable(metadata=metadata or None)
