"""Client, Session, Buffer, Module and Function: the daemon's objects in Python.

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
from collections import namedtuple
from dataclasses import dataclass

import grpc

from . import _commands, _connect, _host_memory, _wire
from ._args import Arg, to_arg
from ._channel import Recipe
from ._commands import CommandStream
from ._errors import Error, SessionFate, client_error, from_rpc_error, short_token
from ._pool import Pool, is_pool_target
from ._tensor_map import TensorMap
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

_KINDS = {"cubin": pb.MODULE_KIND_CUBIN, "ptx": pb.MODULE_KIND_PTX, "fatbin": pb.MODULE_KIND_FATBIN}
_KIND_NAMES = {v: k for k, v in _KINDS.items()}
_FATBIN_MAGIC = bytes.fromhex("50ed55ba")

Param = namedtuple("Param", ["offset", "size"])
Param.__doc__ = "A kernel parameter as the driver lays it out (bytes)."


def _numpy():
    try:
        import numpy
    except ImportError:
        raise client_error("numpy is not installed; use bytes instead",
                           grpc.StatusCode.FAILED_PRECONDITION) from None
    return numpy


def _is_numpy_array(obj):
    return type(obj).__module__ == "numpy" and hasattr(obj, "dtype") and hasattr(obj, "shape")


_varint = _wire.varint


def _read_varint(view, at):
    value = shift = 0
    while True:
        if at >= len(view) or shift > 63:
            raise ValueError("truncated varint")
        byte = view[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7


def _parse_read_response(raw):
    """The offset and data (a view into ``raw``) of a ReadResponse's bytes."""
    view = memoryview(raw)
    at, offset, data = 0, 0, view[0:0]
    while at < len(view):
        key, at = _read_varint(view, at)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, at = _read_varint(view, at)
            if number == 1:
                offset = value
        elif wire == 2:
            n, at = _read_varint(view, at)
            if at + n > len(view):
                raise ValueError("truncated field")
            if number == 2:
                data = view[at:at + n]
            at += n
        elif wire in (1, 5):
            at += 8 if wire == 1 else 4
            if at > len(view):
                raise ValueError("truncated field")
        else:
            raise ValueError(f"wire type {wire}")
    return offset, data


def _writable_byte_view(out):
    """A flat, writable memoryview of unsigned bytes over all of ``out``."""
    unfit = client_error(f"cannot read into a {type(out).__name__}: expected a contiguous, "
                         "writable bytes-like object or numpy array")
    try:
        if _is_numpy_array(out) and out.dtype.hasobject:
            raise unfit
        view = memoryview(out)
    except TypeError:
        raise unfit from None
    if view.readonly or not view.c_contiguous:
        raise unfit
    try:
        return view.cast("B") if view.format != "B" or view.ndim != 1 else view
    except (TypeError, ValueError):
        raise unfit from None


def _byte_view(data):
    """A flat, contiguous memoryview of unsigned bytes over ``data``."""
    if _is_numpy_array(data):
        np = _numpy()
        arr = np.ascontiguousarray(data)
        return memoryview(arr.reshape(-1).view(np.uint8))
    try:
        view = memoryview(data)
    except TypeError:
        raise client_error(f"cannot write a {type(data).__name__}: expected bytes-like data "
                           "or a numpy array") from None
    if not view.c_contiguous:
        raise client_error("data is not contiguous")
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


def _dim3(value, what):
    dims = (value,) if isinstance(value, int) else tuple(value)
    if not 1 <= len(dims) <= 3 or not all(isinstance(d, int) and d >= 0 for d in dims):
        raise client_error(f"{what} must be an int or 1 to 3 non-negative ints, got {value!r}")
    dims = dims + (1,) * (3 - len(dims))
    return pb.Dim3(x=dims[0], y=dims[1], z=dims[2])


