"""Host memory regions (proto/gpuexec/v1/gpuexec.proto, "Host memory
regions"): memory a client on the daemon's host shares with it, so that
Buffer.write and read_into of data lying there are copies the daemon makes
itself, on the session's command stream, without the bytes going through
gRPC.

- A region is a memfd, sealed against shrinking and growing (never against
  writes: the daemon copies into it), mapped shared here and registered on
  the daemon's host memory socket (gpuexecd --shm_socket): one connection,
  one RegisterRegionRequest with the descriptor (SCM_RIGHTS), one
  RegisterRegionResponse. The descriptor is closed once registered: the
  mapping keeps the memory, and the daemon holds a descriptor of its own.
- The memory is mapped with libc's mmap (through ctypes), not Python's mmap
  module, which keeps a duplicate of the descriptor open for the mapping's
  life; numpy arrays and memoryviews over it hold a ctypes array as their
  base, which holds the HostMemory.
- Each session keeps its live regions by address range (HostRegions);
  Buffer.write and read_into look the data's address up there.
- An address range leaves the lookup before it is unmapped, so that memory
  the kernel hands out again at those addresses never finds a stale region.
  A HostMemory that dies unreleased (its last array gone) is released by
  the session's next copy, map_host_memory or close: a garbage collector's
  finalizer may run while this thread holds a lock of the session (the
  command stream's, the lookup's), so it only queues the work, taking no
  lock. The memory stays mapped until then, and so cannot be reused.
"""

from __future__ import annotations

import bisect
import collections
import ctypes
import errno
import fcntl
import mmap
import os
import socket
import threading
import weakref
from typing import TYPE_CHECKING, Any, Deque, Dict, List, Optional, Sequence, Tuple, Union

import grpc

from ._bytes import _numpy
from ._errors import Error, client_error
from .v1 import gpuexec_pb2 as pb

if TYPE_CHECKING:
    from ._session import Session

# The protocol's granule: a region's size is a multiple of it.
REGION_GRANULE = 4096
# The largest region asked for (before rounding), as the C++ client's.
MAX_REGION_BYTES = 1 << 48
# The longest message either way on the host memory socket.
MAX_REGION_MESSAGE_BYTES = 4096
# How much of the daemon's message on the host memory socket an error repeats.
MAX_ECHOED_CHARS = 512

_CODES = {code.value[0]: code for code in grpc.StatusCode}

_libc: Optional[ctypes.CDLL] = None
_libc_lock = threading.Lock()


def _c() -> ctypes.CDLL:
    """libc's mmap and munmap, typed."""
    global _libc
    with _libc_lock:
        if _libc is None:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.mmap.restype = ctypes.c_void_p
            libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                                  ctypes.c_int, ctypes.c_long)
            libc.munmap.restype = ctypes.c_int
            libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
            _libc = libc
        return _libc


_MAP_FAILED = ctypes.c_void_p(-1).value


def _code_of_errno(error: Optional[int]) -> grpc.StatusCode:
    if error in (errno.ENOMEM, errno.EMFILE, errno.ENFILE, errno.ENOSPC, errno.EFBIG):
        return grpc.StatusCode.RESOURCE_EXHAUSTED
    if error in (errno.EACCES, errno.EPERM):
        return grpc.StatusCode.PERMISSION_DENIED
    if error == errno.EINVAL:
        return grpc.StatusCode.INVALID_ARGUMENT
    if error == errno.EAGAIN:
        return grpc.StatusCode.UNAVAILABLE
    return grpc.StatusCode.INTERNAL


def _os_error(e: OSError, what: str) -> Error:
    return client_error(f"{what}: {os.strerror(e.errno) if e.errno else e}",
                        _code_of_errno(e.errno))


def _clip(text: str) -> str:
    if len(text) <= MAX_ECHOED_CHARS:
        return text
    return text[:MAX_ECHOED_CHARS] + f"... ({len(text)} characters)"


def round_up(nbytes: int) -> int:
    return (nbytes + REGION_GRANULE - 1) // REGION_GRANULE * REGION_GRANULE


