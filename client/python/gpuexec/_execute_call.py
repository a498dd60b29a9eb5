"""One Execute call of a command stream (_commands.py), two ways: on
grpcio's core, polled by the calling thread (no thread hand-off each way),
or on grpcio's public streaming API (a thread hop each way) where the core
is missing, changed, or the channel has interceptors of the client's own.
GPUEXEC_COMMAND_STREAM=iterator forces the public API.
"""

from __future__ import annotations

import collections
import os
import queue
import threading
from typing import Any, Callable, Deque, Iterator, Optional, Sequence, Tuple, Union

import grpc

from ._errors import Error

try:
    from grpc import _channel as _grpc_channel
    from grpc._cython import cygrpc as _cygrpc
except ImportError:  # pragma: no cover - grpcio without its Cython core
    _grpc_channel = _cygrpc = None

METHOD = "/gpuexec.v1.GpuExec/Execute"
ENV_TRANSPORT = "GPUEXEC_COMMAND_STREAM"
CODES = {code.value[0]: code for code in grpc.StatusCode}
SEND, RECV, SEND_RECV = "send", "recv", "sendrecv"
STATUS, INITIAL = "status", "initial"
# A call's event: (tag, ok, payload): a message's bytes (or None) for a
# receive, (code, details) for the status.
Event = Tuple[str, bool, Any]


def text(details: Union[str, bytes, None]) -> str:
    if isinstance(details, bytes):
        return details.decode("utf-8", "replace")
    return details or ""


class _CoreCall:
    """The Execute call on grpcio's core: a call with a completion queue of
    its own, polled by whichever thread of the stream needs its next event."""

    def __init__(self, channel: Any, metadata: Optional[Tuple[Tuple[str, str], ...]]) -> None:
        c = _cygrpc
        operations = (
            ((c.SendInitialMetadataOperation(metadata, 0),
              c.ReceiveStatusOnClientOperation(0)), STATUS),
            ((c.ReceiveInitialMetadataOperation(0),), INITIAL),
        )
        args = (c.PropagationConstants.GRPC_PROPAGATE_DEFAULTS, METHOD.encode(), None, None,
                metadata, None, operations)
        context = c.build_census_context() if hasattr(c, "build_census_context") else None
        try:
            self._call = channel.segregated_call(*args, context)
        except TypeError:  # grpcio 1.60 and later: a registered-method handle too
            self._call = channel.segregated_call(*args, context, None)
        self.due = 2  # events to come; kept by the stream, under its lock
        self.ended = False  # its status came, or a send failed
        self.why: Optional[Error] = None  # the Error it ended with
        self.receiving = False  # a receive is asked for

    def send(self, data: bytes) -> bool:
        return self._call.operate((_cygrpc.SendMessageOperation(data, 0),), SEND)

    def receive(self) -> bool:
        return self._call.operate((_cygrpc.ReceiveMessageOperation(0),), RECV)

    def send_receive(self, data: bytes) -> bool:
        """A send and a receive as one batch: one event when both are done."""
        return self._call.operate((_cygrpc.SendMessageOperation(data, 0),
                                   _cygrpc.ReceiveMessageOperation(0)), SEND_RECV)

    def next_event(self) -> Event:
        """Blocks for the next event: (tag, ok, payload)."""
        event = self._call.next_event()
        tag = event.tag
        if tag == RECV or tag == SEND_RECV:
            message = None
            if event.success:
                for op in event.batch_operations:
                    if op.type() == _cygrpc.OperationType.receive_message:
                        message = op.message()
            return tag, event.success, message
        if tag == STATUS:
            for op in event.batch_operations:
                if op.type() == _cygrpc.OperationType.receive_status_on_client:
                    return tag, True, (CODES.get(op.code(), grpc.StatusCode.UNKNOWN),
                                       text(op.details()))
            return tag, False, (grpc.StatusCode.UNKNOWN, "")
        return tag, event.success, None

    def cancel(self, details: str) -> None:
        self._call.cancel(_cygrpc.StatusCode.cancelled, details)

    def alive(self) -> bool:
        """Whether the call still has events to give: grpcio (1.60 and
        later) tears a call down when a signal interrupts a wait for one."""
        try:
            # Initial metadata is received once: a second request is refused
            # by the core while the call lives, and not made once it is done.
            started = self._call.operate((_cygrpc.ReceiveInitialMetadataOperation(0),),
                                         INITIAL)
        except ValueError:
            return True
        if started:  # taken after all: one more event to come
            self.due += 1
            return True
        return False