# cluster_policy's accepted values (lower case) -> ClusterSchedulingPolicy.
_CLUSTER_POLICIES = {"default": pb.CLUSTER_SCHEDULING_POLICY_DEFAULT,
                     "spread": pb.CLUSTER_SCHEDULING_POLICY_SPREAD,
                     "load_balancing": pb.CLUSTER_SCHEDULING_POLICY_LOAD_BALANCING}
for _name, _value in pb.ClusterSchedulingPolicy.items():
    _CLUSTER_POLICIES[_name.lower()] = _value
# A launch's attributes when none is asked for: (cooperative, pdl,
# non_portable_cluster, cluster_policy) as the wire takes them.
_NO_ATTRIBUTES = (False, False, False, 0)


def _flag(value, what):
    if value is True or value is False:
        return value
    if type(value).__name__ in ("bool_", "bool") or (
            isinstance(value, int) and value in (0, 1)):  # numpy's bool, 0 and 1
        return bool(value)
    raise client_error(f"{what} must be True or False, got {value!r}")


def _launch_attributes(cooperative, pdl, non_portable_cluster, cluster_policy):
    """The launch attributes as the wire takes them, checked; raises the
    client's error naming the argument."""
    if (cooperative is False and pdl is False and non_portable_cluster is False
            and cluster_policy is None):
        return _NO_ATTRIBUTES
    if cluster_policy is None:
        policy = 0
    else:
        policy = (_CLUSTER_POLICIES.get(cluster_policy.strip().lower().replace("-", "_"))
                  if isinstance(cluster_policy, str) else None)
        if policy is None:
            raise client_error(f"cluster_policy must be None, 'default', 'spread' or "
                               f"'load_balancing', got {cluster_policy!r}")
    return (_flag(cooperative, "cooperative"), _flag(pdl, "pdl"),
            _flag(non_portable_cluster, "non_portable_cluster"), policy)


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


@dataclass(frozen=True)
class FunctionAttributes:
    """What the driver reports about a kernel."""
    num_registers: int
    static_shared_bytes: int
    const_bytes: int
    local_bytes: int
    max_threads_per_block: int
    max_dynamic_shared_bytes: int
    ptx_version: int
    binary_version: int


def connect(target=None, *, timeout=10.0, chunk_bytes=DEFAULT_CHUNK_BYTES,
            control_timeout=60.0, channel_options=(), token=None, root_ca=None, cert=None,
            key=None, tls=None, allow_token_over_plain_tcp=False, shm_socket=None):
    """Connects to a daemon and waits up to ``timeout`` seconds for it.

    ``target`` is "host:port" or "unix:/path"; by default $GPUEXEC_TARGET,
    else 127.0.0.1:50051. Raises Error (UNAVAILABLE) if no connection is made
    in time: at once, with the cause and what to do, when a failed attempt
    is explained (nothing listening there, a TLS handshake refused: a CA
    that did not sign the daemon's certificate, TLS on one side only, a
    client certificate wanted); else once ``timeout`` has passed.

    A pool target, "pool://NAME:PORT" or "pool://HOST:PORT,HOST:PORT,...",
    gives a gpuexec.Pool instead (its ``session()`` places each session on
    one of the daemons; see Pool), with these options for every daemon.

    For a daemon with tenants:

    - ``token``: a bearer token, sent as ``authorization: Bearer <token>``
      with every call (streams included); by default $GPUEXEC_TOKEN. "" sends
      none.
    - ``root_ca``: the CA of the daemon's certificate, for TLS; by default
      $GPUEXEC_TLS_CA. ``cert`` and ``key``: this client's certificate chain
      and key, for mutual TLS; by default $GPUEXEC_TLS_CERT and
      $GPUEXEC_TLS_KEY. Each is a path (str or os.PathLike) or the PEM itself
      as bytes. The environment's files are not used for unix: targets (the
      daemon's socket is never TLS) or with ``tls=False``.
    - ``tls``: None: TLS when there is a root CA or a client certificate;
      True: TLS, with the system's roots when there is no root CA; False:
      plain.
    - A token goes over plain TCP only to this host (loopback, unix:); to
      another, connect raises Error (FAILED_PRECONDITION) unless
      ``allow_token_over_plain_tcp``.

    A file that cannot be read, or a certificate without its key, is an
    Error (INVALID_ARGUMENT) before any connection is tried.

    ``shm_socket``: the daemon's host memory socket (gpuexecd --shm_socket),
    a path on this host, for ``Session.host_array`` and
    ``Session.map_host_memory``. None: the path the daemon names when it
    opens a session, which it does only for callers on its Unix socket; a
    client over TCP on the daemon's host passes it here.
    """
    target = target or os.environ.get("GPUEXEC_TARGET") or DEFAULT_TARGET
    if is_pool_target(target):
        return Pool(target, timeout=timeout, chunk_bytes=chunk_bytes,
                    control_timeout=control_timeout, channel_options=channel_options,
                    token=token, root_ca=root_ca, cert=cert, key=key, tls=tls,
                    allow_token_over_plain_tcp=allow_token_over_plain_tcp,
                    shm_socket=shm_socket)
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


