"""Host memory regions (issue 18) from Python: Session.host_array and
map_host_memory share memfds with a daemon on this host (gpuexecd
--shm_socket), and Buffer.write and read_into of arrays inside them are
copies the daemon makes itself, on the session's command stream.

The tests run a daemon of their own with a host memory socket and a metrics
endpoint: its Write and Read byte counters tell a copy through a region
from one through the gRPC streams. The daemon of conftest.py has no host
memory socket.
"""

import ctypes
import gc
import mmap
import os
import socket
import time
import urllib.request

import grpc
import numpy as np
import pytest

import gpuexec
from conftest import DAEMON_MEMORY_LIMIT, start_daemon, stop_daemon
from gpuexec import _wire
from gpuexec.v1 import gpuexec_pb2 as pb

PAGE = 4096
# A session's regions may pin this much in all (see
# test_the_daemons_refusals_come_back_as_errors).
SESSION_PINNED_LIMIT = 1 << 20


def _free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ShmDaemon:
    def __init__(self, unix, tcp, shm_socket, metrics_port, kernels):
        self.unix = unix
        self.tcp = tcp
        self.shm_socket = shm_socket
        self.metrics_port = metrics_port
        self.cubin = os.path.join(kernels, "gx_kernels.cubin")

    def metric(self, name):
        """The metric's value summed over its labels."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        deadline = time.monotonic() + 10
        while True:
            try:
                with urllib.request.urlopen(url, timeout=5) as r:
                    text = r.read().decode()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        total = 0
        for line in text.splitlines():
            if line.startswith(name) and line[len(name):len(name) + 1] in (" ", "{"):
                total += int(float(line.rsplit(" ", 1)[1]))
        return total

    def counters(self):
        return (self.metric("gpuexec_write_bytes_total"),
                self.metric("gpuexec_read_bytes_total"))


@pytest.fixture(scope="module")
def shm_daemon(daemon, tmp_path_factory):
    """gpuexecd with a host memory socket, on a Unix socket and loopback TCP."""
    d = tmp_path_factory.mktemp("shm")
    unix, shm = d / "d.sock", d / "shm.sock"
    port = _free_port()
    process, addresses = start_daemon(
        daemon.binary,
        [f"--driver={daemon.driver}", "--listen=127.0.0.1:0", f"--unix_socket={unix}",
         f"--shm_socket={shm}", f"--metrics_listen=127.0.0.1:{port}", "--metrics_cache_ms=0",
         f"--daemon_memory_limit={DAEMON_MEMORY_LIMIT}",
         f"--max_session_pinned_bytes={SESSION_PINNED_LIMIT}"], d / "gpuexecd.log")
    tcp = [a for a in addresses if not a.startswith("unix:")]
    assert len(tcp) == 1, addresses
    yield ShmDaemon(f"unix:{unix}", tcp[0], str(shm), port, daemon.kernels)
    stop_daemon(process)


@pytest.fixture
def shm_client(shm_daemon):
    with gpuexec.connect(shm_daemon.unix) as c:
        yield c


@pytest.fixture
def shm_session(shm_client):
    with shm_client.session() as s:
        yield s


def _mapped(address):
    """Whether ``address`` lies in a mapping of this process."""
    with open("/proc/self/maps") as f:
        for line in f:
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            if lo <= address < hi:
                return True
    return False


def _raw_region_copy(client, token, region, buffer, direction):
    """One region copy on an Execute stream of its own (what the package
    would not send): its CommandResult."""
    command = pb.Command(id=1, reply=True, region_copy=pb.RegionCopyRequest(
        region=region, region_offset=0, buffer=buffer.handle, buffer_offset=0, size=PAGE,
        direction=direction))
    responses = client.stub.Execute(iter([pb.ExecuteRequest(session=token,
                                                            commands=[command])]), timeout=20)
    try:
        for response in responses:
            for result in response.results:
                if result.id == 1:
                    return result
    finally:
        responses.cancel()
    raise AssertionError("no answer to the raw region copy")


def test_region_commands_are_written_as_protobuf_writes_them():
    copy = _wire.command_field(7, True, _wire.region_copy_op(3, 4096, 9, 16, 1 << 40,
                                                             pb.RegionCopyRequest.TO_REGION))
    expected = pb.ExecuteRequest(commands=[pb.Command(
        id=7, reply=True, region_copy=pb.RegionCopyRequest(
            region=3, region_offset=4096, buffer=9, buffer_offset=16, size=1 << 40,
            direction=pb.RegionCopyRequest.TO_REGION))]).SerializeToString()
    assert copy == expected
    release = _wire.command_field(8, False, _wire.release_region_op(1 << 63))
    assert release == pb.ExecuteRequest(commands=[pb.Command(
        id=8, release_region=pb.ReleaseRegionRequest(region=1 << 63))]).SerializeToString()


def test_host_array_is_zero_filled_in_a_region_of_its_own(shm_session, shm_daemon):
    assert shm_session.shm_socket == shm_daemon.shm_socket  # named on the Unix socket
    a = shm_session.host_array((3, 5))
    assert type(a) is np.ndarray and a.dtype == np.float32 and a.shape == (3, 5)
    assert not a.any()
    memory = gpuexec.HostMemory.of(a)
    assert isinstance(memory, gpuexec.HostMemory)
    assert memory.size == PAGE and memory.region != 0 and memory.session is shm_session
    assert a.ctypes.data == memory.address and memory.address % PAGE == 0
    assert gpuexec.HostMemory.of(a[1:, ::2]) is memory
    assert gpuexec.HostMemory.of(np.zeros(3)) is None
    a[:] = 1.5  # writable
    b = shm_session.host_array(PAGE + 1, np.uint8)
    other = gpuexec.HostMemory.of(b)
    assert other.size == 2 * PAGE and other.region != memory.region
    assert memory.view.nbytes == PAGE and gpuexec.HostMemory.of(memory.view) is memory
    assert memory.array(dtype=np.uint64).shape == (PAGE // 8,)
    assert memory.array(4, np.float32, offset=8)[0] == 1.5
    with pytest.raises(gpuexec.Error) as e:
        memory.array(PAGE, np.uint16)
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT and "does not fit" in e.value.message


def test_sizes_out_of_range_are_refused_before_any_call(shm_session):
    for call in (lambda: shm_session.host_array(0), lambda: shm_session.host_array((4, 0)),
                 lambda: shm_session.map_host_memory(0),
                 lambda: shm_session.map_host_memory((1 << 48) + 1)):
        with pytest.raises(gpuexec.Error) as e:
            call()
        assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert e.value.message.startswith("gpuexec client:") and "2^48" in e.value.message


def test_write_launch_and_read_through_regions_skip_grpc(shm_session, shm_daemon):
    n = 3000  # not a whole number of pages
    x = shm_session.host_array(n)
    y = shm_session.host_array(n)
    out = shm_session.host_array(n)
    x[:] = np.arange(n, dtype=np.float32)
    y[:] = 1000 - np.arange(n, dtype=np.float32)
    xb, yb = shm_session.empty(n), shm_session.empty(n)
    saxpy = shm_session.load_module(shm_daemon.cubin).function("gx_saxpy")

    written, read = shm_daemon.counters()
    assert xb.write(x) == x.nbytes
    assert yb.write(y) == y.nbytes
    saxpy.launch_async((n + 255) // 256, 256, gpuexec.f32(2.0), xb, yb, gpuexec.u64(n))
    # In stream order after the launch, with no synchronize between.
    assert yb.read_into(out) is out
    np.testing.assert_array_equal(out, 2 * x + y)
    # Parts of regions, at offsets on both sides (the array's offset in its
    # region is the region's offset).
    xb.write(y[25:225], offset=400)
    xb.read_into(out[500:700], offset=400)
    np.testing.assert_array_equal(out[500:700], y[25:225])
    xb.write(y.reshape(30, 100)[3:5], offset=4000)  # a contiguous 2-D part
    assert shm_daemon.counters() == (written, read), "a region copy went through gRPC"

    # The ordinary path reads what the region copies wrote.
    np.testing.assert_array_equal(xb.read(np.float32, offset=400, size=800), y[25:225])
    assert shm_daemon.counters() == (written, read + 800)


def test_data_not_wholly_inside_a_region_takes_the_ordinary_path(shm_session, shm_daemon):
    memory = shm_session.map_host_memory(2 * PAGE)
    buf = shm_session.alloc(2 * PAGE)
    # Not contiguous: copied through gRPC, whole all the same.
    words = memory.array(dtype=np.uint32)
    words[:] = np.arange(words.size, dtype=np.uint32)
    written, read = shm_daemon.counters()
    buf.write(words[::2])
    assert shm_daemon.counters() == (written + PAGE, read)
    np.testing.assert_array_equal(buf.read(np.uint32, size=PAGE), words[::2])

    # A span from an anonymous page next to the region into it.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long)
    libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
    map_fixed_noreplace = 0x100000
    page, regions = None, [memory]
    while page is None and len(regions) <= 8:  # a region with a free page beside it
        memory = regions[-1]
        for want in (memory.address - PAGE, memory.address + memory.size):
            got = libc.mmap(want, PAGE, mmap.PROT_READ | mmap.PROT_WRITE,
                            mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | map_fixed_noreplace, -1, 0)
            if got == want:
                page = want
                break
            if got not in (None, ctypes.c_void_p(-1).value):
                libc.munmap(got, PAGE)
        else:
            regions.append(shm_session.map_host_memory(2 * PAGE))
    if page is None:
        pytest.skip("no free page next to a region to span from")
    try:
        start = page if page < memory.address else memory.address + PAGE
        span = np.frombuffer((ctypes.c_ubyte * (2 * PAGE)).from_address(start), np.uint8)
        span[:] = np.random.default_rng(7).integers(0, 256, 2 * PAGE, dtype=np.uint8)
        expected = span.copy()
        written, read = shm_daemon.counters()
        buf.write(span)
        span[:] = 0
        buf.read_into(span)
        np.testing.assert_array_equal(span, expected)
        assert shm_daemon.counters() == (written + 2 * PAGE, read + 2 * PAGE)
        del span
    finally:
        libc.munmap(page, PAGE)


def test_another_sessions_array_is_ordinary_memory(shm_client, shm_session, shm_daemon):
    with shm_client.session() as other:
        theirs = other.host_array(PAGE // 4, np.uint32)
        theirs[:] = np.arange(theirs.size, dtype=np.uint32) * 3
        expected = theirs.copy()
        mine = shm_session.alloc(PAGE)
        written, read = shm_daemon.counters()
        mine.write(theirs)
        theirs[:] = 0
        mine.read_into(theirs)
        np.testing.assert_array_equal(theirs, expected)
        assert shm_daemon.counters() == (written + PAGE, read + PAGE)
        # Their own buffer takes the fast path.
        with other.alloc(PAGE) as own:
            own.write(theirs)
            assert shm_daemon.counters() == (written + PAGE, read + PAGE)


def test_a_released_region_is_gone(shm_client, shm_session, shm_daemon):
    buf = shm_session.alloc(PAGE)
    a = shm_session.host_array(PAGE, np.uint8)
    memory = gpuexec.HostMemory.of(a)
    region = memory.region
    memory.release()
    assert memory.released and memory.region == region
    assert "released" in repr(memory)
    with pytest.raises(gpuexec.Error) as e:
        memory.release()
    assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert f"region 0x{region:x}" in e.value.message
    with pytest.raises(gpuexec.Error) as e:
        memory.array()
    assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
    # The array is still good memory, but ordinary now: its copies go
    # through gRPC.
    a[:] = 5
    written, read = shm_daemon.counters()
    buf.write(a)
    assert shm_daemon.counters() == (written + PAGE, read)
    assert buf.read() == bytes([5]) * PAGE
    # The release was queued without waiting: a wait on the session's
    # stream makes sure the daemon took it before another stream asks.
    shm_session.synchronize()
    result = _raw_region_copy(shm_client, shm_session.token, region, buf,
                              pb.RegionCopyRequest.TO_BUFFER)
    assert result.code == grpc.StatusCode.NOT_FOUND.value[0], result.message
    assert f"{region:x}" in result.message
    assert _mapped(memory.address)  # the array holds it
    del a
    assert not _mapped(memory.address)  # released, and no array left: unmapped at once

    # An array dropped without a release: its region goes with the
    # session's next call that waits for the daemon.
    b = shm_session.host_array(PAGE, np.uint8)
    memory = gpuexec.HostMemory.of(b)
    region, address = memory.region, memory.address
    del b, memory
    gc.collect()
    shm_session.synchronize()
    assert not _mapped(address)
    result = _raw_region_copy(shm_client, shm_session.token, region, buf,
                              pb.RegionCopyRequest.TO_REGION)
    assert result.code == grpc.StatusCode.NOT_FOUND.value[0], result.message

    # The end of a with block releases it; its array keeps the memory.
    with shm_session.map_host_memory(PAGE) as memory:
        c = memory.array(PAGE, np.uint8)
        c[:] = 9
    assert memory.released and _mapped(memory.address)
    assert bytes(c) == bytes([9]) * PAGE
    address = memory.address
    del c
    assert not _mapped(address)  # released, and no array left: unmapped at once
    # No array over it: a release unmaps at once.
    memory = shm_session.map_host_memory(PAGE)
    memory.release()
    assert not _mapped(memory.address)


def test_the_daemons_refusals_come_back_as_errors(shm_session):
    memory = shm_session.map_host_memory(2 * PAGE)
    buf = shm_session.alloc(PAGE)
    with pytest.raises(gpuexec.Error) as e:
        buf.write(memory.view)  # more than the buffer holds
    assert e.value.code == grpc.StatusCode.OUT_OF_RANGE
    with pytest.raises(gpuexec.Error) as e:
        buf.read_into(memory.view[:PAGE], offset=8)
    assert e.value.code == grpc.StatusCode.OUT_OF_RANGE
    # The session goes on.
    assert buf.write(memory.view[:PAGE]) == PAGE
    shm_session.synchronize()
    # Above the daemon's limit of a session's pinned memory.
    with pytest.raises(gpuexec.Error) as e:
        shm_session.map_host_memory(2 * SESSION_PINNED_LIMIT)
    assert e.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED, e.value
    assert len(e.value.message) < 1024


def test_closing_the_session_leaves_the_memory_to_its_arrays(shm_client, shm_daemon):
    s = shm_client.session()
    a = s.host_array(16, np.int32)
    a[:] = 7
    memory = gpuexec.HostMemory.of(a)
    s.close()
    assert memory.released
    a += 1  # still the client's memory
    assert list(a) == [8] * 16
    memory.release()  # only the unmapping is left: at the array's end
    assert _mapped(memory.address)
    with pytest.raises(gpuexec.Error) as e:
        memory.release()
    assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
    address = memory.address
    del a
    assert not _mapped(address)
    # Unreleased, it goes with its arrays and itself.
    b = memory = None
    s2 = shm_client.session()
    b = s2.host_array(16, np.int32)
    address = gpuexec.HostMemory.of(b).address
    s2.close()
    del b
    gc.collect()
    assert not _mapped(address)


def test_a_tcp_client_on_the_host_passes_the_socket_itself(shm_daemon):
    with gpuexec.connect(shm_daemon.tcp) as c, c.session() as s:
        assert s.shm_socket == ""  # told only to callers on the Unix socket
        with pytest.raises(gpuexec.Error) as e:
            s.host_array(4)
        assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
    with gpuexec.connect(shm_daemon.tcp, shm_socket=shm_daemon.shm_socket) as c, \
            c.session() as s:
        assert s.shm_socket == shm_daemon.shm_socket
        a = s.host_array(1024, np.float32)
        a[:] = 2.5
        written, read = shm_daemon.counters()
        buf = s.upload(np.zeros(1024, np.float32))
        written += a.nbytes  # the upload's
        buf.write(a)
        a[:] = 0
        buf.read_into(a)
        assert (a == 2.5).all()
        assert shm_daemon.counters() == (written, read)


def test_without_a_host_memory_socket_host_array_says_so(daemon, session, tmp_path):
    # conftest's daemon serves none.
    assert session.shm_socket == ""
    with pytest.raises(gpuexec.Error) as e:
        session.host_array(1024)
    assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert "serves no host memory socket" in e.value.message
    assert "connect(shm_socket=" in e.value.message
    # A path given that no one serves is UNAVAILABLE, naming it.
    nowhere = str(tmp_path / "none.sock")
    with gpuexec.connect(daemon.target, shm_socket=nowhere) as c, c.session() as s:
        with pytest.raises(gpuexec.Error) as e:
            s.host_array(1024)
        assert e.value.code == grpc.StatusCode.UNAVAILABLE
        assert nowhere in e.value.message
        # Buffers go on as ever.
        buf = s.upload(b"abc")
        assert buf.read() == b"abc"