def make_region_fd(size: int) -> int:
    """A memfd of ``size`` bytes (a multiple of the granule), sealed as the
    daemon requires; the caller closes it."""
    what = f"a host memory region of {size} bytes"
    try:
        fd = os.memfd_create("gpuexec-region", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    except OSError as e:
        raise _os_error(e, f"memfd_create for {what}") from None
    try:
        try:
            os.ftruncate(fd, size)
        except OSError as e:
            raise _os_error(e, f"ftruncate of the memfd of {what}") from None
        try:
            # Not F_SEAL_WRITE: the daemon copies device memory into it.
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
        except OSError as e:
            raise _os_error(e, f"sealing the memfd of {what}") from None
    except BaseException:
        os.close(fd)
        raise
    return fd


def map_region_fd(fd: int, size: int) -> int:
    """The address of ``fd`` (``size`` bytes) mapped shared and writable."""
    address = _c().mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED, fd, 0)
    if address is None or address == _MAP_FAILED:
        error = ctypes.get_errno()
        raise client_error(f"mmap of the memfd of a host memory region of {size} bytes: "
                           f"{os.strerror(error)}", _code_of_errno(error))
    return address


def unmap(address: int, size: int) -> None:
    _c().munmap(address, size)


def register_region(path: str, token: str, fd: int, size: int,
                    timeout: Optional[float]) -> int:
    """Registers ``fd`` (``size`` bytes) for the session ``token`` on the
    daemon's host memory socket at ``path``; returns the region's handle.
    Each step is bounded by ``timeout`` seconds (None: none). A registration
    that times out may still be made by the daemon: the region then lives,
    unknown here, until the session ends."""
    request = pb.RegisterRegionRequest(session=token, bytes=size)
    # A connection per registration: registrations are rare (each pins
    # memory), and a connection kept for later would have to notice a
    # daemon that restarted.
    response, _ = register_on_socket(path, request, fd, timeout, keep=False)
    if response.region == 0 or response.bytes != size:
        raise client_error(f"the daemon registered region {response.region} of "
                           f"{response.bytes} bytes for a memfd of {size} bytes (on {path})",
                           grpc.StatusCode.DATA_LOSS)
    return response.region


def register_on_socket(path: str, request: Any, fd: int, timeout: Optional[float],
                       keep: bool) -> Tuple[Any, Optional[socket.socket]]:
    """Sends ``request`` (a RegisterRegionRequest) with ``fd`` on a new
    connection to the host memory socket at ``path``; returns the daemon's
    answer (its refusal raised as an Error) and, with ``keep``, the
    connection (a command ring's lifeline), else None."""
    message = request.SerializeToString()
    if len(message) > MAX_REGION_MESSAGE_BYTES:
        raise client_error(f"a region's registration is {len(message)} bytes; the host memory "
                           f"socket takes at most {MAX_REGION_MESSAGE_BYTES}")
    where = f"the daemon's host memory socket {path}"

    def failed(e: OSError, what: str) -> Error:
        if isinstance(e, socket.timeout):
            return Error(grpc.StatusCode.DEADLINE_EXCEEDED,
                         f"gpuexec client: {what} {where}: no progress within {timeout} s")
        return Error(grpc.StatusCode.UNAVAILABLE,
                     f"gpuexec client: {what} {where}: "
                     f"{os.strerror(e.errno) if e.errno else e}")

    try:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    except OSError as e:
        raise _os_error(e, "socket(AF_UNIX, SOCK_SEQPACKET) for the host memory socket") \
            from None
    try:
        # Bounds connect, send, and the wait for the answer (which includes
        # the daemon's pinning of the region).
        sock.settimeout(timeout)
        try:
            sock.connect(path)
        except OSError as e:
            if e.errno == errno.EINVAL or "too long" in str(e):
                raise client_error(f"the host memory socket path {path} is not a Unix socket's "
                                   f"path ({e})") from None
            raise failed(e, "cannot connect to") from None
        try:
            socket.send_fds(sock, [message], [fd])
        except OSError as e:
            raise failed(e, "cannot send a region to") from None
        try:
            data, _, flags, _ = sock.recvmsg(MAX_REGION_MESSAGE_BYTES)
        except OSError as e:
            raise failed(e, "no answer to a region's registration from") from None
        if not data:
            raise Error(grpc.StatusCode.UNAVAILABLE,
                        f"gpuexec client: {where} closed the connection without answering a "
                        "region's registration")
        if flags & socket.MSG_TRUNC:
            raise client_error(f"the answer to a region's registration on {path} is longer "
                               f"than the protocol's {MAX_REGION_MESSAGE_BYTES} bytes",
                               grpc.StatusCode.DATA_LOSS)
        try:
            response = pb.RegisterRegionResponse.FromString(data)
        except Exception:  # pylint: disable=broad-except
            raise client_error(f"the answer to a region's registration on {path} ({len(data)} "
                               "bytes) is not a RegisterRegionResponse",
                               grpc.StatusCode.DATA_LOSS) from None
        if response.code != 0:
            raise Error(_CODES.get(response.code, grpc.StatusCode.UNKNOWN),
                        _clip(response.message))
    except BaseException:
        sock.close()
        raise
    if not keep:
        sock.close()
        return response, None
    return response, sock


