"""Buffer: device memory of a session as an array (shape, dtype, strides),
its views, and its copies to and from the host.

A Buffer lives until ``free()``, the end of its ``with`` block, or its
session's close. Copies are ordered after the launches queued before them
on the session's stream. A view (``buf[i:j]``, ``buf.view(...)``,
``buf.reshape(...)``) is a Buffer too, over part of its owner's allocation,
made without a call or a copy.
"""

from __future__ import annotations

import threading
from typing import Any, Optional, Sequence, Tuple, Union

import grpc

from . import _ring, _ring_records, _wire
from ._args import Arg
from ._bytes import (_byte_view, _numpy, _parse_read_response, _writable_byte_view,
                     varint as _varint)
from ._dtype import (ArrayFacts, DType, contiguous_strides as _contiguous_strides, count_of,
                     dtype as _as_dtype, extent as _extent, is_contiguous as _is_contiguous,
                     numpy_dtype, shape_of, uint8)
from ._errors import Error, client_error, from_rpc_error, short_token
from .v1 import gpuexec_pb2 as pb

ShapeLike = Union[int, Sequence[int]]

# data_ptr(): each allocation gets a number of its own, shifted left by
# this many bits (a device holds far less than 2**40 bytes), plus offsets.
_POINTER_SHIFT = 40
_MAX_POINTER_INDEX = (1 << (64 - _POINTER_SHIFT)) - 1


