"""Client and Session: a connection to one daemon, and a session on one
of its devices.

Ownership follows the daemon: a Session owns everything made in it, and
closing it (``with`` or ``close()``) frees all of it on the daemon. A Buffer
is freed by ``free()`` or at the end of its ``with`` block; otherwise it
lives until its session closes. Calls on objects of a closed session reach
the daemon and raise its error (NOT_FOUND).
"""

import hashlib
import os
import threading
import warnings
from dataclasses import dataclass

import grpc

from . import _commands, _connect, _host_memory, _wire
from ._buffer import Buffer
from ._bytes import _byte_view, _is_numpy_array, _numpy
from ._channel import Recipe
from ._commands import CommandStream
from ._errors import Error, SessionFate, client_error, from_rpc_error, short_token
from ._function import Module, _launch_attributes, _module_kind
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


def _seconds_to_ms(seconds, what):
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
    compute_capability: tuple
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



def open_client(target, *, timeout=10.0, chunk_bytes=DEFAULT_CHUNK_BYTES,
            control_timeout=60.0, channel_options=(), token=None, root_ca=None, cert=None,
            key=None, tls=None, allow_token_over_plain_tcp=False, shm_socket=None):
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
                  _plain_channel=channel, _metadata=recipe.metadata(), _target=target)



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

    def __init__(self, channel, *, chunk_bytes=DEFAULT_CHUNK_BYTES, control_timeout=60.0,
                 shm_socket=None, _plain_channel=None, _metadata=None, _target=None):
        if not 0 < chunk_bytes <= MAX_CHUNK_BYTES:
            raise client_error(f"chunk_bytes must be in (0, {MAX_CHUNK_BYTES}]")
        # The daemon's host memory socket given by the caller (see connect).
        self.shm_socket = os.fspath(shm_socket) if shm_socket else None
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
        self._streams = set()
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

    def __repr__(self):
        return f"<gpuexec.Client {self.target or 'on a channel'}, {self.command_stream} stream>"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        """Closes the channel (sessions stay open until their lease lapses)."""
        with self._streams_lock:
            streams = list(self._streams)
        for stream in streams:
            stream.close()
        self.channel.close()

    def _stream_opened(self, stream):
        with self._streams_lock:
            self._streams.add(stream)

    def _stream_closed(self, stream):
        with self._streams_lock:
            self._streams.discard(stream)

    def _call(self, method, request, timeout):
        try:
            return method(request, timeout=timeout)
        except grpc.RpcError as e:
            raise from_rpc_error(e, self.target) from None

    def devices(self):
        """The host's devices: a list of Device."""
        response = self._call(self.stub.ListDevices, pb.ListDevicesRequest(), self.control_timeout)
        self._check_version(self.target, response.daemon_version)
        if len(response.devices) > MAX_DEVICES:
            raise Error(grpc.StatusCode.DATA_LOSS,
                        f"gpuexec client: {self.target or 'the daemon'} answered "
                        f"{len(response.devices)} devices; at most {MAX_DEVICES}")
        address = response.daemon_address
        if len(address) > 261 or not address.isprintable() or not address.isascii():
            address = ""  # not an address: ignored
        return [Device(index=d.index, name=d.name,
                       compute_capability=(d.compute_capability_major,
                                           d.compute_capability_minor),
                       memory_total_bytes=d.memory_total_bytes,
                       memory_free_bytes=d.memory_free_bytes, healthy=d.healthy,
                       multiprocessor_count=d.multiprocessor_count,
                       modules_loaded=d.modules_loaded,
                       module_loads_total=d.module_loads_total, sessions=d.sessions,
                       resets=d.resets, epoch=d.epoch, last_reset=d.last_reset,
                       workers=d.workers, own_worker=d.own_worker,
                       not_answering_since=d.not_answering_since,
                       pending_requests=d.pending_requests,
                       daemon_address=address)
                for d in response.devices]

    def session(self, device=None, *, lease=None, memory_limit=0, kernel_time_limit=None):
        """Opens a session; ``with`` closes it.

        device: index, or None for the daemon's choice. lease: seconds, None
        for the daemon's default (capped by its maximum). memory_limit: device
        bytes the session may hold, 0 for the daemon's default.
        kernel_time_limit: seconds a launch may run before it counts as hung
        (the device's worker is then restarted and the launch fails with
        ABORTED); None for the daemon's limit, which a session may only lower.
        """
        request = pb.OpenSessionRequest(
            lease_ms=_seconds_to_ms(lease, "lease"), memory_limit_bytes=memory_limit,
            kernel_time_limit_ms=_seconds_to_ms(kernel_time_limit, "kernel_time_limit"))
        if device is not None:
            request.device = device
        response = self._call(self.stub.OpenSession, request, self.control_timeout)
        self._check_version(self.target, response.daemon_version)
        return Session(self, response)