def _module_kind(image, path, kind):
    if kind is not None:
        if isinstance(kind, str):
            if kind.lower() not in _KINDS:
                raise client_error(f"unknown module kind {kind!r} (cubin, ptx or fatbin)")
            return _KINDS[kind.lower()]
        return int(kind)
    if path is not None:
        ext = os.path.splitext(path)[1].lower().lstrip(".")
        if ext in _KINDS:
            return _KINDS[ext]
    if image[:4] == b"\x7fELF":
        return pb.MODULE_KIND_CUBIN
    if image[:4] == _FATBIN_MAGIC:
        return pb.MODULE_KIND_FATBIN
    head = image[:4096]
    if b".version" in head and b".target" in head:
        return pb.MODULE_KIND_PTX
    name = path if path is not None else "the image"
    raise client_error(f"cannot tell the module kind of {name}; pass kind='cubin', 'ptx' "
                       "or 'fatbin'")


class Buffer:
    """Device memory of a session; ``with`` frees it at the end of the block."""

    def __init__(self, session, handle, size, dtype=None, shape=None):
        self.session = session
        self.handle = handle
        self.size = size
        self.dtype = dtype
        self.shape = shape
        self._freed = False

    def __repr__(self):
        return f"<gpuexec.Buffer 0x{self.handle:x}, {self.size} bytes>"

    def __len__(self):
        return self.size

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *exc):
        if self._freed or self.session.closed:
            return
        try:
            self.free()
        except Error:
            if exc_type is None:
                raise

    def ptr(self, offset=0):
        """A kernel argument: this buffer's device address plus ``offset``."""
        return Arg("buffer", self.handle, int(offset))

    def _as_kernel_arg(self):
        return self.ptr(0)

    @property
    def _launch_field(self):
        """This buffer as a LaunchRequest's argument field, made once."""
        field = self.__dict__.get("_field")
        if field is None:
            field = self.__dict__["_field"] = _wire.launch_arg_field(self.ptr(0))
        return field

    def free(self):
        """Frees the allocation now (stream-ordered after enqueued work)."""
        self._freed = True
        self.session._order()
        self.session._control(self.session.client.stub.Free,
                              pb.FreeRequest(session=self.session.token, buffer=self.handle))

    def _region_copy(self, hit, offset, size, direction):
        """A copy the daemon makes between a region and this buffer, on the
        session's command stream; returns once it has finished."""
        region, region_offset = hit
        try:
            self.session._commands.submit(
                _wire.region_copy_op(region, region_offset, self.handle, int(offset), size,
                                     direction), wait=True)
        except Error as e:
            raise self.session._failed(e) from None

    def write(self, data, offset=0):
        """Copies bytes-like data or a numpy array to the buffer at ``offset``;
        returns the bytes written. Data lying wholly inside host memory of
        this buffer's session (Session.host_array) is copied by the daemon
        from there, without gRPC."""
        view = _byte_view(data)
        hit = self.session._region_of(data, view)
        if hit is not None:
            self._region_copy(hit, offset, len(view), pb.RegionCopyRequest.TO_BUFFER)
            return len(view)
        chunk = self.session.client.chunk_bytes
        session, handle = self.session.token, self.handle
        self.session._order()

        def requests():
            # WriteRequests as bytes: the first names the session, buffer and
            # offset; each carries a chunk as field 4, copied once, here.
            first = pb.WriteRequest(session=session, buffer=handle,
                                    offset=int(offset)).SerializeToString()
            if len(view) == 0:
                yield first
                return
            for i in range(0, len(view), chunk):
                data = view[i:i + chunk]
                yield b"".join((first if i == 0 else b"", b"\x22", _varint(len(data)), data))

        response = self.session._data(self.session.client._write_call, requests())
        return response.bytes_written

    def _read(self, offset, size):
        if size is None:
            size = max(self.size - offset, 0)
            if size == 0 and offset <= self.size:
                return bytearray()
        elif size == 0:  # on the wire, 0 means "to the end"
            return bytearray()
        size = int(size)
        if offset + size > self.size:
            # Nothing to make room for: the daemon refuses the range.
            self._read_into(memoryview(bytearray()), offset, size)
            return bytearray()
        out = bytearray(size)
        self._read_into(memoryview(out), offset)
        return out

    def _read_into(self, view, offset, size=None):
        """Reads ``size`` bytes (default len(view)) at ``offset`` into ``view``
        (unsigned bytes); more than len(view) is a DATA_LOSS error."""
        size = len(view) if size is None else size
        self.session._order()
        request = pb.ReadRequest(session=self.session.token, buffer=self.handle,
                                 offset=int(offset), size=size,
                                 chunk_size=self.session.client.chunk_bytes)
        got = 0
        try:
            for raw in self.session.client._read_call(request):
                try:
                    at, data = _parse_read_response(raw)
                except ValueError as e:
                    raise client_error(f"read of {self!r}: a message is not a ReadResponse "
                                       f"({e})", grpc.StatusCode.DATA_LOSS) from None
                if at != offset + got:
                    raise client_error(f"read of {self!r}: chunk at offset {at}, "
                                       f"expected {offset + got}", grpc.StatusCode.DATA_LOSS)
                if got + len(data) > len(view):
                    raise client_error(f"read of {self!r}: more than the {size} bytes asked for",
                                       grpc.StatusCode.DATA_LOSS)
                view[got:got + len(data)] = data
                got += len(data)
        except grpc.RpcError as e:
            raise self.session._failed(from_rpc_error(e, self.session.client.target)) from None
        if got != size:
            raise client_error(f"read of {self!r}: got {got} of {size} bytes",
                               grpc.StatusCode.DATA_LOSS)

    def read(self, dtype=None, *, offset=0, size=None):
        """Copies the buffer (from ``offset``, ``size`` bytes or to the end)
        to the host: bytes, or a flat numpy array of ``dtype`` when given."""
        data = self._read(offset, size)
        if dtype is None:
            return bytes(data)
        np = _numpy()
        dtype = np.dtype(dtype)
        if len(data) % dtype.itemsize:
            raise client_error(f"{len(data)} bytes are not a whole number of {dtype}")
        return np.frombuffer(data, dtype=dtype)

    def read_into(self, out, offset=0):
        """Fills ``out`` (a contiguous, writable bytes-like object or numpy
        array: all its bytes) with the buffer's bytes at ``offset``, without
        a copy of its own; returns ``out``. When ``out`` lies wholly inside
        host memory of this buffer's session (Session.host_array), the
        daemon copies into it, without gRPC."""
        view = _writable_byte_view(out)
        if len(view):  # on the wire, size 0 means "to the end"
            hit = self.session._region_of(out, view)
            if hit is not None:
                self._region_copy(hit, offset, len(view), pb.RegionCopyRequest.TO_REGION)
            else:
                self._read_into(view, offset)
        return out

    def read_array(self, dtype=None, shape=None, *, offset=0):
        """A numpy array of ``dtype`` and ``shape`` (default: those it was
        uploaded or made with; else a flat array of the whole buffer)."""
        np = _numpy()
        dtype = np.dtype(dtype if dtype is not None else
                         (self.dtype if self.dtype is not None else np.uint8))
        if shape is None and self.shape is not None and dtype == self.dtype and offset == 0:
            shape = self.shape
        if shape is None:
            return self.read(dtype, offset=offset)
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        count = 1
        for d in shape:
            count *= d
        return self.read(dtype, offset=offset, size=count * dtype.itemsize).reshape(shape)

    def memset(self, value, offset=0, size=None):
        """Sets ``size`` bytes (None: to the end) from ``offset`` to ``value``."""
        if size == 0:  # on the wire, 0 means "to the end"
            return
        request = pb.MemsetRequest(session=self.session.token, buffer=self.handle,
                                   offset=int(offset), size=int(size or 0), value=int(value))
        self.session._order()
        self.session._data(self.session.client.stub.Memset, request)

    def copy_from(self, src, size=None, *, src_offset=0, dst_offset=0):
        """Device-to-device copy from ``src`` (a buffer of the same session);
        ``size`` None copies what fits from ``src_offset`` to the end of src."""
        if size is None:
            size = min(src.size - src_offset, self.size - dst_offset)
        request = pb.CopyBufferRequest(session=self.session.token, dst=self.handle,
                                       dst_offset=int(dst_offset), src=src.handle,
                                       src_offset=int(src_offset), size=int(size))
        self.session._order()
        self.session._data(self.session.client.stub.CopyBuffer, request)

    def copy_to(self, dst, size=None, *, src_offset=0, dst_offset=0):
        """Device-to-device copy into ``dst``; see copy_from."""
        dst.copy_from(self, size, src_offset=src_offset, dst_offset=dst_offset)


