"""gpuexec.aio's buffers, modules and functions (see gpuexec.aio).

Each call queues its work on the session in the order the calls started
(see _aio_stream): a read after launches sees their results.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple, Union

import grpc

from ._args import Arg
from ._bytes import _byte_view, _numpy, _parse_read_response, varint as _varint
from ._errors import Error, client_error, from_rpc_error, short_token
from ._function import Function, FunctionAttributes, Param, _KIND_NAMES, _launch_attributes
from .v1 import gpuexec_pb2 as pb

if TYPE_CHECKING:  # pragma: no cover
    from .aio import AsyncSession

Dims = Union[int, Tuple[int, ...]]


def _op(field: str, request: Any) -> bytes:
    """A Command's operation field ``field`` holding ``request``."""
    return pb.Command(**{field: request}).SerializeToString()


class AsyncBuffer:
    """Device memory of an AsyncSession: ``nbytes`` bytes, read back by
    get() as a numpy array of ``shape`` and ``dtype`` (a flat array of
    uint8 when it was made by alloc()). ``async with`` frees it at the end
    of the block; otherwise it lives until free() or its session's close."""

    def __init__(self, session: "AsyncSession", handle: int, nbytes: int, dtype: Any = None,
                 shape: Optional[Tuple[int, ...]] = None) -> None:
        self.session = session
        self.handle = handle
        self.nbytes = nbytes
        self.dtype = dtype
        self.shape = shape if shape is not None else (nbytes,)
        self._freed = False
        self._arg = Arg("buffer", handle, 0)  # as a kernel argument

    def __repr__(self) -> str:
        return f"<gpuexec.aio.AsyncBuffer 0x{self.handle:x}, {self.nbytes} bytes>"

    def __len__(self) -> int:
        return self.nbytes

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

    async def free(self) -> None:
        """Frees the allocation, after the work queued before this call."""
        self._freed = True
        await self.session._command(_op("free", pb.FreeRequest(buffer=self.handle)))

    async def memset(self, value: int, offset: int = 0, size: Optional[int] = None) -> None:
        """Sets ``size`` bytes (None: to the end) from ``offset`` to the byte
        ``value``, after the work queued before this call."""
        if size == 0:  # on the wire, 0 means "to the end"
            return
        await self.session._command(_op("memset", pb.MemsetRequest(
            buffer=self.handle, offset=int(offset), size=int(size or 0), value=int(value))))

    async def copy_from(self, src: "AsyncBuffer", size: Optional[int] = None, *,
                        src_offset: int = 0, dst_offset: int = 0) -> None:
        """Device-to-device copy from ``src`` (a buffer of the same session);
        ``size`` None copies what fits from ``src_offset`` to src's end."""
        if size is None:
            size = min(src.nbytes - src_offset, self.nbytes - dst_offset)
        await self.session._command(_op("copy_buffer", pb.CopyBufferRequest(
            dst=self.handle, dst_offset=int(dst_offset), src=src.handle,
            src_offset=int(src_offset), size=int(size))))

    async def write(self, data: Any, offset: int = 0) -> int:
        """Copies bytes-like data or a numpy array to the buffer at
        ``offset``, after the work queued before this call; returns the
        bytes written."""
        view = _byte_view(data)
        session = self.session
        gate = session._stream.gate(reading=False)
        try:
            await gate.turn
            chunk = session.client.chunk_bytes
            first = pb.WriteRequest(session=session.token, buffer=self.handle,
                                    offset=int(offset)).SerializeToString()
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

    async def read(self, *, offset: int = 0, size: Optional[int] = None) -> bytes:
        """The buffer's bytes (from ``offset``, ``size`` bytes or to the
        end), after the work queued before this call."""
        if size is None:
            size = max(self.nbytes - offset, 0)
        if size == 0:  # on the wire, 0 means "to the end"
            return b""
        size = int(size)
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
        return bytes(out)

    async def get(self) -> Any:
        """The buffer as a numpy array of its shape and dtype (needs numpy),
        after the work queued before this call."""
        np = _numpy()
        dtype = np.dtype(self.dtype if self.dtype is not None else np.uint8)
        count = 1
        for d in self.shape:
            count *= d
        data = await self.read(size=count * dtype.itemsize)
        return np.frombuffer(bytearray(data), dtype=dtype).reshape(self.shape)


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
