"""gpuexec.aio: the client for asyncio programs, on grpc.aio.

    import asyncio, gpuexec, gpuexec.aio, numpy as np

    async def main():
        async with gpuexec.aio.connect("127.0.0.1:50051") as client, \\
                client.session() as s:
            x = await s.upload(np.arange(n, dtype=np.float32))
            y = await s.upload(np.ones(n, dtype=np.float32))
            module = await s.load_module("saxpy.cubin")
            saxpy = await module.function("saxpy")
            await saxpy.launch_async((n + 255) // 256, 256, gpuexec.f32(2.0), x, y,
                                     gpuexec.u64(n))
            print(await y.get())          # after the launch: same session

    asyncio.run(main())

Kernels from source: ``compiled = await s.compile(cuda_source)``, then
``await compiled.function("saxpy")`` (gpuexec.Session.compile's arguments).

``connect()`` and ``client.session()`` are awaited (``await
gpuexec.aio.connect()``) or entered (``async with``). Every failure raises
gpuexec.Error, as the sync client's do, with the daemon's code and message.

Concurrency: any number of coroutines may use one client, and one session,
at once (on the event loop that made them). A session's launches, copies,
allocations, memsets, frees and synchronizes run in the order their calls
started (each call takes its place in the session's queue at its first
step, before it awaits anything): a read sees every launch started before
it, and a launch started after a write sees its data. Reads one after
another may overlap; other copies run one at a time. Work of different
sessions is independent. Pools (``pool://`` targets) are the sync client's
only.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
import warnings
from typing import (Any, Awaitable, Callable, Generator, Generic, Iterable, List, Optional,
                    Sequence, Tuple, TypeVar, Union)

import grpc
import grpc.aio

from . import _compile, _connect, _wire
from ._aio_objects import AsyncBuffer, AsyncFunction, AsyncModule
from ._aio_stream import AsyncCommandStream, execute_opener
from ._bytes import _byte_view, _is_numpy_array, _numpy
from ._channel import Recipe
from ._compile import AsyncCompiledModule
from ._client import (DEFAULT_CHUNK_BYTES, DEFAULT_TARGET, MAX_CHUNK_BYTES, MAX_MESSAGE_BYTES,
                      Device, _seconds_to_ms, devices_of)
from ._dtype import DType, count_of, dtype as _as_dtype, shape_of
from ._errors import Error, SessionFate, client_error, from_rpc_error, short_token
from ._function import _module_kind
from ._pool import is_pool_target
from ._version_check import DaemonVersionCheck
from .v1 import gpuexec_pb2 as pb
from .v1 import gpuexec_pb2_grpc as pb_grpc

__all__ = ["AsyncBuffer", "AsyncClient", "AsyncCompiledModule", "AsyncFunction", "AsyncModule",
           "AsyncSession", "connect"]

T = TypeVar("T")
Shape = Union[int, Iterable[int]]


class _Opening(Generic[T]):
    """What connect() and session() return: awaited, the object; entered
    with ``async with``, the object, closed at the end of the block."""

    def __init__(self, opening: Callable[[], Awaitable[T]]) -> None:
        self._opening = opening
        self._opened: Optional[T] = None

    def __await__(self) -> Generator[Any, None, T]:
        return self._opening().__await__()

    async def __aenter__(self) -> T:
        self._opened = await self._opening()
        return self._opened

    async def __aexit__(self, *exc: Any) -> None:
        opened, self._opened = self._opened, None
        if opened is not None:
            await opened.__aexit__(*exc)  # type: ignore[attr-defined]


def connect(target: Optional[str] = None, *, timeout: float = 10.0,
            chunk_bytes: int = DEFAULT_CHUNK_BYTES, control_timeout: float = 60.0,
            channel_options: Iterable[Tuple[str, Any]] = (), token: Optional[str] = None,
            root_ca: Any = None, cert: Any = None, key: Any = None, tls: Optional[bool] = None,
            allow_token_over_plain_tcp: bool = False) -> _Opening["AsyncClient"]:
    """Connects to a daemon and waits up to ``timeout`` seconds for it:
    ``client = await gpuexec.aio.connect(...)``, or ``async with
    gpuexec.aio.connect(...) as client``.

    The target, token and TLS options are gpuexec.connect's (``target``
    "host:port" or "unix:/path", by default $GPUEXEC_TARGET, else
    127.0.0.1:50051; $GPUEXEC_TOKEN, $GPUEXEC_TLS_CA, $GPUEXEC_TLS_CERT,
    $GPUEXEC_TLS_KEY). A connection that fails raises gpuexec.Error
    (UNAVAILABLE) naming the target and the cause, as gpuexec.connect does:
    at once where a probe explains it (nothing listening, a TLS handshake
    refused), else once ``timeout`` has passed. Pools ("pool://") and host
    memory are the sync client's only.
    """
    async def opening() -> AsyncClient:
        return await _open(target, timeout, chunk_bytes, control_timeout, channel_options,
                           token, root_ca, cert, key, tls, allow_token_over_plain_tcp)
    return _Opening(opening)


async def _open(target: Optional[str], timeout: float, chunk_bytes: int,
                control_timeout: float, channel_options: Iterable[Tuple[str, Any]],
                token: Optional[str], root_ca: Any, cert: Any, key: Any, tls: Optional[bool],
                allow_token_over_plain_tcp: bool) -> "AsyncClient":
    target = target or os.environ.get("GPUEXEC_TARGET") or DEFAULT_TARGET
    if is_pool_target(target):
        raise client_error(f"gpuexec.aio.connect cannot open the pool {target[:256]!r}: "
                           "pools are the sync client's only; use gpuexec.connect, or connect "
                           "to one of its daemons")
    if not 0 < chunk_bytes <= MAX_CHUNK_BYTES:
        raise client_error(f"chunk_bytes must be in (0, {MAX_CHUNK_BYTES}], got {chunk_bytes!r}")
    recipe = Recipe(target, token=token, root_ca=root_ca, cert=cert, key=key, tls=tls,
                    allow_token_over_plain_tcp=allow_token_over_plain_tcp)
    options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
               ("grpc.max_send_message_length", MAX_MESSAGE_BYTES)] + list(channel_options)
    if recipe.credentials is None:
        channel = grpc.aio.insecure_channel(target, options=options)
    else:
        channel = grpc.aio.secure_channel(target, recipe.credentials, options=options)
    try:
        await _wait_ready(channel, recipe, target, timeout, options)
    except BaseException:
        await channel.close()
        raise
    return AsyncClient(channel, target, tuple(recipe.metadata()), chunk_bytes, control_timeout)


async def _wait_ready(channel: Any, recipe: Recipe, target: str, timeout: float,
                      options: List[Tuple[str, Any]]) -> None:
    """_connect.wait_ready for a grpc.aio channel: returns once it is
    ready; raises at once when a probe after a failed attempt explains the
    failure, else once ``timeout`` has passed."""
    deadline = time.monotonic() + timeout
    failed = probed = False
    state = channel.get_state(try_to_connect=True)
    while state != grpc.ChannelConnectivity.READY:
        if state == grpc.ChannelConnectivity.TRANSIENT_FAILURE:
            failed = True
            if not probed:
                # What went wrong, once; a failure the probe cannot explain
                # waits out the timeout, as a daemon may be starting.
                probed = True
                budget = min(_connect.PROBE_S, max(deadline - time.monotonic(), 0.2))
                cause = await asyncio.get_running_loop().run_in_executor(
                    None, _connect.diagnose, recipe, target, options, budget)
                if cause is not None:
                    raise _connect.unavailable(target, cause)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        try:
            await asyncio.wait_for(channel.wait_for_state_change(state), remaining)
        except asyncio.TimeoutError:
            break
        state = channel.get_state(try_to_connect=True)
    if state == grpc.ChannelConnectivity.READY:
        return
    if not failed:
        raise _connect.unavailable(target, f"no answer within {timeout:g} s: is the host up, "
                                           "and gpuexecd listening on that port? "
                                           f"{_connect.HINT_TARGET}")
    hint = (" (TLS: is the daemon serving TLS there, signed by the root CA given, and does it "
            "take this client's certificate?)" if recipe.tls else "")
    raise _connect.unavailable(target, f"no connection within {timeout:g} s{hint}")


class AsyncClient:
    """A grpc.aio connection to one daemon (made by gpuexec.aio.connect);
    ``async with`` closes it. Its sessions stay open on the daemon until
    closed or until their lease lapses."""

    def __init__(self, channel: Any, target: str, metadata: tuple, chunk_bytes: int,
                 control_timeout: float) -> None:
        self.channel = channel
        self.target = target
        self.chunk_bytes = chunk_bytes
        # Deadline of control calls (sessions, functions); data calls
        # (copies, module loads, launches) have none.
        self.control_timeout = control_timeout
        self._metadata = metadata or None  # the token, on every call
        self._stub = pb_grpc.GpuExecStub(channel)
        self._write_call = channel.stream_unary(
            "/gpuexec.v1.GpuExec/Write", request_serializer=None,
            response_deserializer=pb.WriteResponse.FromString)
        self._read_call = channel.unary_stream(
            "/gpuexec.v1.GpuExec/Read", request_serializer=pb.ReadRequest.SerializeToString,
            response_deserializer=None)
        self._open_execute = execute_opener(channel, metadata)
        self._check_version = DaemonVersionCheck()
        self._closed = False

    def __repr__(self) -> str:
        return f"<gpuexec.aio.AsyncClient {self.target}>"

    @property
    def closed(self) -> bool:
        """True once close() ran."""
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise client_error(f"the client of {self.target[:256]} was closed by close(): "
                               "connect again (its sessions stay open on the daemon until "
                               "their lease lapses)", grpc.StatusCode.FAILED_PRECONDITION)

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def close(self) -> None:
        """Closes the channel; calls still running fail with CANCELLED.
        Its sessions stay open on the daemon until their lease lapses:
        close them first (``async with``)."""
        self._closed = True
        await self.channel.close()

    async def _call(self, method: Any, request: Any, timeout: Optional[float]) -> Any:
        self._check_open()
        try:
            return await method(request, timeout=timeout, metadata=self._metadata)
        except grpc.RpcError as e:
            raise from_rpc_error(e, self.target) from None

    async def devices(self) -> List[Device]:
        """The host's devices: a list of gpuexec.Device."""
        response = await self._call(self._stub.ListDevices, pb.ListDevicesRequest(),
                                    self.control_timeout)
        self._check_version(self.target, response.daemon_version)
        return devices_of(response, self.target)

    def session(self, device: Optional[int] = None, *, lease: Optional[float] = None,
                memory_limit: int = 0, kernel_time_limit: Optional[float] = None,
                gpu_time: bool = True) -> _Opening["AsyncSession"]:
        """Opens a session: ``s = await client.session()``, or ``async with
        client.session() as s`` (closed at the end of the block). The
        arguments are gpuexec.Client.session's: device index or None for
        the daemon's choice; lease seconds (None: the daemon's default);
        memory_limit bytes (0: the daemon's default); kernel_time_limit
        seconds (None: the daemon's); gpu_time False for untimed work."""
        async def opening() -> AsyncSession:
            request = pb.OpenSessionRequest(
                lease_ms=_seconds_to_ms(lease, "lease"), memory_limit_bytes=memory_limit,
                kernel_time_limit_ms=_seconds_to_ms(kernel_time_limit, "kernel_time_limit"),
                untimed=not gpu_time)
            if device is not None:
                request.device = device
            response = await self._call(self._stub.OpenSession, request, self.control_timeout)
            self._check_version(self.target, response.daemon_version)
            return AsyncSession(self, response)
        return _Opening(opening)