class _IteratorCall:
    """The same call on grpcio's public API: messages go through a request
    iterator that grpcio consumes on a thread of its own; answers are read
    as they come by a thread of this class's and given out one per
    receive(). Events are the same as _CoreCall's."""

    def __init__(self, multicallable: Any) -> None:
        self._events: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self._outgoing: queue.SimpleQueue[Optional[bytes]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._inbox: Deque[bytes] = collections.deque()  # answers read, not yet asked for
        self._wanted = 0  # receives asked for, not yet given
        self._sending = False  # a message handed over, its event not yet given
        self._over = False  # the call ended: nothing more is sent or read
        self.due = 1
        self.ended = False
        self.why: Optional[Error] = None
        self.receiving = False
        self.send_receive: Optional[Callable[[bytes], bool]] = None  # no batches of two here
        self._responses = multicallable(self._requests())
        threading.Thread(target=self._read, name="gpuexec-execute-reader", daemon=True).start()

    def _requests(self) -> Iterator[bytes]:
        while True:
            data = self._outgoing.get()
            if data is None:
                return
            yield data
            # grpcio asks for the next message once this one is sent.
            with self._lock:
                if self._sending:
                    self._sending = False
                    self._events.put((SEND, True, None))

    def _give_locked(self) -> None:
        while self._wanted and (self._inbox or self._over):
            self._wanted -= 1
            if self._inbox:
                self._events.put((RECV, True, self._inbox.popleft()))
            else:
                self._events.put((RECV, False, None))

    def _read(self) -> None:
        code, details = grpc.StatusCode.OK, ""
        try:
            for message in self._responses:
                with self._lock:
                    self._inbox.append(message)
                    self._give_locked()
        except grpc.RpcError as e:
            code = e.code() or grpc.StatusCode.UNKNOWN
            details = e.details() or ""
        with self._lock:
            self._over = True
            self._give_locked()
            if self._sending:
                self._sending = False
                self._events.put((SEND, False, None))
        self._outgoing.put(None)
        self._events.put((STATUS, True, (code, text(details))))

    def send(self, data: bytes) -> bool:
        with self._lock:
            if self._over:
                return False
            self._sending = True
        self._outgoing.put(data)
        return True

    def receive(self) -> bool:
        with self._lock:
            if self._over and not self._inbox:
                return False
            self._wanted += 1
            self._give_locked()
        return True

    def next_event(self) -> Event:
        return self._events.get()

    def cancel(self, details: str) -> None:
        self._responses.cancel()

    def alive(self) -> bool:
        return True


# One Execute call, either way.
Call = Union[_CoreCall, _IteratorCall]


def _core_channel(channel: Any) -> Any:
    """The cygrpc channel under a plain grpc channel, or None."""
    if _cygrpc is None or _grpc_channel is None:
        return None
    if not isinstance(channel, getattr(_grpc_channel, "Channel", ())):
        return None
    core = getattr(channel, "_channel", None)
    needed = ("SendInitialMetadataOperation", "ReceiveStatusOnClientOperation",
              "ReceiveInitialMetadataOperation", "SendMessageOperation",
              "ReceiveMessageOperation", "OperationType", "PropagationConstants", "StatusCode")
    if (core is None or not hasattr(core, "segregated_call")
            or not all(hasattr(_cygrpc, n) for n in needed)):
        return None
    return core


def opener(channel: Any, plain_channel: Any = None,
           metadata: Optional[Sequence[Tuple[str, str]]] = None
           ) -> Tuple[Callable[[], Call], str]:
    """How a client's command streams open their Execute calls: on grpcio's
    core when ``plain_channel`` (``channel`` without the client's own
    interceptor, whose ``metadata`` is then sent here) or ``channel`` is a
    plain grpc channel; else on the public API of ``channel``. Returns
    (open, name)."""
    if os.environ.get(ENV_TRANSPORT, "") != "iterator":
        core = _core_channel(plain_channel if plain_channel is not None else channel)
        if core is not None:
            md = tuple(metadata) if plain_channel is not None and metadata else None
            return (lambda: _CoreCall(core, md)), "core"
    multicallable = channel.stream_stream(METHOD, request_serializer=None,
                                          response_deserializer=None)
    return (lambda: _IteratorCall(multicallable)), "iterator"
