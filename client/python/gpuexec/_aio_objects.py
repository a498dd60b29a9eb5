"""gpuexec.aio's buffers, modules and functions (see gpuexec.aio).

Each call queues its work on the session in the order the calls started
(see _aio_stream): a read after launches sees their results.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple, Union

import grpc

from ._args import Arg
from ._bytes import _byte_view, _numpy, _parse_read_response, varint as _varint
from ._dtype import ArrayFacts, DType, dtype as _as_dtype, uint8
from ._errors import Error, client_error, from_rpc_error, short_token
from ._function import Function, FunctionAttributes, Param, _KIND_NAMES, _launch_attributes
from .v1 import gpuexec_pb2 as pb

if TYPE_CHECKING:  # pragma: no cover
    from .aio import AsyncSession

Dims = Union[int, Tuple[int, ...]]


def _index(value: Any, what: str) -> int:
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise client_error(f"{what} must be an int, got a {type(value).__name__[:40]}")
    return int(value.__index__())


def _op(field: str, request: Any) -> bytes:
    """A Command's operation field ``field`` holding ``request``."""
    return pb.Command(**{field: request}).SerializeToString()


class AsyncBuffer(ArrayFacts):
    """Device memory of an AsyncSession, as an array: ``shape``, ``dtype``
    (a gpuexec.DType; uint8 for alloc() without one), ``size`` (elements)
    and ``nbytes``, as gpuexec.Buffer's. get() reads it back as a numpy
    array of that shape and dtype. ``async with`` frees it at the end of
    the block; otherwise it lives until free() or its session's close."""

    def __init__(self, session: "AsyncSession", handle: int, capacity: int, dtype: Any = None,
                 shape: Optional[Tuple[int, ...]] = None) -> None:
        self.session = session
        self.handle = handle
        self.dtype: DType = uint8 if dtype is None else _as_dtype(dtype)
        self.shape: Tuple[int, ...] = ((capacity // self.dtype.itemsize,) if shape is None
                                       else shape)
        self._capacity = capacity  # the allocation's bytes
        self._freed = False
        self._arg = Arg("buffer", handle, 0)  # as a kernel argument

    def __repr__(self) -> str:
        dims = ", ".join(map(str, self.shape))
        return (f"<gpuexec.aio.AsyncBuffer 0x{self.handle:x} {self.dtype}[{dims}], session "
                f"{short_token(self.session.token)}>")

    def __len__(self) -> int:
        return self.shape[0] if self.shape else 1

    async def __aenter__(self) -> "AsyncBuffer":
        return self

    async def __aexit__(self, exc_type: Any, *exc: Any) -> None:
        if self._freed or self.session.closed:
            return
        try:
            await self.free()
        except Error:
            if exc_type is None:
                raise

    def ptr(self, offset: int = 0) -> Arg:
        """A kernel argument: this buffer's device address plus ``offset``."""
        return Arg("buffer", self.handle, int(offset))

    def _as_kernel_arg(self) -> Arg:
        return self._arg

    def _range(self, what: str, offset: Any, size: Any) -> Tuple[int, int]:
        """(offset, bytes) of ``size`` bytes (None: to the end) at
        ``offset``; raises before any call for a range past the end."""
        at = _index(offset, f"{what}'s offset")
        limit = self.nbytes
        n = max(limit - at, 0) if size is None else _index(size, f"{what}'s size")
        if at < 0 or n < 0 or at + n > limit:
            raise client_error(f"{what} of {self!r}: bytes [{at}, {at + n}) are past the end "
                               f"of its {limit} bytes; ask for a range inside it",
                               grpc.StatusCode.OUT_OF_RANGE)
        return at, n

    async def free(self) -> None:
        """Frees the allocation, after the work queued before this call."""
        self._freed = True
        await self.session._command(_op("free", pb.FreeRequest(buffer=self.handle)))

    async def memset(self, value: int, offset: int = 0, size: Optional[int] = None) -> None:
        """Sets ``size`` bytes (None: to the end) from ``offset`` to the byte
        ``value``, after the work queued before this call."""
        at, n = self._range("memset", offset, size)
        if n == 0:  # on the wire, 0 means "to the end"
            return
        await self.session._command(_op("memset", pb.MemsetRequest(
            buffer=self.handle, offset=at, size=n, value=int(value))))

    async def copy_from(self, src: "AsyncBuffer", size: Optional[int] = None, *,
                        src_offset: int = 0, dst_offset: int = 0) -> None:
        """Device-to-device copy from ``src`` (a buffer of the same session);
        ``size`` None copies what fits from ``src_offset`` to src's end."""
        if size is None:
            size = max(min(src.nbytes - src_offset, self.nbytes - dst_offset), 0)
        at, n = self._range("copy_from", dst_offset, size)
        src_at, _ = src._range("copy_from's source", src_offset, size)
        if n == 0:
            return
        await self.session._command(_op("copy_buffer", pb.CopyBufferRequest(
            dst=self.handle, dst_offset=at, src=src.handle, src_offset=src_at, size=n)))

    async def write(self, data: Any, offset: int = 0) -> int:
        """Copies bytes-like data or a numpy array to the buffer at
        ``offset``, after the work queued before this call; returns the
        bytes written."""
        view = _byte_view(data)
        at, _ = self._range("write", offset, len(view))
        session = self.session
        gate = session._stream.gate(reading=False)
        try:
            await gate.turn
            chunk = session.client.chunk_bytes
            first = pb.WriteRequest(session=session.token, buffer=self.handle,
                                    offset=at).SerializeToString()
            call = session.client._write_call(metadata=session.client._metadata)
            try:
                if len(view) == 0:
                    await call.write(first)
                for i in range(0, len(view), chunk):
                    piece = view[i:i + chunk]
                    await call.write(b"".join((first if i == 0 else b"", b"\x22",
                                               _varint(len(piece)), piece)))
                await call.done_writing()
                response = await call
            except grpc.RpcError as e:
                raise from_rpc_error(e, session.client.target) from None
        except Error as e:
            raise session._failed(e) from None
        finally:
            gate.finish()
        return int(response.bytes_written)

    async def read(self, dtype: Any = None, *, offset: int = 0,
                   size: Optional[int] = None) -> Any:
        """Copies ``size`` bytes (None: to the end) from ``offset`` to the
        host, after the work queued before this call: bytes, or a flat
        numpy array of ``dtype`` when given."""
        offset, size = self._range("read", offset, size)
        np_dtype = None
        if dtype is not None:
            np_dtype = _as_dtype(dtype).numpy  # numpy's absence is raised before the call
            if size % np_dtype.itemsize:
                raise client_error(f"read of {self!r}: {size} bytes are not a whole number of "
                                   f"{np_dtype.name} ({np_dtype.itemsize} bytes)")
        data = await self._read(offset, size)
        if np_dtype is None:
            return bytes(data)
        return _numpy().frombuffer(data, dtype=np_dtype)

    async def _read(self, offset: int, size: int) -> bytearray:
        if size == 0:  # on the wire, 0 means "to the end"
            return bytearray()
        session = self.session
        out = bytearray(size)
        got = 0
        gate = session._stream.gate(reading=True)
        try:
            await gate.turn
            request = pb.ReadRequest(session=session.token, buffer=self.handle,
                                     offset=int(offset), size=size,
                                     chunk_size=session.client.chunk_bytes)
            try:
                async for raw in session.client._read_call(request,
                                                           metadata=session.client._metadata):
                    try:
                        at, data = _parse_read_response(raw)
                    except ValueError as e:
                        raise client_error(f"read of {self!r}: a message is not a ReadResponse "
                                           f"({e})", grpc.StatusCode.DATA_LOSS) from None
                    if at != offset + got or got + len(data) > size:
                        raise client_error(f"read of {self!r}: chunk of {len(data)} bytes at "
                                           f"offset {at}, expected offset {offset + got} and at "
                                           f"most {size - got} bytes", grpc.StatusCode.DATA_LOSS)
                    out[got:got + len(data)] = data
                    got += len(data)
            except grpc.RpcError as e:
                raise from_rpc_error(e, session.client.target) from None
        except Error as e:
            raise session._failed(e) from None
        finally:
            gate.finish()
        if got != size:
            raise client_error(f"read of {self!r}: got {got} of {size} bytes",
                               grpc.StatusCode.DATA_LOSS)
        return out

    async def get(self) -> Any:
        """The buffer as a new numpy array of its shape and dtype (needs
        numpy), after the work queued before this call."""
        np_dtype = self.dtype.numpy
        data = await self._read(0, self.nbytes)
        return _numpy().frombuffer(data, dtype=np_dtype).reshape(self.shape)

    async def set(self, array: Any) -> None:
        """Writes ``array`` (a numpy array or what numpy.asarray takes) into
        the buffer: the same shape; its dtype converted to the buffer's
        where numpy's assignment would (casting "same_kind")."""
        np = _numpy()
        target = self.dtype.numpy
        a = np.asarray(array)
        if tuple(a.shape) != self.shape:
            raise client_error(f"set of {self!r}: an array of shape {tuple(a.shape)[:33]}; "
                               f"the buffer's is {self.shape} (reshape one of them)")
        if a.dtype != target:
            if not np.can_cast(a.dtype, target, casting="same_kind"):
                raise client_error(f"set of {self!r}: {a.dtype.name} values do not convert "
                                   f"safely to {self.dtype} (numpy's same_kind rule); convert "
                                   f"them yourself, e.g. a.astype('{self.dtype}')")
            a = a.astype(target)
        await self.write(a)


class AsyncModule:
    """A module image loaded for an AsyncSession (dropped when it closes)."""

    def __init__(self, session: "AsyncSession", handle: int, sha256: str, uploaded: bool,
                 kind: int) -> None:
        self.session = session
        self.handle = handle
        self.sha256 = sha256
        # True when this load carried the bytes; False when the daemon had them.
        self.uploaded = uploaded
        self.kind = _KIND_NAMES.get(kind, kind)
        self._functions: Dict[str, AsyncFunction] = {}

    def __repr__(self) -> str:
        return f"<gpuexec.aio.AsyncModule {self.sha256[:12]} ({self.kind})>"

    async def function(self, name: str) -> "AsyncFunction":
        """The kernel ``name`` of this module, with its parameter layout."""
        function = self._functions.get(name)
        if function is None:
            response = await self.session._control(
                self.session.client._stub.GetFunction,
                pb.GetFunctionRequest(session=self.session.token, module=self.handle, name=name))
            function = self._functions.setdefault(name, AsyncFunction(self, name, response))
        return function


class AsyncFunction:
    """A kernel of an AsyncModule. Launches are checked and put on the wire
    as gpuexec.Function's are (the same arguments)."""

    def __init__(self, module: AsyncModule, name: str, response: Any) -> None:
        self.module = module
        self.session = module.session
        self.name = name
        # The sync client's Function serializes launches; it is never
        # launched itself.
        self._encoder = Function(module, name, response)  # type: ignore[arg-type]
        self.handle: int = self._encoder.handle
        self.params: List[Param] = self._encoder.params
        self.attributes: FunctionAttributes = self._encoder.attributes

    def __repr__(self) -> str:
        return f"<gpuexec.aio.AsyncFunction {self.name}, {len(self.params)} params>"

    def _op(self, grid: Dims, block: Dims, args: tuple, shared: int, cluster: Optional[Dims],
            sync: bool, cooperative: bool, pdl: bool, non_portable_cluster: bool,
            cluster_policy: Optional[str]) -> bytes:
        for i, value in enumerate(args):
            if type(value) is AsyncBuffer and value.session is not self.session:
                raise client_error(
                    f"argument {i} of kernel {self._encoder._shown_name}: the buffer belongs to "
                    f"session {short_token(value.session.token)}, the kernel to session "
                    f"{short_token(self.session.token)}; a launch takes buffers of its own "
                    "session: upload the data in this one")
        return self._encoder._launch_op(
            grid, block, args, shared, cluster, sync,
            _launch_attributes(cooperative, pdl, non_portable_cluster, cluster_policy))

    async def launch(self, grid: Dims, block: Dims, *args: Any, shared: int = 0,
                     cluster: Optional[Dims] = None, sync: bool = False,
                     cooperative: bool = False, pdl: bool = False,
                     non_portable_cluster: bool = False,
                     cluster_policy: Optional[str] = None) -> Optional[float]:
        """Queues the kernel on the session's stream and waits for the
        daemon to take it (a failure it finds is raised here). With ``sync``
        waits for the session's work and returns its GPU seconds since the
        previous synchronize; else returns None. The arguments and launch
        attributes are gpuexec.Function.launch's."""
        op = self._op(grid, block, args, shared, cluster, sync, cooperative, pdl,
                      non_portable_cluster, cluster_policy)
        result = await self.session._command(op)
        return result.gpu_time_ns / 1e9 if sync else None

    async def launch_async(self, grid: Dims, block: Dims, *args: Any, shared: int = 0,
                           cluster: Optional[Dims] = None, cooperative: bool = False,
                           pdl: bool = False, non_portable_cluster: bool = False,
                           cluster_policy: Optional[str] = None) -> None:
        """Queues the kernel without a round trip to the daemon (it waits
        only while 8192 commands of the session are queued and not yet
        sent). A failure the daemon finds is raised by the session's next
        call that waits: a launch, synchronize(), an allocation, or a
        buffer's read, write, memset, copy or free."""
        op = self._op(grid, block, args, shared, cluster, False, cooperative, pdl,
                      non_portable_cluster, cluster_policy)
        await self.session._unwaited(op)