class Module:
    """A module image loaded for a session (dropped when the session closes)."""

    def __init__(self, session, handle, sha256, uploaded, kind):
        self.session = session
        self.handle = handle
        self.sha256 = sha256
        # True when this load carried the bytes; False when the daemon had them.
        self.uploaded = uploaded
        self.kind = _KIND_NAMES.get(kind, kind)
        self._functions = {}

    def __repr__(self):
        return f"<gpuexec.Module {self.sha256[:12]} ({self.kind})>"

    def function(self, name):
        """The kernel ``name`` of this module, with its parameter layout."""
        function = self._functions.get(name)
        if function is None:
            response = self.session._control(
                self.session.client.stub.GetFunction,
                pb.GetFunctionRequest(session=self.session.token, module=self.handle, name=name))
            function = Function(self, name, response)
            self._functions[name] = function
        return function


class Function:
    """A kernel of a loaded module."""

    def __init__(self, module, name, response):
        self.module = module
        self.session = module.session
        self.name = name
        self.handle = response.function
        self.params = [Param(p.offset, p.size) for p in response.params]
        self._heads = {}
        a = response.attributes
        self.attributes = FunctionAttributes(
            num_registers=a.num_registers, static_shared_bytes=a.static_shared_bytes,
            const_bytes=a.const_bytes, local_bytes=a.local_bytes,
            max_threads_per_block=a.max_threads_per_block,
            max_dynamic_shared_bytes=a.max_dynamic_shared_bytes, ptx_version=a.ptx_version,
            binary_version=a.binary_version)

    def __repr__(self):
        return f"<gpuexec.Function {self.name}, {len(self.params)} params>"

    # A launch's fixed parts serialized -- the fields before the arguments
    # and the attributes after them -- by (grid, block, shared, cluster,
    # attributes) as given: most programs launch a kernel with few
    # geometries.
    _MAX_HEADS = 64

    def _launch_op(self, grid, block, args, shared, cluster, sync, attributes=_NO_ATTRIBUTES):
        """The launch as a Command's operation field (see _wire);
        ``attributes`` as _launch_attributes returns them."""
        key = (grid, block, shared, cluster, attributes)
        try:
            fixed = self._heads.get(key)
        except TypeError:  # a list, say: not kept
            key, fixed = None, None
        if fixed is None:
            fixed = (_wire.launch_head(self.handle, _dim3(grid, "grid"), _dim3(block, "block"),
                                       int(shared),
                                       None if cluster is None else _dim3(cluster, "cluster")),
                     _wire.launch_attributes(*attributes))
            if key is not None:
                if len(self._heads) >= self._MAX_HEADS:
                    self._heads.clear()
                self._heads[key] = fixed
        head, tail = fixed
        if not args and not sync:
            return _wire.launch_op(head + tail if tail else head)
        parts = [head]
        params = self.params
        for i, value in enumerate(args):
            kind = type(value)
            if kind is Buffer or kind is TensorMap:
                parts.append(value._launch_field)
            else:
                parts.append(_wire.launch_arg_field(
                    to_arg(value, i, params[i] if i < len(params) else None)))
        if sync:
            parts.append(_wire.LAUNCH_SYNCHRONIZE)
        if tail:
            parts.append(tail)
        return _wire.launch_op(b"".join(parts))

    def launch(self, grid, block, *args, shared=0, cluster=None, sync=False, cooperative=False,
               pdl=False, non_portable_cluster=False, cluster_policy=None):
        """Enqueues the kernel on its session's stream.

        grid, block, cluster: an int or up to 3 ints. args: one per parameter
        (Buffer, TensorMap, None, Arg from i32()/f32()/..., numpy scalar,
        bytes, int or float). shared: dynamic shared memory bytes (above 48
        KiB is opted in by the daemon). With ``sync`` waits for the session's
        work and returns its GPU time in seconds; else returns None once
        enqueued.

        Launch attributes: ``cooperative``: every block resident at once, so
        that the kernel may synchronize the whole grid (a grid larger than
        the device holds at once is refused). ``pdl``: a programmatic
        dependent launch (compute capability 9.0 and later): the kernel may
        start before the session's previous kernel ends, once that one
        triggers it; it must wait (griddepcontrol.wait) before reading what
        that one wrote. ``non_portable_cluster``: allows clusters of more
        than 8 blocks (up to 16, where the device and kernel allow).
        ``cluster_policy``: how a cluster's blocks are placed, None or
        "default", "spread", "load_balancing" (with a cluster only). A
        value of the wrong kind raises Error (INVALID_ARGUMENT) naming the
        argument, before any call.
        """
        return self.session.launch(self, grid, block, *args, shared=shared, cluster=cluster,
                                   sync=sync, cooperative=cooperative, pdl=pdl,
                                   non_portable_cluster=non_portable_cluster,
                                   cluster_policy=cluster_policy)

    def launch_async(self, grid, block, *args, shared=0, cluster=None, cooperative=False,
                     pdl=False, non_portable_cluster=False, cluster_policy=None):
        """Queues the kernel on its session's stream and returns at once,
        without a round trip to the daemon (the arguments are checked here
        against the kernel's parameters). A failure the daemon finds is
        raised by the session's next call that waits for the daemon: a
        launch, ``synchronize()``, or a buffer's read, write, memset, copy or
        free (each waits for the launches queued before it), as CUDA
        reports asynchronous errors. The launch attributes are
        Function.launch's."""
        self.session.launch_async(self, grid, block, *args, shared=shared, cluster=cluster,
                                  cooperative=cooperative, pdl=pdl,
                                  non_portable_cluster=non_portable_cluster,
                                  cluster_policy=cluster_policy)
