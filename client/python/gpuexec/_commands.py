"""A session's command stream: launches queued without waiting
(``Function.launch_async``) as messages on one open Execute call, as the C++
client sends them, without a round trip each.

A failure the daemon finds in such a launch is raised by the session's next
call that waits for the daemon (a launch, a synchronize, or a copy, read,
write, memset or free, each of which first waits on a barrier for the
launches queued before it), as CUDA reports asynchronous errors. Launches
that wait stay unary calls: from Python a message on the stream answers
later than a unary call, grpcio consuming the request iterator on a thread
of its own.
"""

import queue
import threading

import grpc

from ._errors import Error, from_rpc_error
from .v1 import gpuexec_pb2 as pb

_CODES = {code.value[0]: code for code in grpc.StatusCode}


def _error_of(result):
    return Error(_CODES.get(result.code, grpc.StatusCode.UNKNOWN), result.message)


class CommandStream:
    """The Execute call of one session, opened on first use. Thread-safe:
    one command at a time is sent and, if it waits, answered."""

    def __init__(self, session):
        self._session = session
        self._lock = threading.Lock()
        self._requests = None  # the messages the call sends, fed by send()
        self._responses = None  # the call's answers
        self._first = True  # the next message opens the call (names the session)
        self._next_id = 1
        self._unwaited = 0  # commands sent since the last one that waited
        self._failed = []  # failures of commands nobody waited for

    def _open(self):
        requests = queue.SimpleQueue()

        def messages():
            while True:
                message = requests.get()
                if message is None:
                    return
                yield message

        self._requests = requests
        self._responses = self._session.client.stub.Execute(messages())
        self._first = True

    def _drop(self):
        """Ends the call (after it broke, or at close); the next command opens
        another."""
        if self._requests is not None:
            self._requests.put(None)
        if self._responses is not None:
            self._responses.cancel()
        self._requests = self._responses = None
        self._unwaited = 0

    def send(self, command, wait):
        """Sends ``command`` (a pb.Command without id); with ``wait``, returns
        its CommandResult once answered, or raises its error (or an earlier
        command's, first)."""
        with self._lock:
            if self._responses is None:
                self._open()
            command.id = self._next_id
            self._next_id += 1
            command.reply = bool(wait)
            message = pb.ExecuteRequest(commands=[command])
            if self._first:
                message.session = self._session.token
                self._first = False
            self._requests.put(message)
            if not wait:
                self._unwaited += 1
                return None
            result = None
            try:
                while result is None:
                    response = next(self._responses)
                    for r in response.results:
                        if r.id == command.id:
                            result = r
                        else:
                            self._failed.append(r)
            except grpc.RpcError as e:
                self._drop()
                self._failed.clear()
                raise from_rpc_error(e) from None
            except StopIteration:
                self._drop()
                self._failed.clear()
                raise Error(grpc.StatusCode.UNAVAILABLE,
                            "gpuexec client: the daemon ended the session's command stream") \
                    from None
            self._unwaited = 0
            if self._failed:
                earlier = self._failed[0]
                self._failed.clear()
                raise _error_of(earlier)
            if result.code != 0:
                raise _error_of(result)
            return result

    def order(self):
        """Waits until the commands sent without waiting have been taken by
        the daemon (a barrier), so that a call outside the stream sees their
        effects; raises an earlier command's failure."""
        with self._lock:
            pending = self._unwaited
        if pending:
            self.send(pb.Command(), wait=True)

    def close(self):
        with self._lock:
            self._drop()