class _PointerBases:
    """The data_ptr() bases of one session's allocations (see data_ptr)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.by_handle: dict = {}
        self.used: set = set()
        self.next = 1

    def base(self, handle: int) -> int:
        with self.lock:
            index = self.by_handle.get(handle)
            if index is None:
                index = self.next
                while index in self.used or index > _MAX_POINTER_INDEX:  # after 2**24
                    index = index + 1 if index <= _MAX_POINTER_INDEX else 1
                self.next = index + 1
                self.by_handle[handle] = index
                self.used.add(index)
            return index << _POINTER_SHIFT

    def forget(self, handle: int) -> None:
        with self.lock:
            self.used.discard(self.by_handle.pop(handle, None))


_NO_SESSION_BASES = _PointerBases()  # buffers made without a Session (tests)


def _pointer_bases(session: Any) -> _PointerBases:
    own = getattr(session, "_pointer_bases", None)
    return own if isinstance(own, _PointerBases) else _NO_SESSION_BASES


def _index(value: Any, what: str) -> int:
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise client_error(f"{what} must be an int, got a {type(value).__name__[:40]}")
    return int(value.__index__())


class Buffer(ArrayFacts):
    """Device memory of a session, as an array: ``shape``, ``dtype`` (a
    gpuexec.DType) and ``strides`` (bytes), numpy's and CuPy's meaning.
    ``with`` frees it at the end of the block.

    ``Buffer(session, handle, nbytes, dtype=None, shape=None)`` wraps an
    allocation the daemon made (Session.alloc, empty, upload ... make them):
    dtype None is uint8; shape None is as many elements as fit.

    Views share the owner's allocation without a copy: ``buf[i]`` and
    ``buf[i:j]`` (first dimension, step 1), ``buf.view(offset, shape,
    dtype)`` and ``buf.reshape(shape)``. A view keeps its owner alive;
    ``base`` is the owner (None for an owner); ``offset`` is its first byte
    in the allocation. Reads, writes, copies, ``ptr()`` and a launch
    argument all start at the view's first byte; their offsets are relative
    to it and may not pass its end.

    Data crosses the network only when asked: ``get()`` downloads into a
    numpy array, ``set(a)`` uploads one. ``numpy.asarray(buf)`` raises
    TypeError (an implicit download would hide a network copy). There is no
    ``__cuda_array_interface__`` and no ``__dlpack__``: both hand over a
    device pointer that the caller's process may dereference, and a
    Buffer's memory is on the daemon's host, reached only through the
    daemon (its ``data_ptr()`` is a number, not an address).

    A Buffer is always true (test ``len()`` or ``size`` for emptiness) and is
    not iterated element by element.
    """

    session: Any
    handle: int
    offset: int
    dtype: DType
    shape: Tuple[int, ...]
    strides: Tuple[int, ...]

    def __init__(self, session: Any, handle: int, size: int, dtype: Any = None,
                 shape: Optional[ShapeLike] = None) -> None:
        d = uint8 if dtype is None else _as_dtype(dtype)
        capacity = _index(size, "a buffer's size")
        if shape is None:
            dims: Tuple[int, ...] = (capacity // d.itemsize,)
        else:
            dims = shape_of(shape)
            if count_of(dims) * d.itemsize > capacity:
                raise client_error(f"shape {dims} of {d} needs {count_of(dims) * d.itemsize} "
                                   f"bytes; the buffer has {capacity}")
        self.session = session
        self.handle = handle
        self._capacity = capacity
        self._owner: Optional[Buffer] = None
        self._freed = False
        self._set_layout(0, d, dims, _contiguous_strides(dims, d.itemsize))

    def _set_layout(self, offset: int, d: DType, shape: Tuple[int, ...],
                    strides: Tuple[int, ...]) -> None:
        self.offset = offset
        self.dtype = d
        self.shape = shape
        self.strides = strides
        self._contiguous = _is_contiguous(shape, strides, d.itemsize)
        self._span = _extent(shape, strides, d.itemsize)

    # ------------------------------------------------------------ array facts

    def element_size(self) -> int:
        """Bytes of an element (torch's name)."""
        return self.dtype.itemsize

    def numel(self) -> int:
        """Elements (torch's name)."""
        return count_of(self.shape)

    def stride(self, dim: Optional[int] = None) -> Union[int, Tuple[int, ...]]:
        """Strides in elements (torch's meaning; ``strides`` is bytes): all of
        them, or that of dimension ``dim`` (negative counts from the end)."""
        elements = tuple(s // self.dtype.itemsize for s in self.strides)
        if dim is None:
            return elements
        i = _index(dim, "dim")
        if not -len(elements) <= i < len(elements):
            raise client_error(f"stride(dim={i}) of a buffer of {len(elements)} dimensions")
        return elements[i]

    @property
    def base(self) -> Optional[Buffer]:
        """The owning Buffer of a view; None for an owner."""
        return self._owner

    def is_contiguous(self) -> bool:
        """True when its elements are packed in row-major (C) order."""
        return self._contiguous

    @property
    def _root(self) -> Buffer:
        return self._owner if self._owner is not None else self

    def __repr__(self) -> str:
        token = getattr(self.session, "token", None)
        where = f", session {short_token(token)}" if isinstance(token, str) else ""
        dims = ", ".join(map(str, self.shape))
        layout = "" if self._contiguous else f", strides {self.strides}"
        if self._owner is None:
            return f"<gpuexec.Buffer 0x{self.handle:x} {self.dtype}[{dims}]{where}>"
        return (f"<gpuexec.Buffer {self.dtype}[{dims}]{layout} at byte {self.offset}, view of "
                f"0x{self.handle:x}{where}>")

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError(f"len() of a 0-d buffer {self!r}")
        return self.shape[0]

    def __bool__(self) -> bool:
        return True

    def __iter__(self) -> Any:
        raise TypeError(f"{self!r} is not iterated element by element (each would be a view "
                        "of device memory): call .get() for its values, or index it")

    def __array__(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(f"gpuexec.Buffer {self!r}: an implicit copy from the device is not "
                        "made; call .get() to download it (a network copy)")

    def __enter__(self) -> Buffer:
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        if self._owner is not None or self._freed or self.session.closed:
            return
        try:
            self.free()
        except Error:
            if exc_type is None:
                raise

    # ------------------------------------------------------------------ views

    def _live(self, what: str) -> None:
        """Raises when this is a view of a buffer freed here."""
        if self._owner is not None and self._owner._freed:
            raise client_error(f"{what} {self!r}: its owner {self._owner!r} was freed; make "
                               "the view from a live buffer", grpc.StatusCode.NOT_FOUND)

    def _make_view(self, offset: int, d: DType, shape: Tuple[int, ...],
                   strides: Tuple[int, ...], what: str) -> Buffer:
        root = self._root
        if root._freed:
            raise client_error(f"{what} of {self!r}: {root!r} was freed; a view needs a live "
                               "buffer", grpc.StatusCode.NOT_FOUND)
        end = offset + _extent(shape, strides, d.itemsize)
        if offset < 0 or end > root._capacity:
            raise client_error(f"{what} of {self!r}: bytes [{offset}, {end}) of the "
                               f"allocation; it holds [0, {root._capacity}): choose an "
                               "offset and shape inside it",
                               grpc.StatusCode.OUT_OF_RANGE)
        if offset % d.itemsize:
            raise client_error(f"{what} of {self!r}: {d} elements at byte {offset} of the "
                               f"allocation are not aligned to their {d.itemsize} bytes")
        view = Buffer.__new__(Buffer)
        view.session = self.session
        view.handle = self.handle
        view._capacity = root._capacity
        view._owner = root
        view._freed = False
        view._set_layout(offset, d, shape, strides)
        return view

    def view(self, offset: int = 0, shape: Optional[ShapeLike] = None, dtype: Any = None, *,
             strides: Optional[Sequence[int]] = None) -> Buffer:
        """A view from ``offset`` bytes after this one's first byte, of
        ``shape`` and ``dtype`` (default: this one's dtype, and as many
        elements as fit before this one's end). ``strides``: bytes, numpy's
        meaning (default: contiguous). It may reach past this view but not
        outside the allocation, and its elements are aligned to their size;
        either is refused (before any call) naming the ranges."""
        d = self.dtype if dtype is None else _as_dtype(dtype)
        at = _index(offset, "view offset")
        if at < 0:
            raise client_error(f"view of {self!r} at byte offset {at}: offsets are >= 0")
        if shape is None:
            if at > self._span:
                raise client_error(f"view of {self!r} at byte offset {at}: past its end "
                                   f"({self._span} bytes)", grpc.StatusCode.OUT_OF_RANGE)
            dims: Tuple[int, ...] = ((self._span - at) // d.itemsize,)
        else:
            dims = shape_of(shape)
        if strides is None:
            steps = _contiguous_strides(dims, d.itemsize)
        else:
            steps = tuple(_index(s, "stride") for s in strides)
            if len(steps) != len(dims) or any(s < 0 or s % d.itemsize for s in steps):
                raise client_error(f"view of {self!r}: strides {steps[:33]} for shape "
                                   f"{dims}: one non-negative multiple of {d.itemsize} "
                                   "bytes per dimension")
        return self._make_view(self.offset + at, d, dims, steps, "view")

    def __getitem__(self, key: Any) -> Buffer:
        if isinstance(key, tuple) and len(key) == 1:
            key = key[0]
        if not self.shape:
            raise client_error(f"{self!r} has no dimension to index")
        n, step = self.shape[0], self.strides[0]
        if isinstance(key, slice):
            start, stop, stride = key.indices(n)
            if stride != 1:
                raise client_error(f"{self!r}[{key.start}:{key.stop}:{key.step}]: only slices "
                                   "of step 1 are views; use view(strides=...)")
            count = max(stop - start, 0)
            return self._make_view(self.offset + start * step, self.dtype,
                                   (count,) + self.shape[1:], self.strides, "slice")
        if isinstance(key, bool) or not hasattr(key, "__index__"):
            raise client_error(f"{self!r}[...]: index its first dimension with an int or a "
                               f"slice of step 1, not a {type(key).__name__[:40]}; use view() "
                               "for others")
        i = key.__index__()
        if not -n <= i < n:
            raise client_error(f"{self!r}[{i}]: index out of range for length {n}",
                               grpc.StatusCode.OUT_OF_RANGE)
        i %= n
        return self._make_view(self.offset + i * step, self.dtype, self.shape[1:],
                               self.strides[1:], "index")

    def reshape(self, *shape: Any) -> Buffer:
        """A view of another shape with the same elements (contiguous
        buffers only); one dimension may be -1 (what is left)."""
        if len(shape) == 1 and not hasattr(shape[0], "__index__"):
            shape = tuple(shape[0])
        if len(shape) > 64:
            raise client_error(f"reshape of {self!r}: {len(shape)} dimensions; at most 64")
        dims = [_index(d, "reshape's dimension") for d in shape]
        if not self._contiguous:
            raise client_error(f"reshape of {self!r}: not contiguous; reshape its owner or a "
                               "contiguous view")
        if dims.count(-1) > 1 or any(d < -1 for d in dims):
            raise client_error(f"reshape of {self!r} to {tuple(dims)}: dimensions are >= 0, "
                               "with at most one -1")
        if -1 in dims:
            known = count_of(tuple(d for d in dims if d != -1))
            if known == 0 or self.size % known:
                raise client_error(f"reshape of {self!r} to {tuple(dims)}: {self.size} elements "
                                   "do not fill it")
            dims[dims.index(-1)] = self.size // known
        new = tuple(dims)
        if count_of(new) != self.size:
            raise client_error(f"reshape of {self!r} to {new}: {count_of(new)} elements, it "
                               f"has {self.size}")
        return self._make_view(self.offset, self.dtype, new,
                               _contiguous_strides(new, self.dtype.itemsize), "reshape")

    # -------------------------------------------------------------- pointers

    def ptr(self, offset: int = 0) -> Arg:
        """A kernel argument: the device address of this buffer's first byte
        plus ``offset`` bytes (the daemon checks it lies in the allocation)."""
        at = self.offset + _index(offset, "ptr offset")
        if at < 0:
            raise client_error(f"ptr({offset}) of {self!r}: before the allocation's start")
        return Arg("buffer", self.handle, at)

    def _as_kernel_arg(self) -> Arg:
        return self.ptr(0)

    @property
    def _launch_field(self) -> bytes:
        """This buffer as a LaunchRequest's argument field, made once."""
        field = self.__dict__.get("_field")
        if field is None:
            field = self.__dict__["_field"] = _wire.launch_arg_field(self.ptr(0))
        return field

    @property
    def _ring_slot(self) -> bytes:
        """This buffer as a command ring record's argument slot, made once."""
        slot = self.__dict__.get("_slot")
        if slot is None:
            slot = self.__dict__["_slot"] = _ring_records.buffer_slot(self.handle, self.offset)
        return slot

    def data_ptr(self) -> int:
        """A number for this buffer's first byte, NOT a device address (the
        client never learns one): stable for the session's life, distinct
        for each allocation (its own multiple of 2**40), plus ``offset``.
        It keeps the alignment of the real address: allocations are aligned
        to 256 bytes, so data_ptr() % 16 is the view's offset % 16 (what
        Triton specializes on and checks)."""
        ptr = self.__dict__.get("_data_ptr")  # Triton asks at every launch
        if ptr is None:
            self._live("data_ptr of")
            ptr = self.__dict__["_data_ptr"] = (
                _pointer_bases(self.session).base(self.handle) + self.offset)
        return ptr

    def _free_quietly(self) -> None:
        """Frees a buffer made by a call that failed after; a failure to free
        is not raised over the call's."""
        try:
            self.free()
        except Error:
            pass

    def free(self) -> None:
        """Frees the allocation now (stream-ordered after enqueued work).
        A view is not freed alone: free its owner."""
        if self._owner is not None:
            raise client_error(f"free of {self!r}: a view is part of {self._owner!r}; free its "
                               "owner (the allocation is freed as a whole)")
        self._freed = True
        # Kept Triton launches naming buffers of the session are dropped.
        self.session._frees = getattr(self.session, "_frees", 0) + 1
        _pointer_bases(self.session).forget(self.handle)
        self.session._order()
        self.session._control(self.session.client.stub.Free,
                              pb.FreeRequest(session=self.session.token, buffer=self.handle))

    # ----------------------------------------------------------------- bytes

    def _range(self, what: str, offset: Any, size: Any) -> Tuple[int, int]:
        """(first byte in the allocation, bytes) of ``size`` bytes (None: to
        the end) at ``offset`` of this buffer; raises before any call for a
        range past its end or a non-contiguous view."""
        self._live(what)
        if not self._contiguous:
            raise client_error(f"{what} of {self!r}: its elements are not contiguous; copy "
                               "through a contiguous view (or its owner)")
        at = _index(offset, f"{what}'s offset")
        limit = self._span
        n = max(limit - at, 0) if size is None else _index(size, f"{what}'s size")
        if at < 0 or n < 0 or at + n > limit:
            raise client_error(f"{what} of {self!r}: bytes [{at}, {at + n}) are past the end "
                               f"of its {limit} bytes; ask for a range inside it",
                               grpc.StatusCode.OUT_OF_RANGE)
        return self.offset + at, n

    def _region_copy(self, hit: Any, start: int, size: int, direction: int) -> None:
        """A copy the daemon makes between a region and this buffer, on the
        session's command stream; returns once it has finished."""
        region, region_offset = hit
        try:
            self.session._commands.submit(
                _wire.region_copy_op(region, region_offset, self.handle, start, size,
                                     direction), wait=True,
                record=(_ring.REGION_COPY,
                        _ring_records.region_copy(region, region_offset, self.handle, start,
                                                  size, direction)))
        except Error as e:
            raise self.session._failed(e) from None

    def write(self, data: Any, offset: int = 0) -> int:
        """Copies bytes-like data or a numpy array (its bytes) to the buffer
        at ``offset``; returns the bytes written. Data lying wholly inside
        host memory of this buffer's session (Session.host_array) is copied
        by the daemon from there, without gRPC."""
        view = _byte_view(data)
        start, n = self._range("write", offset, len(view))
        hit = self.session._region_of(data, view)
        if hit is not None:
            self._region_copy(hit, start, n, pb.RegionCopyRequest.TO_BUFFER)
            return n
        chunk = self.session.client.chunk_bytes
        session, handle = self.session.token, self.handle
        self.session._order()

        def requests() -> Any:
            # WriteRequests as bytes: the first names the session, buffer and
            # offset; each carries a chunk as field 4, copied once, here.
            first = pb.WriteRequest(session=session, buffer=handle,
                                    offset=start).SerializeToString()
            if n == 0:
                yield first
                return
            for i in range(0, n, chunk):
                part = view[i:i + chunk]
                yield b"".join((first if i == 0 else b"", b"\x22", _varint(len(part)), part))

        response = self.session._data(self.session.client._write_call, requests())
        return int(response.bytes_written)

    def _read_into(self, view: memoryview, start: int) -> None:
        """Reads len(view) bytes from byte ``start`` of the allocation into
        ``view`` (unsigned bytes); more is a DATA_LOSS error."""
        size = len(view)
        if size == 0:  # on the wire, size 0 means "to the end"
            return
        self.session._order()
        request = pb.ReadRequest(session=self.session.token, buffer=self.handle,
                                 offset=start, size=size,
                                 chunk_size=self.session.client.chunk_bytes)
        got = 0
        try:
            for raw in self.session.client._read_call(request):
                try:
                    at, data = _parse_read_response(raw)
                except ValueError as e:
                    raise client_error(f"read of {self!r}: a message is not a ReadResponse "
                                       f"({e})", grpc.StatusCode.DATA_LOSS) from None
                if at != start + got:
                    raise client_error(f"read of {self!r}: chunk at offset {at}, "
                                       f"expected {start + got}", grpc.StatusCode.DATA_LOSS)
                if got + len(data) > size:
                    raise client_error(f"read of {self!r}: more than the {size} bytes asked for",
                                       grpc.StatusCode.DATA_LOSS)
                view[got:got + len(data)] = data
                got += len(data)
        except grpc.RpcError as e:
            raise self.session._failed(from_rpc_error(e, self.session.client.target)) from None
        if got != size:
            raise client_error(f"read of {self!r}: got {got} of {size} bytes",
                               grpc.StatusCode.DATA_LOSS)

    def read(self, dtype: Any = None, *, offset: int = 0, size: Optional[int] = None) -> Any:
        """Copies ``size`` bytes (None: to the end) from ``offset`` to the
        host: bytes, or a flat numpy array of ``dtype`` when given (any
        numpy dtype: complex and structured ones too)."""
        start, n = self._range("read", offset, size)
        if dtype is not None:
            np_dtype = numpy_dtype(dtype)  # numpy's absence is raised before the call
            if n % np_dtype.itemsize:
                raise client_error(f"read of {self!r}: {n} bytes are not a whole number of "
                                   f"{np_dtype.name} ({np_dtype.itemsize} bytes)")
        out = bytearray(n)
        self._read_into(memoryview(out), start)
        if dtype is None:
            return bytes(out)
        return _numpy().frombuffer(out, dtype=np_dtype)

    def read_into(self, out: Any, offset: int = 0) -> Any:
        """Fills ``out`` (a contiguous, writable bytes-like object or numpy
        array: all its bytes) with the buffer's bytes at ``offset``, without
        a copy of its own; returns ``out``. When ``out`` lies wholly inside
        host memory of this buffer's session (Session.host_array), the
        daemon copies into it, without gRPC."""
        view = _writable_byte_view(out)
        start, n = self._range("read", offset, len(view))
        if n:
            hit = self.session._region_of(out, view)
            if hit is not None:
                self._region_copy(hit, start, n, pb.RegionCopyRequest.TO_REGION)
            else:
                self._read_into(view, start)
        return out

    def read_array(self, dtype: Any = None, shape: Optional[ShapeLike] = None, *,
                   offset: int = 0) -> Any:
        """A numpy array of ``dtype`` and ``shape`` read from ``offset``
        (default: the buffer's own dtype, and its shape when the dtype is
        its own and offset 0; else a flat array to the end)."""
        own = dtype is None
        if not own:
            try:
                own = _as_dtype(dtype) is self.dtype
            except Error:  # a numpy dtype no buffer holds: read as such
                pass
        if own:
            if shape is None and offset == 0:
                return self.get()
            dtype = self.dtype
        if shape is None:
            return self.read(dtype, offset=offset)
        dims = shape_of(shape)
        size = count_of(dims) * numpy_dtype(dtype).itemsize
        return self.read(dtype, offset=offset, size=size).reshape(dims)

    def get(self) -> Any:
        """Downloads the buffer (a network copy): a new numpy array of its
        shape and dtype. A non-contiguous view is refused (get a contiguous
        one, or its owner)."""
        np_dtype = self.dtype.numpy
        start, n = self._range("get", 0, self.nbytes)
        out = _numpy().empty(self.shape, dtype=np_dtype)
        if n:
            view = _writable_byte_view(out)
            hit = self.session._region_of(out, view)
            if hit is not None:
                self._region_copy(hit, start, n, pb.RegionCopyRequest.TO_REGION)
            else:
                self._read_into(view, start)
        return out

    def set(self, array: Any) -> None:
        """Uploads ``array`` (a numpy array or what numpy.asarray takes) into
        the buffer: the same shape; its dtype converted to the buffer's
        where numpy.copyto would (casting "same_kind": float64 into float32
        yes, float into int no)."""
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
        self.write(a)

    def memset(self, value: int, offset: int = 0, size: Optional[int] = None) -> None:
        """Sets ``size`` bytes (None: to the end) from ``offset`` to the byte
        ``value``."""
        start, n = self._range("memset", offset, size)
        if n == 0:  # on the wire, 0 means "to the end"
            return
        request = pb.MemsetRequest(session=self.session.token, buffer=self.handle,
                                   offset=start, size=n, value=int(value))
        self.session._order()
        self.session._data(self.session.client.stub.Memset, request)
        recording = self.session._recording
        if recording is not None:
            recording.recorded()

    def copy_from(self, src: Buffer, size: Optional[int] = None, *, src_offset: int = 0,
                  dst_offset: int = 0) -> None:
        """Device-to-device copy from ``src`` (a buffer of the same session);
        ``size`` None copies what fits from ``src_offset`` to the end of src
        (and of this buffer)."""
        if not isinstance(src, Buffer):
            raise client_error(f"copy into {self!r}: the source must be a gpuexec.Buffer, got "
                               f"a {type(src).__name__[:40]}")
        if size is None:
            _, src_left = src._range("copy", src_offset, None)
            _, dst_left = self._range("copy", dst_offset, None)
            size = min(src_left, dst_left)
        src_start, n = src._range("copy", src_offset, size)
        dst_start, _ = self._range("copy", dst_offset, n)
        if n == 0:  # on the wire, size 0 means "to the end"
            return
        request = pb.CopyBufferRequest(session=self.session.token, dst=self.handle,
                                       dst_offset=dst_start, src=src.handle,
                                       src_offset=src_start, size=n)
        self.session._order()
        self.session._data(self.session.client.stub.CopyBuffer, request)
        recording = self.session._recording
        if recording is not None:
            recording.recorded()

    def copy_to(self, dst: Buffer, size: Optional[int] = None, *, src_offset: int = 0,
                dst_offset: int = 0) -> None:
        """Device-to-device copy into ``dst``; see copy_from."""
        dst.copy_from(self, size, src_offset=src_offset, dst_offset=dst_offset)
