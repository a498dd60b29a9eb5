"""Session: one session on one device of a daemon, and everything made in
it (buffers, modules, host memory, graphs); Client.session() opens one.

Ownership follows the daemon: closing a Session (``with`` or ``close()``)
frees everything made in it on the daemon.
"""

from __future__ import annotations

import hashlib
import logging
import os
import warnings
import weakref
from typing import TYPE_CHECKING, Any, Iterator, Optional, Sequence, Union

import grpc

from . import _compile, _host_memory, _ring, _ring_records, _wire
from ._buffer import Buffer, ShapeLike, _PointerBases
from ._bytes import _byte_view, _is_numpy_array, _numpy
from ._commands import CommandStream
from ._dtype import DType, count_of, dtype as _as_dtype, element_bytes, like, shape_of
from ._errors import Error, SessionFate, client_error, from_rpc_error, short_token
from ._function import Module, _launch_attributes, _module_kind
from ._graph import Graph
from ._session_commands import SessionCommands
from .v1 import gpuexec_pb2 as pb

if TYPE_CHECKING:
    from ._client import Client

_SYNCHRONIZE_RECORD = (_ring.SYNCHRONIZE, b"")
_log = logging.getLogger("gpuexec")


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
        self.token: str = response.session  # the session's only credential
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
        self.shm_socket: str = client.shm_socket or response.shm_socket
        # Launches and synchronizes: the session's command ring where the
        # daemon serves one on that socket, else one Execute stream; either
        # opened at the first.
        self._commands = SessionCommands(CommandStream(client, self.token),
                                         self._ring_opener(response))
        # The live host memory regions, which Buffer.write and read_into
        # consult.
        self._regions: _host_memory.HostRegions = _host_memory.HostRegions()
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
        answer_area = response.command_ring_version >= _ring.ANSWER_AREA_VERSION
        return lambda: _ring.CommandRing(socket_path, token, client.control_timeout,
                                         client.ring_spin_wait, answer_area)

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