class Mapping:
    """A region's mapping: what is left to do when its HostMemory goes."""

    __slots__ = ("address", "size", "region", "_unmap_once", "_release_once", "__weakref__")

    def __init__(self, address: int, size: int, region: int) -> None:
        self.address = address
        self.size = size
        self.region = region
        # Each popped once (list.pop is atomic): no lock, which a finalizer
        # could not take safely.
        self._unmap_once = [True]
        self._release_once = [True]

    def take_release(self) -> bool:
        """True the first time: the caller releases the region."""
        try:
            return self._release_once.pop()
        except IndexError:
            return False

    @property
    def released(self) -> bool:
        return not self._release_once

    @property
    def unmapped(self) -> bool:
        return not self._unmap_once

    def unmap(self) -> None:
        try:
            self._unmap_once.pop()
        except IndexError:
            return
        unmap(self.address, self.size)


def _gone(regions: HostRegions, mapping: Mapping) -> None:
    """A HostMemory's finalizer (it may run inside any call of this thread)."""
    if mapping.released:
        mapping.unmap()  # out of the lookup already
    else:
        regions.dead.append(mapping)


class HostRegions:
    """A session's live regions by address range. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._starts: List[int] = []  # sorted
        self._by_start: Dict[int, Mapping] = {}  # start -> Mapping; the ranges never overlap
        # Mappings whose HostMemory went unreleased (see the module's doc).
        self.dead: Deque[Mapping] = collections.deque()

    def __bool__(self) -> bool:
        return bool(self._by_start) or bool(self.dead)

    def add(self, mapping: Mapping) -> None:
        with self._lock:
            bisect.insort(self._starts, mapping.address)
            self._by_start[mapping.address] = mapping

    def remove(self, mapping: Mapping) -> None:
        with self._lock:
            if self._by_start.get(mapping.address) is mapping:
                del self._by_start[mapping.address]
                self._starts.pop(bisect.bisect_left(self._starts, mapping.address))

    def take_all(self) -> List[Mapping]:
        """Empties the lookup; returns what it held."""
        with self._lock:
            mappings = list(self._by_start.values())
            self._by_start.clear()
            self._starts.clear()
        return mappings

    def find(self, address: int, size: int) -> Optional[Tuple[int, int]]:
        """(region, offset) of the region holding all of [address, address +
        size), or None (size 0 never is)."""
        if size <= 0 or not self._by_start:
            return None
        with self._lock:
            i = bisect.bisect_right(self._starts, address) - 1
            if i < 0:
                return None
            mapping = self._by_start[self._starts[i]]
        offset = address - mapping.address
        if offset >= mapping.size or size > mapping.size - offset:
            return None
        return mapping.region, offset


def address_of(obj: Any, view: memoryview) -> Optional[int]:
    """The address of the bytes of ``obj`` (a numpy array, or else what
    ``view``, its flat byte memoryview, shows), or None when it cannot be
    told cheaply: a non-contiguous numpy array (``view`` is then a copy), a
    read-only buffer that is not a numpy array."""
    if type(obj).__module__ == "numpy" and hasattr(obj, "__array_interface__"):
        if not obj.flags.c_contiguous:
            return None
        return obj.__array_interface__["data"][0]
    if view.readonly or len(view) == 0:
        return None
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(view))
    except (TypeError, ValueError, BufferError):
        return None


class HostMemory:
    """Host memory shared with the daemon: a region of a session (see
    ``Session.map_host_memory`` and ``Session.host_array``).

    ``Buffer.write`` of data, and ``Buffer.read_into`` of an array, lying
    wholly inside it (and the buffer of the same session) are copies the
    daemon makes between it and the device, no bytes going through gRPC.

    ``size`` (the bytes mapped, a multiple of 4 KiB), ``region`` (the
    daemon's handle), ``address`` and ``session``. ``view`` is a writable
    memoryview of all of it; ``array(shape, dtype, offset)`` a numpy array
    over it. Both keep this object alive.

    ``release()`` (or the end of a ``with`` block) releases the region:
    queued on the session's command stream without waiting, after the
    copies and launches queued before it (the daemon keeps its own mapping
    until they are done). The memory is unmapped at once if no array or
    view over it is left, else when the last goes (until then it is
    ordinary memory: copies from it go through gRPC). A HostMemory that is
    never released is released once it and every array and view over it
    are gone, by the session's next copy (a buffer's write or read_into),
    ``map_host_memory`` / ``host_array`` or ``close``; closing the session
    releases all its regions on the daemon, and the memory stays the
    client's until its arrays go.
    """

    def __init__(self, session: Session, mapping: Mapping) -> None:
        self.session = session
        self._mapping = mapping
        self._release_called = False
        self.size = mapping.size
        self.region = mapping.region
        self.address = mapping.address
        # ctypes arrays over the memory, the bases of the arrays and views
        # handed out, by weak reference: while one lives, the memory stays
        # mapped. (ctypes arrays are not hashable: no WeakSet.)
        self._exporters: Dict[int, Any] = {}
        finalizer = weakref.finalize(self, _gone, session._regions, mapping)
        finalizer.atexit = False

    def __repr__(self) -> str:
        state = ", released" if self._mapping.released else ""
        return f"<gpuexec.HostMemory region 0x{self.region:x}, {self.size} bytes{state}>"

    def __len__(self) -> int:
        return self.size

    def __enter__(self) -> HostMemory:
        return self

    def __exit__(self, exc_type: Optional[type], *exc: object) -> None:
        if self._release_called:
            return
        try:
            self.release()
        except Error:
            if exc_type is None:
                raise

    @property
    def released(self) -> bool:
        """True once release() ran, or the session was closed."""
        return self._mapping.released

    def _check(self, what: str) -> None:
        if self._mapping.released:
            raise client_error(f"{what} of {self!r}: it was released before (or its session "
                               "closed)", grpc.StatusCode.FAILED_PRECONDITION)

    def _exporter(self, offset: int, size: int) -> Any:
        exporter: Any = (ctypes.c_ubyte * size).from_address(self.address + offset)
        exporter._gpuexec_host_memory = self  # keeps this alive while arrays are
        exporters, mapping = self._exporters, self._mapping

        def gone(ref: Any) -> None:
            # May run inside any call of this thread: takes no lock.
            exporters.pop(id(ref), None)
            if not exporters and mapping.released:
                mapping.unmap()  # out of the lookup already

        ref = weakref.ref(exporter, gone)
        exporters[id(ref)] = ref
        return exporter

    @property
    def view(self) -> memoryview:
        """A writable memoryview of unsigned bytes over all the memory."""
        self._check("a view")
        return memoryview(self._exporter(0, self.size)).cast("B")

    def array(self, shape: Union[int, Sequence[int], None] = None, dtype: Any = "uint8", *,
              offset: int = 0) -> Any:
        """A numpy array of ``dtype`` and ``shape`` over the memory from
        ``offset``; shape None: as many items as fit. Needs numpy."""
        np = _numpy()
        self._check("an array")
        dtype = np.dtype(dtype)
        if dtype.hasobject or dtype.itemsize == 0:
            raise client_error(f"an array of {dtype} cannot lie in {self!r}")
        offset = int(offset)
        if not 0 <= offset <= self.size:
            raise client_error(f"offset {offset} is outside {self!r}")
        if shape is None:
            shape = ((self.size - offset) // dtype.itemsize,)
        shape = (shape,) if isinstance(shape, int) else tuple(int(d) for d in shape)
        count = 1
        for d in shape:
            if d < 0:
                raise client_error(f"shape {shape} has a negative dimension")
            count *= d
        nbytes = count * dtype.itemsize
        if nbytes > self.size - offset:
            raise client_error(f"an array of {nbytes} bytes ({shape}, {dtype}) at offset "
                               f"{offset} does not fit in {self!r}")
        if nbytes == 0:
            return np.zeros(shape, dtype)
        return np.frombuffer(self._exporter(offset, nbytes), dtype=dtype).reshape(shape)

    @staticmethod
    def of(obj: Any) -> Optional[HostMemory]:
        """The HostMemory that a numpy array or memoryview made by it (or a
        view of one) lies in, or None."""
        seen = 0
        while obj is not None and seen < 64:
            owner = getattr(obj, "_gpuexec_host_memory", None)
            if isinstance(owner, HostMemory):
                return owner
            if isinstance(obj, memoryview):
                obj = obj.obj
            elif type(obj).__module__ == "numpy" and hasattr(obj, "base"):
                obj = obj.base
            else:
                return None
            seen += 1
        return None

    def release(self) -> None:
        """Releases the region now (queued, see the class's doc) and unmaps
        the memory unless arrays or views over it are left. Raises the
        queueing's failure (a command stream that cannot be opened: the
        daemon then releases the region when the session ends);
        FAILED_PRECONDITION if release() ran before. After the session's
        close only the unmapping is left to do."""
        mapping = self._mapping
        called_before, self._release_called = self._release_called, True
        if not mapping.take_release():
            if called_before:
                raise client_error(f"{self!r} was released before; no call was made",
                                   grpc.StatusCode.FAILED_PRECONDITION)
            # Released with its session: only the unmapping is left.
            if not self._exporters:
                mapping.unmap()
            return
        session = self.session
        # Out of the lookup first: a copy from here must not name it now.
        session._regions.remove(mapping)
        failure: Optional[Error] = None
        if not session.closed:
            try:
                session._release_region(mapping.region)
            except Error as e:
                failure = e
        if not self._exporters:
            mapping.unmap()
        # Else the finalizer unmaps once the arrays and this object are gone.
        if failure is not None:
            raise failure


def drain(session: Session, regions: HostRegions) -> None:
    """Releases the regions whose HostMemory went unreleased, then unmaps
    them (outside any lock of the session's)."""
    while True:
        try:
            mapping = regions.dead.popleft()
        except IndexError:
            return
        if mapping.take_release():
            regions.remove(mapping)
            if not session.closed:
                try:
                    session._release_region(mapping.region)
                except Error:
                    pass  # the daemon releases it when the session ends
        mapping.unmap()


def map_host_memory(session: Session, nbytes: int) -> HostMemory:
    """Session.map_host_memory: a new region of ``session``."""
    nbytes = int(nbytes)
    if not 0 < nbytes <= MAX_REGION_BYTES:
        raise client_error(f"host memory of {nbytes} bytes asked for; a region holds 1 to "
                           "2^48 bytes; no call was made")
    if not session.shm_socket:
        raise client_error("the daemon serves no host memory socket to this client (gpuexecd "
                           "--shm_socket; it names it only to callers on its Unix socket, "
                           "others pass connect(shm_socket=PATH)); no call was made",
                           grpc.StatusCode.FAILED_PRECONDITION)
    drain(session, session._regions)
    size = round_up(nbytes)
    fd = make_region_fd(size)
    try:
        # Mapped before it is registered: a mapping that fails then leaves no
        # region behind on the daemon.
        address = map_region_fd(fd, size)
        try:
            region = register_region(session.shm_socket, session.token, fd, size,
                                     session.client.control_timeout)
        except BaseException:
            unmap(address, size)
            raise
    finally:
        # The mapping keeps the memory; the daemon holds a descriptor of its
        # own.
        os.close(fd)
    mapping = Mapping(address, size, region)
    memory = HostMemory(session, mapping)
    session._regions.add(mapping)
    return memory
