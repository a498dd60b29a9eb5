"""Buffer: device memory of a session, and its copies to and from the host.

A Buffer lives until ``free()``, the end of its ``with`` block, or its
session's close. Copies are ordered after the launches queued before them
on the session's stream.
"""

import grpc

from . import _wire
from ._args import Arg
from ._bytes import (_byte_view, _numpy, _parse_read_response, _writable_byte_view,
                     varint as _varint)
from ._errors import Error, client_error, from_rpc_error
from .v1 import gpuexec_pb2 as pb


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