class Session:
    """A daemon session on one device: owns its buffers, modules and stream."""

    def __init__(self, client, response):
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
        self._closed = False
        # What ended the session on the daemon, which later errors lead with.
        self._fate = SessionFate(self.token)
        # Launches and synchronizes: one Execute stream, opened at the first.
        self._commands = CommandStream(client, self.token)
        # The daemon's host memory socket: the client's, else the one the
        # daemon named (to callers on its Unix socket only); "" if none.
        self.shm_socket = client.shm_socket or response.shm_socket
        # The live host memory regions, which Buffer.write and read_into
        # consult.
        self._regions = _host_memory.HostRegions()

    def __repr__(self):
        return f"<gpuexec.Session {self.token[:8]} on device {self.device}>"

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
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
    def closed(self):
        """True once close() ran here."""
        return self._closed

    def _control(self, method, request):
        try:
            return self.client._call(method, request, self.client.control_timeout)
        except Error as e:
            raise self._failed(e) from None

    def _data(self, method, request):
        try:
            return self.client._call(method, request, None)
        except Error as e:
            raise self._failed(e) from None

    def _failed(self, e):
        """The error to raise for ``e``, a failure of one of this session's
        calls (see SessionFate)."""
        return self._fate.failed(e)

    def close(self):
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

    def _order(self):
        """Before a call outside the command stream that touches the GPU:
        the launches queued without waiting are taken first."""
        if self._regions.dead:
            _host_memory.drain(self, self._regions)
        try:
            self._commands.order()
        except Error as e:
            raise self._failed(e) from None

    def keep_alive(self):
        """Renews the lease; returns the lease granted in seconds."""
        response = self._control(self.client.stub.KeepAlive,
                                 pb.KeepAliveRequest(session=self.token))
        self.lease = response.lease_ms / 1000.0
        return self.lease

    def alloc(self, nbytes, *, dtype=None, shape=None):
        """Allocates ``nbytes`` of device memory (contents undefined).

        dtype and shape, if given, are what read_array() returns by default.
        """
        response = self._control(self.client.stub.Allocate,
                                 pb.AllocateRequest(session=self.token, size=int(nbytes)))
        return Buffer(self, response.buffer, response.size, dtype, shape)

    def empty(self, shape, dtype="float32"):
        """A buffer for a numpy array of this shape and dtype (needs numpy)."""
        np = _numpy()
        dtype = np.dtype(dtype)
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        count = 1
        for d in shape:
            count *= d
        return self.alloc(count * dtype.itemsize, dtype=dtype, shape=shape)

    def upload(self, data):
        """A new buffer holding ``data`` (bytes-like or a numpy array)."""
        dtype = shape = None
        if _is_numpy_array(data):
            dtype, shape = data.dtype, tuple(data.shape)
        view = _byte_view(data)
        buffer = self.alloc(len(view), dtype=dtype, shape=shape)
        if len(view):
            buffer.write(view)
        return buffer

    def map_host_memory(self, nbytes):
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

    def host_array(self, shape, dtype="float32"):
        """A zero-filled numpy array of this shape and dtype in host memory
        shared with the daemon (a region of its own, see map_host_memory):
        Buffer.write of it, or read_into it, is copied by the daemon without
        gRPC. The region is released when the array and every view of it are
        gone, or by ``gpuexec.HostMemory.of(array).release()``. Needs numpy."""
        np = _numpy()
        dtype = np.dtype(dtype)
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        count = 1
        for d in shape:
            count *= d
        nbytes = count * dtype.itemsize
        if nbytes <= 0:
            raise client_error(f"host_array of shape {shape} and dtype {dtype} holds "
                               f"{nbytes} bytes; a region holds 1 to 2^48 bytes; no call "
                               "was made")
        return self.map_host_memory(nbytes).array(shape, dtype)

    def _region_of(self, obj, view):
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

    def _release_region(self, region):
        """Queues a region's release on the command stream (without waiting)."""
        self._commands.submit(_wire.release_region_op(region), wait=False)

    def load_module(self, source, kind=None):
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

        def requests(with_image):
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

    def launch(self, function, grid, block, *args, shared=0, cluster=None, sync=False,
               cooperative=False, pdl=False, non_portable_cluster=False, cluster_policy=None):
        """Enqueues ``function`` on the session's stream (see Function.launch)."""
        op = function._launch_op(grid, block, args, shared, cluster, sync,
                                 _launch_attributes(cooperative, pdl, non_portable_cluster,
                                                    cluster_policy))
        try:
            result = self._commands.submit(op, wait=True)
        except Error as e:
            raise self._failed(e) from None
        return result.gpu_time_ns / 1e9 if sync else None

    def launch_async(self, function, grid, block, *args, shared=0, cluster=None,
                     cooperative=False, pdl=False, non_portable_cluster=False,
                     cluster_policy=None):
        """Queues ``function`` without waiting (see Function.launch_async)."""
        op = function._launch_op(grid, block, args, shared, cluster, False,
                                 _launch_attributes(cooperative, pdl, non_portable_cluster,
                                                    cluster_policy))
        try:
            self._commands.submit(op, wait=False)
        except Error as e:
            raise self._failed(e) from None

    def synchronize(self):
        """Waits for the session's work; returns its GPU time in seconds since
        the previous synchronize (0.0 when there was none)."""
        if self._regions.dead:
            _host_memory.drain(self, self._regions)
        try:
            return self._commands.submit(_wire.SYNCHRONIZE_OP, wait=True).gpu_time_ns / 1e9
        except Error as e:
            raise self._failed(e) from None