class AsyncSession:
    """A daemon session on one device (made by AsyncClient.session): owns
    its buffers and modules, freed when it closes. See the module's text
    for the order of its calls."""

    def __init__(self, client: AsyncClient, response: Any) -> None:
        self.client = client
        self.token: str = response.session  # the session's only credential
        self.device: int = response.device
        self.lease = response.lease_ms / 1000.0
        self.memory_limit: int = response.memory_limit_bytes
        self.kernel_time_limit = response.kernel_time_limit_ms / 1000.0  # 0: no limit
        self.gpu_time = not response.untimed  # False: untimed (session(gpu_time=False))
        self._closed = False
        self._fate = SessionFate(self.token)
        self._stream = AsyncCommandStream(client._open_execute, self.token, client.target,
                                          client._check_open)

    def __repr__(self) -> str:
        return f"<gpuexec.aio.AsyncSession {short_token(self.token)} on device {self.device}>"

    async def __aenter__(self) -> "AsyncSession":
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc is None:
            await self.close()
            return
        # The block's exception goes on; a failure to close is noted on it.
        try:
            await self.close()
        except Exception as e:  # pylint: disable=broad-except
            if hasattr(exc, "add_note"):
                exc.add_note(f"gpuexec: closing session {short_token(self.token)} then "
                             f"failed too: {e}")

    @property
    def closed(self) -> bool:
        """True once close() ran here."""
        return self._closed

    def _failed(self, e: Error) -> Error:
        return self._fate.failed(e)

    async def _control(self, method: Any, request: Any) -> Any:
        try:
            return await self.client._call(method, request, self.client.control_timeout)
        except Error as e:
            raise self._failed(e) from None

    async def _command(self, op: bytes) -> Any:
        """A command on the session's stream, answered."""
        try:
            return await self._stream.submit(op)
        except Error as e:
            raise self._failed(e) from None

    async def _unwaited(self, op: bytes) -> None:
        try:
            await self._stream.submit_unwaited(op)
        except Error as e:
            raise self._failed(e) from None

    async def close(self) -> None:
        """Closes the session on the daemon, freeing all it holds; its calls
        still waiting fail with CANCELLED, and launches not yet sent are
        dropped. Idempotent; a session the daemon ended already (a reset,
        its lease) closes without an error."""
        if self._closed:
            return
        self._closed = True
        await self._stream.close()
        try:
            await self.client._call(self.client._stub.CloseSession,
                                    pb.CloseSessionRequest(session=self.token),
                                    self.client.control_timeout)
        except Error as e:
            if (e.code != grpc.StatusCode.NOT_FOUND or not e.message.startswith(
                    f"session {short_token(self.token)} was closed: ")):
                raise
            untold = self._fate.untold(e)
            if untold is not None:
                warnings.warn(f"gpuexec: session {short_token(self.token)} was closed by the "
                              f"daemon before close(): {untold}", RuntimeWarning, stacklevel=2)

    async def keep_alive(self) -> float:
        """Renews the lease; returns the lease granted in seconds."""
        response = await self._control(self.client._stub.KeepAlive,
                                       pb.KeepAliveRequest(session=self.token))
        self.lease = response.lease_ms / 1000.0
        return self.lease

    async def alloc(self, nbytes: int, *, dtype: Any = None,
                    shape: Optional[Shape] = None) -> AsyncBuffer:
        """``nbytes`` of device memory, which reads as zeros until written
        (the daemon clears it). dtype: the elements (default uint8); shape:
        default as many elements as fit. A shape that needs more bytes is
        refused before the call."""
        d = None if dtype is None else _as_dtype(dtype)
        dims = None if shape is None else shape_of(shape)
        if dims is not None:
            need = count_of(dims) * (1 if d is None else d.itemsize)
            if need > nbytes:
                raise client_error(f"alloc of {nbytes} bytes with shape {dims} of "
                                   f"{d or 'uint8'}: that shape needs {need} bytes")
        result = await self._command(pb.Command(
            allocate=pb.AllocateRequest(size=int(nbytes))).SerializeToString())
        return AsyncBuffer(self, result.allocate.buffer, result.allocate.size, d, dims)

    async def empty(self, shape: Shape, dtype: Any = "float32") -> AsyncBuffer:
        """A buffer of ``shape`` and ``dtype`` (a name, numpy dtype or
        gpuexec.DType); its contents are zeros (see alloc), but a program
        should not count on that: use zeros()."""
        d = _as_dtype(dtype)
        dims = shape_of(shape)
        return await self.alloc(max(count_of(dims) * d.itemsize, 1), dtype=d, shape=dims)

    async def zeros(self, shape: Shape, dtype: Any = "float32") -> AsyncBuffer:
        """A zero-filled buffer of ``shape`` and ``dtype``: one allocation,
        no upload (the daemon clears new memory on the session's stream)."""
        return await self.empty(shape, dtype)

    async def upload(self, data: Any) -> AsyncBuffer:
        """A new buffer holding ``data``: a numpy array (its shape and dtype;
        one of a dtype a buffer does not hold, complex or structured, as its
        bytes: uint8) or bytes-like data (uint8)."""
        if _is_numpy_array(data):
            try:
                d = _as_dtype(data.dtype)
            except Error:
                d = None
            if d is not None:
                return await self._upload(data, d)
        return await self._upload(_byte_view(data), None)

    async def asarray(self, a: Any, dtype: Any = None) -> AsyncBuffer:
        """``a`` as a buffer of this session: an AsyncBuffer of this session
        as it is; a numpy array (or what numpy.asarray takes, converted to
        ``dtype`` when given) uploaded into a new buffer of its shape and
        dtype. Needs numpy."""
        if isinstance(a, AsyncBuffer):
            if a.session is not self:
                raise client_error(f"asarray of {a!r}: it is a buffer of session "
                                   f"{short_token(a.session.token)}, not of {self!r}; copy it "
                                   "through the host (await session.asarray(await buffer.get()))")
            if dtype is not None and _as_dtype(dtype) is not a.dtype:
                raise client_error(f"asarray of {a!r} as {_as_dtype(dtype)}: a buffer is not "
                                   "converted on the device; convert a copy (get().astype())")
            return a
        np = _numpy()
        arr = np.asarray(a) if dtype is None else np.asarray(a, dtype=_as_dtype(dtype).numpy)
        return await self._upload(arr, _as_dtype(arr.dtype))

    async def _upload(self, data: Any, d: Optional[DType]) -> AsyncBuffer:
        view = _byte_view(data)
        shape = tuple(data.shape) if d is not None else (len(view),)
        buffer = await self.alloc(max(len(view), 1), dtype=d, shape=shape)
        if len(view):
            try:
                await buffer.write(view)
            except BaseException:
                try:
                    await buffer.free()
                except Exception:  # pylint: disable=broad-except
                    pass  # the write's error is the one to raise
                raise
        return buffer

    async def load_module(self, source: Union[str, "os.PathLike[str]", bytes],
                          kind: Optional[str] = None) -> AsyncModule:
        """Loads a module image: a path (.cubin, .ptx, .fatbin) or its bytes.
        Sends the image's SHA-256 alone first and uploads the bytes only when
        the daemon does not hold them yet. ``kind`` ("cubin", "ptx",
        "fatbin") is taken from the file name or the image when not given."""
        self.client._check_open()
        path = None
        loop = asyncio.get_running_loop()
        if isinstance(source, (str, os.PathLike)):
            path = os.fspath(source)
            try:
                image = await loop.run_in_executor(None, _read_file, path)
            except OSError as e:
                raise client_error(f"cannot read the module {path[:256]!r}: "
                                   f"{e.strerror or e}") from None
        else:
            image = bytes(source)
        module_kind = _module_kind(image, path, kind)
        digest = await loop.run_in_executor(None, lambda: hashlib.sha256(image).hexdigest())
        header = pb.ModuleHeader(session=self.token, sha256=digest, size=len(image),
                                 kind=module_kind)
        chunk = self.client.chunk_bytes

        async def load(with_image: bool) -> Any:
            call = self.client._stub.LoadModule(metadata=self.client._metadata)
            await call.write(pb.LoadModuleRequest(header=header))
            if with_image:
                for i in range(0, len(image), chunk):
                    await call.write(pb.LoadModuleRequest(chunk=image[i:i + chunk]))
            await call.done_writing()
            return await call

        try:
            try:
                response = await load(False)
            except grpc.RpcError as e:
                first = from_rpc_error(e, self.client.target)
                if (first.code != grpc.StatusCode.NOT_FOUND
                        or first.message.startswith("session ")):
                    raise first from None
                response = await load(True)
        except grpc.RpcError as e:
            raise self._failed(from_rpc_error(e, self.client.target)) from None
        except Error as e:
            raise self._failed(e) from None
        return AsyncModule(self, response.module, response.sha256, response.uploaded,
                           module_kind)

    async def compile(self, source: Union[str, bytes], *,
                      name: str = _compile.DEFAULT_SOURCE_NAME,
                      headers: _compile.Headers = None, options: Union[str, Sequence[str]] = (),
                      name_expressions: Union[str, Sequence[str]] = (),
                      return_image: bool = False) -> AsyncCompiledModule:
        """Has the daemon compile CUDA C++ ``source`` and load it as a
        module of this session: gpuexec.Session.compile's arguments and
        errors; returns an AsyncCompiledModule (``await
        compiled.function(name)``)."""
        request = _compile.compile_request(self.token, source, name, headers, options,
                                           name_expressions, return_image)
        try:
            response = await self.client._call(self.client._stub.CompileModule, request,
                                               _compile.COMPILE_TIMEOUT_S)
        except Error as e:
            raise self._failed(e) from None
        kind = pb.MODULE_KIND_PTX if response.image_is_ptx else pb.MODULE_KIND_CUBIN
        module = AsyncModule(self, response.module, response.sha256, not response.cached, kind)
        return AsyncCompiledModule(module, response)

    async def synchronize(self) -> float:
        """Waits for the work started before this call; returns the session's
        GPU time in seconds since the previous synchronize (0.0 when there
        was none)."""
        result = await self._command(_wire.SYNCHRONIZE_OP)
        return float(result.gpu_time_ns) / 1e9


def _read_file(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()
