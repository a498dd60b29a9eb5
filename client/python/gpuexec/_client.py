"""Client: a connection to one daemon (Session, a session on one of its
devices, is in _session.py and exported here too).

Ownership follows the daemon: a Session owns everything made in it, and
closing it (``with`` or ``close()``) frees all of it on the daemon. A Buffer
is freed by ``free()`` or at the end of its ``with`` block; otherwise it
lives until its session closes. Calls on objects of a closed session reach
the daemon and raise its error (NOT_FOUND).
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Set, Tuple

import grpc

from . import _connect, _execute_call
from ._channel import Recipe
from ._errors import Error, client_error, from_rpc_error
from ._session import Session
from ._version_check import DaemonVersionCheck
from .v1 import gpuexec_pb2 as pb
from .v1 import gpuexec_pb2_grpc as pb_grpc

DEFAULT_TARGET = "127.0.0.1:50051"
DEFAULT_CHUNK_BYTES = 1 << 20
MAX_MESSAGE_BYTES = 64 << 20
# The daemon takes messages of at most 17 MiB: chunks of up to 16 MiB.
MAX_CHUNK_BYTES = 16 << 20
# A ListDevices answer with more devices than this is refused (a host has a
# few; a hostile daemon could send millions).
MAX_DEVICES = 4096
# How long a call waiting on a command ring polls it before it sleeps: a
# launch and synchronize answers within it on an idle daemon.
RING_SPIN_WAIT_S = 200e-6
ENV_COMMAND_RING = "GPUEXEC_COMMAND_RING"


def _seconds_to_ms(seconds: Optional[float], what: str) -> int:
    if seconds is None:
        return 0
    ms = round(float(seconds) * 1000)
    if ms < 0:
        raise client_error(f"{what} must not be negative")
    return ms



@dataclass(frozen=True)
class Device:
    """One device as the daemon sees it."""
    index: int
    name: str
    compute_capability: Tuple[int, int]
    memory_total_bytes: int
    memory_free_bytes: int
    healthy: bool
    multiprocessor_count: int
    modules_loaded: int
    module_loads_total: int
    sessions: int
    # Restarts of the device's worker (after a fault, a hung kernel or a
    # crash), the epoch (buffers of an older one are lost), and when and why
    # the last restart happened ("" if never).
    resets: int = 0
    epoch: int = 0
    last_reset: str = ""
    # Worker processes serving the device, and whether the caller's tenant
    # has one of its own there (resets, epoch and last_reset are then its).
    workers: int = 1
    own_worker: bool = False
    # While the device's worker does not answer: since when ("" otherwise);
    # memory_free_bytes is then its last figure.
    not_answering_since: str = ""
    # Requests the device's workers have not answered yet (its shared
    # worker and the caller's tenant's own): a coarse figure of how busy it
    # is.
    pending_requests: int = 0
    # The daemon serving it, as it names itself (gpuexecd
    # --advertise_address); "" when it names none.
    daemon_address: str = ""
    # While the daemon drains (an operator's Drain: it opens no new
    # session), the drain in words (at most 512 characters); "" otherwise.
    daemon_draining: str = ""


def devices_of(response: Any, target: Optional[str]) -> List[Device]:
    """A ListDevices answer as Device values (both clients' devices());
    DATA_LOSS for more devices than MAX_DEVICES, and a daemon address that
    is not one (too long, not printable ASCII) dropped."""
    if len(response.devices) > MAX_DEVICES:
        raise Error(grpc.StatusCode.DATA_LOSS,
                    f"gpuexec client: {target or 'the daemon'} answered "
                    f"{len(response.devices)} devices; at most {MAX_DEVICES}")
    address = response.daemon_address
    if len(address) > 261 or not address.isprintable() or not address.isascii():
        address = ""  # not an address: ignored
    draining = "".join(c if c.isprintable() else "?" for c in response.draining[:512])
    return [Device(index=d.index, name=d.name,
                   compute_capability=(d.compute_capability_major, d.compute_capability_minor),
                   memory_total_bytes=d.memory_total_bytes,
                   memory_free_bytes=d.memory_free_bytes, healthy=d.healthy,
                   multiprocessor_count=d.multiprocessor_count, modules_loaded=d.modules_loaded,
                   module_loads_total=d.module_loads_total, sessions=d.sessions,
                   resets=d.resets, epoch=d.epoch, last_reset=d.last_reset, workers=d.workers,
                   own_worker=d.own_worker, not_answering_since=d.not_answering_since,
                   pending_requests=d.pending_requests, daemon_address=address,
                   daemon_draining=draining)
            for d in response.devices]



def open_client(target: str, *, timeout: float = 10.0,
                chunk_bytes: int = DEFAULT_CHUNK_BYTES, control_timeout: Optional[float] = 60.0,
                channel_options: Sequence[Tuple[str, Any]] = (), token: Optional[str] = None,
                root_ca: Any = None, cert: Any = None, key: Any = None,
                tls: Optional[bool] = None, allow_token_over_plain_tcp: bool = False,
                shm_socket: Any = None, command_ring: Optional[bool] = None) -> Client:
    """Connects to the daemon at ``target`` (not a pool); see connect()."""
    recipe = Recipe(target, token=token, root_ca=root_ca, cert=cert, key=key, tls=tls,
                    allow_token_over_plain_tcp=allow_token_over_plain_tcp)
    options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
               ("grpc.max_send_message_length", MAX_MESSAGE_BYTES)] + list(channel_options)
    channel = recipe.channel(options)
    try:
        _connect.wait_ready(channel, recipe, target, timeout, options)
    except BaseException:
        channel.close()
        raise
    return Client(recipe.intercept(channel), chunk_bytes=chunk_bytes,
                  control_timeout=control_timeout, shm_socket=shm_socket,
                  command_ring=command_ring, _plain_channel=channel, _metadata=recipe.metadata(), _target=target)



class Client:
    """A connection to one daemon. Thread-safe; ``with`` closes the channel.

    ``channel`` carries the token, if any, on every call (connect() adds it):
    calls made through ``client.channel`` or ``client.stub`` are
    authenticated like the client's own.

    ``command_stream`` says how sessions' command streams run: "core" (the
    caller's thread sends and polls for the answer, on grpcio's core call)
    or "iterator" (grpcio's public streaming API: a channel with
    interceptors of its own, or GPUEXEC_COMMAND_STREAM=iterator).
    """

    def __init__(self, channel: grpc.Channel, *, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                 control_timeout: Optional[float] = 60.0, shm_socket: Any = None,
                 command_ring: Optional[bool] = None, _plain_channel: Any = None,
                 _metadata: Any = None, _target: Optional[str] = None) -> None:
        if not 0 < chunk_bytes <= MAX_CHUNK_BYTES:
            raise client_error(f"chunk_bytes must be in (0, {MAX_CHUNK_BYTES}]")
        # The daemon's host memory socket given by the caller (see connect).
        self.shm_socket = os.fspath(shm_socket) if shm_socket else None
        # Sessions post launches and synchronizes on a command ring where the
        # daemon serves one on the host memory socket (see connect).
        if command_ring is None:
            command_ring = os.environ.get(ENV_COMMAND_RING, "1") != "0"
        self.command_ring = bool(command_ring)
        self.ring_spin_wait = RING_SPIN_WAIT_S
        # The address connect() was given; UNAVAILABLE errors name it.
        self.target = _target
        self.channel = channel
        self.stub = pb_grpc.GpuExecStub(channel)
        # Sessions' Execute calls; the open ones are ended before the
        # channel closes (grpcio's close waits for calls polled by their
        # callers, which nobody would poll then).
        self._open_execute, self.command_stream = _execute_call.opener(channel, _plain_channel,
                                                                   _metadata)
        self._streams_lock = threading.Lock()
        self._streams: Set[Any] = set()
        # Write and Read as the wire's bytes: a protobuf message would copy
        # each chunk's data once more each way (into and out of the message).
        self._write_call = channel.stream_unary(
            "/gpuexec.v1.GpuExec/Write", request_serializer=None,
            response_deserializer=pb.WriteResponse.FromString)
        self._read_call = channel.unary_stream(
            "/gpuexec.v1.GpuExec/Read", request_serializer=pb.ReadRequest.SerializeToString,
            response_deserializer=None)
        self.chunk_bytes = chunk_bytes
        # Deadline of control calls (sessions, Allocate, Free, GetFunction);
        # data calls (copies, module loads, launches) have none.
        self.control_timeout = control_timeout
        # The daemon's version against this client's, at the first answer
        # that tells it (a VersionWarning when MAJOR.MINOR differ).
        self._check_version = DaemonVersionCheck()

    def __repr__(self) -> str:
        return f"<gpuexec.Client {self.target or 'on a channel'}, {self.command_stream} stream>"

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Closes the channel (sessions stay open until their lease lapses)."""
        with self._streams_lock:
            streams = list(self._streams)
        for stream in streams:
            stream.close()
        self.channel.close()

    def _stream_opened(self, stream: Any) -> None:
        with self._streams_lock:
            self._streams.add(stream)

    def _stream_closed(self, stream: Any) -> None:
        with self._streams_lock:
            self._streams.discard(stream)

    def _call(self, method: Any, request: Any, timeout: Optional[float]) -> Any:
        try:
            return method(request, timeout=timeout)
        except grpc.RpcError as e:
            raise from_rpc_error(e, self.target) from None

    def devices(self) -> List[Device]:
        """The host's devices: a list of Device."""
        response = self._call(self.stub.ListDevices, pb.ListDevicesRequest(), self.control_timeout)
        self._check_version(self.target, response.daemon_version)
        return devices_of(response, self.target)

    def session(self, device: Optional[int] = None, *, lease: Optional[float] = None,
                memory_limit: int = 0, kernel_time_limit: Optional[float] = None,
                gpu_time: bool = True) -> Session:
        """Opens a session; ``with`` closes it.

        device: index, or None for the daemon's choice. lease: seconds, None
        for the daemon's default (capped by its maximum). memory_limit: device
        bytes the session may hold, 0 for the daemon's default.
        kernel_time_limit: seconds a launch may run before it counts as hung
        (the device's worker is then restarted and the launch fails with
        ABORTED); None for the daemon's limit, which a session may only lower.
        gpu_time: False leaves the session's work untimed: synchronize (and a
        launch with synchronize=True) returns a GPU time of 0, and each launch
        is queued without the events that time it (a launch + synchronize a
        few microseconds quicker, async launches cheaper). The daemon charges
        the tenant the work's busy time as its host sees it instead.
        ``Session.gpu_time`` says what the daemon granted.
        """
        request = pb.OpenSessionRequest(
            lease_ms=_seconds_to_ms(lease, "lease"), memory_limit_bytes=memory_limit,
            kernel_time_limit_ms=_seconds_to_ms(kernel_time_limit, "kernel_time_limit"),
            untimed=not gpu_time)
        if device is not None:
            request.device = device
        response = self._call(self.stub.OpenSession, request, self.control_timeout)
        self._check_version(self.target, response.daemon_version)
        return Session(self, response)

