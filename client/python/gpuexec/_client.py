"""Client and Session: a connection to one daemon, and a session on one
of its devices.

Ownership follows the daemon: a Session owns everything made in it, and
closing it (``with`` or ``close()``) frees all of it on the daemon. A Buffer
is freed by ``free()`` or at the end of its ``with`` block; otherwise it
lives until its session closes. Calls on objects of a closed session reach
the daemon and raise its error (NOT_FOUND).
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import warnings
import weakref
from dataclasses import dataclass
from typing import Any, Iterator, List, Optional, Sequence, Set, Tuple, Union

import grpc

from . import _commands, _compile, _connect, _host_memory, _ring, _ring_records, _wire
from ._buffer import Buffer, ShapeLike, _PointerBases
from ._bytes import _byte_view, _is_numpy_array, _numpy
from ._channel import Recipe
from ._commands import CommandStream
from ._dtype import DType, count_of, dtype as _as_dtype, element_bytes, like, shape_of
from ._errors import Error, SessionFate, client_error, from_rpc_error, short_token
from ._function import Module, _launch_attributes, _module_kind
from ._graph import Graph
from ._session_commands import SessionCommands
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
_SYNCHRONIZE_RECORD = (_ring.SYNCHRONIZE, b"")
_log = logging.getLogger("gpuexec")


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
        self._open_execute, self.command_stream = _commands.opener(channel, _plain_channel,
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


class Session:
    """A daemon session on one device: owns its buffers, modules and stream.

    Arrays: ``empty``, ``zeros``, ``full``, ``empty_like``, ``zeros_like``
    and ``asarray`` make Buffers of a shape and dtype (numpy's names and
    defaults, CuPy's habits); ``buf.get()`` downloads one into numpy.
    """

    # The graph being recorded (Session.graph), or None.
    _recording: Any = None

    def __init__(self, client: Client, response: Any) -> None:
        self.client = client
        # The daemon's address, as connect() was given it (a pool's session:
        # the daemon it was placed on).
        self.daemon = client.target
        self.token = response.session  # the session's only credential
        self.device = response.device
        self.lease = response.lease_ms / 1000.0
        self.memory_limit = response.memory_limit_bytes
        # Seconds; 0 means no limit.
        self.kernel_time_limit = response.kernel_time_limit_ms / 1000.0
        # False when the session's work is not timed (session(gpu_time=False)).
        self.gpu_time = not response.untimed
        self._closed = False
        # What ended the session on the daemon, which later errors lead with.
        self._fate = SessionFate(self.token)
        # The daemon's host memory socket: the client's, else the one the
        # daemon named (to callers on its Unix socket only); "" if none.
        self.shm_socket = client.shm_socket or response.shm_socket
        # Launches and synchronizes: the session's command ring where the
        # daemon serves one on that socket, else one Execute stream; either
        # opened at the first.
        self._commands = SessionCommands(CommandStream(client, self.token),
                                         self._ring_opener(response))
        # The live host memory regions, which Buffer.write and read_into
        # consult.
        self._regions = _host_memory.HostRegions()
        # Buffer.data_ptr()'s number of each allocation.
        self._pointer_bases = _PointerBases()
        # RawKernel -> what it compiled here (the session holds it: a
        # RawKernel keeps no session alive).
        self._raw_kernels: Any = weakref.WeakKeyDictionary()

    def __repr__(self) -> str:
        return f"<gpuexec.Session {short_token(self.token)} on device {self.device}>"

    def _ring_opener(self, response: Any) -> Any:
        """What registers this session's command ring, or None where none
        is to be tried (said on the "gpuexec" logger at DEBUG)."""
        client = self.client
        why = None
        if not client.command_ring:
            why = "off (connect(command_ring=False) or GPUEXEC_COMMAND_RING=0)"
        elif response.command_ring_version < _ring.VERSION or not self.shm_socket:
            why = "the daemon serves none to this client (no --shm_socket, or --command_rings=false)"
        else:
            why = _ring.supported()
        if why is not None:
            _log.debug("command ring: %s; using the Execute stream", why)
            return None
        socket_path, token = self.shm_socket, self.token
        return lambda: _ring.CommandRing(socket_path, token, client.control_timeout,
                                         client.ring_spin_wait)

    def __enter__(self) -> Session:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc is None:
            self.close()
            return
        # The block's exception goes on unchanged; a failure to close is
        # noted on it, never raised in its place.
        try:
            self.close()
        except Exception as e:  # pylint: disable=broad-except
            if hasattr(exc, "add_note"):
                exc.add_note(f"gpuexec: closing session {short_token(self.token)} then "
                             f"failed too: {e}")

    @property
    def closed(self) -> bool:
        """True once close() ran here."""
        return self._closed

    def _control(self, method: Any, request: Any) -> Any:
        try:
            return self.client._call(method, request, self.client.control_timeout)
        except Error as e:
            raise self._failed(e) from None

    def _data(self, method: Any, request: Any) -> Any:
        try:
            return self.client._call(method, request, None)
        except Error as e:
            raise self._failed(e) from None

    def _failed(self, e: Error) -> Error:
        """The error to raise for ``e``, a failure of one of this session's
        calls (see SessionFate)."""
        return self._fate.failed(e)

    def close(self) -> None:
        """Closes the session on the daemon, freeing all it holds. Idempotent;
        a session the daemon says it ended already (a reset, its lease) is
        closed without an error. One that a fault of its queued launches ended,
        unreported so far, gives a RuntimeWarning with the cause."""
        if self._closed:
            return
        self._closed = True
        # The daemon releases the regions with the session: none is looked
        # up now, and each is unmapped once its HostMemory and arrays are
        # gone (those gone already, now).
        _host_memory.drain(self, self._regions)
        for mapping in self._regions.take_all():
            mapping.take_release()
        _host_memory.drain(self, self._regions)
        self._commands.close()
        try:
            try:
                self.client._call(self.client.stub.CloseSession,
                                  pb.CloseSessionRequest(session=self.token),
                                  self.client.control_timeout)
            except Error as e:
                # The daemon's word for a session it ended itself (a reset, a
                # lapsed lease, a revoked tenant): nothing is left to free. Any
                # other NOT_FOUND (a token it never gave this tenant) is raised.
                if (e.code != grpc.StatusCode.NOT_FOUND or not e.message.startswith(
                        f"session {short_token(self.token)} was closed: ")):
                    raise
                untold = self._fate.untold(e)
                if untold is not None:
                    warnings.warn(f"gpuexec: session {short_token(self.token)} was closed by the "
                                  f"daemon before close(): {untold}", RuntimeWarning,
                                  stacklevel=2)
        finally:
            # The ring's lifeline last: its end closes the session too.
            self._commands.finish()

    def _order(self) -> None:
        """Before a call outside the command stream that touches the GPU:
        the launches queued without waiting are taken first."""
        if self._regions.dead:
            _host_memory.drain(self, self._regions)
        try:
            self._commands.order()
        except Error as e:
            raise self._failed(e) from None

    def keep_alive(self) -> float:
        """Renews the lease; returns the lease granted in seconds."""
        response = self._control(self.client.stub.KeepAlive,
                                 pb.KeepAliveRequest(session=self.token))
        self.lease = response.lease_ms / 1000.0
        return self.lease

    def alloc(self, nbytes: int, *, dtype: Any = None,
              shape: Optional[ShapeLike] = None) -> Buffer:
        """Allocates ``nbytes`` of device memory, which reads as zeros until
        written (the daemon clears it). dtype: the elements (default uint8);
        shape: default as many elements as fit. A shape that needs more
        bytes is refused before the call."""
        d = None if dtype is None else _as_dtype(dtype)
        dims = None if shape is None else shape_of(shape)
        if dims is not None:
            need = count_of(dims) * (1 if d is None else d.itemsize)
            if need > nbytes:
                raise client_error(f"alloc of {nbytes} bytes with shape {dims} of "
                                   f"{d or 'uint8'}: that shape needs {need} bytes")
        response = self._control(self.client.stub.Allocate,
                                 pb.AllocateRequest(session=self.token, size=int(nbytes)))
        return Buffer(self, response.buffer, response.size, d, dims)

    def empty(self, shape: ShapeLike, dtype: Any = "float32") -> Buffer:
        """A buffer of ``shape`` and ``dtype`` (a name, numpy dtype or
        gpuexec.DType); its contents are zeros (see alloc) but a program
        should not count on that: use zeros(). An array of no elements
        holds one byte of the daemon's (it allocates no less)."""
        d = _as_dtype(dtype)
        dims = shape_of(shape)
        return self.alloc(max(count_of(dims) * d.itemsize, 1), dtype=d, shape=dims)

    def zeros(self, shape: ShapeLike, dtype: Any = "float32") -> Buffer:
        """A zero-filled buffer of ``shape`` and ``dtype``: one Allocate, no
        upload (the daemon clears new memory on the session's stream)."""
        return self.empty(shape, dtype)

    def full(self, shape: ShapeLike, value: Any, dtype: Any = "float32") -> Buffer:
        """A buffer of ``shape`` and ``dtype`` with every element ``value``.
        Zero costs nothing more than the allocation; a value whose bytes are
        one byte repeated (1 as int8, -1 as int32) is a memset; any other is
        uploaded (``nbytes`` cross the network). A value the dtype cannot
        hold (300 as uint8, 1.5 as int32) is refused before any call."""
        d = _as_dtype(dtype)
        dims = shape_of(shape)
        one = element_bytes(value, d)
        buf = self.empty(dims, d)
        if buf.nbytes == 0 or one == bytes(len(one)):
            return buf
        try:
            if one == one[:1] * len(one):
                buf.memset(one[0])
            else:
                buf.write(one * count_of(dims))
        except BaseException:
            buf._free_quietly()
            raise
        return buf

    def empty_like(self, x: Any, dtype: Any = None) -> Buffer:
        """An empty buffer of the shape and dtype (or ``dtype``) of ``x``, a
        Buffer or a numpy array (anything with ``shape`` and ``dtype``)."""
        shape, d = like(x, dtype, "empty_like")
        return self.empty(shape, d)

    def zeros_like(self, x: Any, dtype: Any = None) -> Buffer:
        """A zero-filled buffer of the shape and dtype (or ``dtype``) of ``x``."""
        shape, d = like(x, dtype, "zeros_like")
        return self.zeros(shape, d)

    def asarray(self, a: Any, dtype: Any = None) -> Buffer:
        """``a`` as a buffer of this session: a Buffer of this session as it
        is; a numpy array (or what numpy.asarray takes, converted to
        ``dtype`` when given) uploaded into a new buffer of its shape and
        dtype. Another session's Buffer is refused (copy it through the
        host: ``session.asarray(other.get())``). Needs numpy."""
        if isinstance(a, Buffer):
            if a.session is not self:
                raise client_error(f"asarray of {a!r}: it is a buffer of session "
                                   f"{short_token(str(getattr(a.session, 'token', '')))}, not "
                                   f"of {self!r}; copy it through the host "
                                   "(session.asarray(buffer.get()))")
            if dtype is not None and _as_dtype(dtype) is not a.dtype:
                raise client_error(f"asarray of {a!r} as {_as_dtype(dtype)}: a buffer is not "
                                   "converted on the device; reinterpret its bytes with "
                                   "view(dtype=...) or convert a copy (get().astype())")
            return a
        np = _numpy()
        arr = np.asarray(a) if dtype is None else np.asarray(a, dtype=_as_dtype(dtype).numpy)
        return self._upload_array(arr, _as_dtype(arr.dtype))

    def upload(self, data: Any) -> Buffer:
        """A new buffer holding ``data``: a numpy array (its shape and dtype;
        one of a dtype a buffer does not hold, complex or structured, as its
        bytes: uint8) or bytes-like data (uint8)."""
        if _is_numpy_array(data):
            try:
                d = _as_dtype(data.dtype)
            except Error:
                d = None
            if d is not None:
                return self._upload_array(data, d)
        view = _byte_view(data)
        return self._upload_array(view, None)

    def _upload_array(self, data: Any, d: Optional[DType]) -> Buffer:
        view = _byte_view(data)
        shape = tuple(data.shape) if d is not None else (len(view),)
        buffer = self.alloc(max(len(view), 1), dtype=d, shape=shape)
        if len(view):
            try:
                buffer.write(view)
            except BaseException:
                buffer._free_quietly()
                raise
        return buffer

    def map_host_memory(self, nbytes: int) -> Any:
        """Host memory of at least ``nbytes`` (rounded up to 4 KiB), zero-filled,
        shared with the daemon as a region of this session: a HostMemory
        (see it). Only for a client on the daemon's host: the daemon must
        serve a host memory socket (gpuexecd --shm_socket) this process can
        reach, named by connect(shm_socket=...) or by the daemon. The region
        counts against the daemon's limits of page-locked memory.

        Errors: INVALID_ARGUMENT for ``nbytes`` 0 or above 2**48 and
        FAILED_PRECONDITION when no host memory socket is known (both before
        any call); UNAVAILABLE naming the path when it cannot be reached;
        otherwise the daemon's code and message. The registration is bounded
        by the client's control_timeout."""
        return _host_memory.map_host_memory(self, nbytes)

    def host_array(self, shape: ShapeLike, dtype: Any = "float32") -> Any:
        """A zero-filled numpy array of this shape and dtype in host memory
        shared with the daemon (a region of its own, see map_host_memory):
        Buffer.write of it, or read_into it, is copied by the daemon without
        gRPC. The region is released when the array and every view of it are
        gone, or by ``gpuexec.HostMemory.of(array).release()``. Needs numpy."""
        np_dtype = _numpy().dtype(dtype.numpy if isinstance(dtype, DType) else dtype)
        dims = shape_of(shape)
        nbytes = count_of(dims) * np_dtype.itemsize
        if nbytes <= 0:
            raise client_error(f"host_array of shape {dims} and dtype {np_dtype} holds "
                               f"{nbytes} bytes; a region holds 1 to 2^48 bytes; no call "
                               "was made")
        return self.map_host_memory(nbytes).array(dims, np_dtype)

    def _region_of(self, obj: Any, view: memoryview) -> Any:
        """(region, offset) when the bytes of ``obj`` (as ``view``, flat) lie
        wholly inside a live region of this session; else None."""
        regions = self._regions
        if not regions or self._closed:
            return None
        if regions.dead:
            _host_memory.drain(self, regions)
        address = _host_memory.address_of(obj, view)
        if address is None:
            return None
        return regions.find(address, len(view))

    def _release_region(self, region: Any) -> None:
        """Queues a region's release on the command stream (without waiting)."""
        self._commands.submit(_wire.release_region_op(region), wait=False,
                              record=(_ring.RELEASE_REGION, _ring_records.one(region)))

    def load_module(self, source: Union[str, "os.PathLike[str]", bytes],
                    kind: Union[str, int, None] = None) -> Module:
        """Loads a module image: a path (.cubin, .ptx, .fatbin) or its bytes.

        Sends the image's SHA-256 alone first and uploads the bytes only when
        the daemon does not hold them yet. ``kind`` ("cubin", "ptx",
        "fatbin") is taken from the file name or the image when not given.
        """
        path = None
        if isinstance(source, (str, os.PathLike)):
            path = os.fspath(source)
            with open(path, "rb") as f:
                image = f.read()
        else:
            image = bytes(source)
        kind = _module_kind(image, path, kind)
        digest = hashlib.sha256(image).hexdigest()
        header = pb.ModuleHeader(session=self.token, sha256=digest, size=len(image), kind=kind)
        chunk = self.client.chunk_bytes

        def requests(with_image: bool) -> Iterator[Any]:
            yield pb.LoadModuleRequest(header=header)
            if with_image:
                for i in range(0, len(image), chunk):
                    yield pb.LoadModuleRequest(chunk=image[i:i + chunk])

        try:
            response = self.client.stub.LoadModule(requests(False))
        except grpc.RpcError as e:
            first = from_rpc_error(e, self.client.target)
            if first.code != grpc.StatusCode.NOT_FOUND or first.message.startswith("session "):
                raise self._failed(first) from None
            try:
                response = self.client.stub.LoadModule(requests(True))
            except grpc.RpcError as e2:
                raise self._failed(from_rpc_error(e2, self.client.target)) from None
        return Module(self, response.module, response.sha256, response.uploaded, kind)

    def compile(self, source: Union[str, bytes], *, name: str = _compile.DEFAULT_SOURCE_NAME,
                headers: _compile.Headers = None, options: Union[str, Sequence[str]] = (),
                name_expressions: Union[str, Sequence[str]] = (),
                return_image: bool = False) -> _compile.CompiledModule:
        """Has the daemon compile CUDA C++ ``source`` (NVRTC, for this
        session's device) and load it as a module of this session; returns
        a gpuexec.CompiledModule (``.function(name)``, ``.log``, ...).

        name: the source's file name in NVRTC's log. headers: files the
        source may #include, {include name: text}. options: from the
        daemon's allow-list ("-std=c++17", "-DN=4", "--use_fast_math"; the
        architecture is the device's). name_expressions: template
        instantiations to compile ("saxpy<float>"), each answered with its
        lowered name. Kernels called by name are extern "C" or named here.
        return_image: also bring the image back (``.image``: a cubin of the
        device's architecture, to keep or to load with load_module).

        The same source, headers, options and name expressions are compiled
        once per architecture, whichever session asks (``cached``). Source
        that does not compile raises gpuexec.Error INVALID_ARGUMENT whose
        message holds NVRTC's log (its first 2 KiB); a daemon that cannot
        compile, FAILED_PRECONDITION saying why (see gpuexec._compile).
        """
        return _compile.compile_in(self, source, name, headers, options, name_expressions,
                                   return_image)

    def launch(self, function: Any, grid: Any, block: Any, *args: Any, shared: int = 0,
               cluster: Any = None, sync: bool = False, cooperative: bool = False,
               pdl: bool = False, non_portable_cluster: bool = False,
               cluster_policy: Optional[str] = None) -> Optional[float]:
        """Enqueues ``function`` on the session's stream (see Function.launch)."""
        attributes = _launch_attributes(cooperative, pdl, non_portable_cluster, cluster_policy)
        commands = self._commands
        recording = self._recording
        if recording is not None:
            recording.begin()
        try:
            ring = commands.ring()
            body = None if ring is None else function._ring_launch(grid, block, args, shared,
                                                                   cluster, sync, attributes)
            if ring is not None and body is not None:
                result = commands.post(ring, _ring.LAUNCH, body, True)
            else:
                result = commands.submit(function._launch_op(grid, block, args, shared, cluster,
                                                             sync, attributes), wait=True)
        except Error as e:
            raise self._failed(e) from None
        if recording is not None:
            recording.recorded(function)
        return result.gpu_time_ns / 1e9 if sync else None

    def launch_async(self, function: Any, grid: Any, block: Any, *args: Any, shared: int = 0,
                     cluster: Any = None, cooperative: bool = False, pdl: bool = False,
                     non_portable_cluster: bool = False,
                     cluster_policy: Optional[str] = None) -> None:
        """Queues ``function`` without waiting (see Function.launch_async)."""
        attributes = _launch_attributes(cooperative, pdl, non_portable_cluster, cluster_policy)
        commands = self._commands
        recording = self._recording
        if recording is not None:
            recording.begin()
        try:
            ring = commands.ring()
            body = None if ring is None else function._ring_launch(grid, block, args, shared,
                                                                   cluster, False, attributes)
            if ring is not None and body is not None:
                commands.post(ring, _ring.LAUNCH, body, False)
            else:
                commands.submit(function._launch_op(grid, block, args, shared, cluster, False,
                                                    attributes), wait=False)
        except Error as e:
            raise self._failed(e) from None
        if recording is not None:
            recording.recorded(function)

    def graph(self) -> Graph:
        """A graph to record: ``with session.graph() as g:`` records the
        session's launches, memsets and copies between its buffers instead
        of running them, and builds them on the device as one CUDA graph at
        the block's end; ``g()`` or ``g.launch(...)`` then replays it (see
        gpuexec.Graph). Inside the block, reads, writes, synchronize() and
        launches that wait for their GPU time are refused; a launch the
        daemon refuses fails the block's end, naming it."""
        return Graph(self)

    def synchronize(self) -> float:
        """Waits for the session's work; returns its GPU time in seconds since
        the previous synchronize (0.0 when there was none)."""
        if self._regions.dead:
            _host_memory.drain(self, self._regions)
        try:
            return self._commands.submit(_wire.SYNCHRONIZE_OP, wait=True,
                                         record=_SYNCHRONIZE_RECORD).gpu_time_ns / 1e9
        except Error as e:
            raise self._failed(e) from None

