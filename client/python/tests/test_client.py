"""The Python client against a real gpuexecd (see conftest.py)."""

import array
import hashlib
import os
import struct
import subprocess
import sys
import time
import uuid

import grpc
import numpy as np
import pytest

import gpuexec
from conftest import DAEMON_MEMORY_LIMIT

MiB = 1 << 20


def test_devices(client):
    devices = client.devices()
    assert devices
    d = devices[0]
    assert d.index == 0
    assert d.name
    assert d.healthy
    assert d.memory_total_bytes > 0
    assert 0 < d.memory_free_bytes <= d.memory_total_bytes
    assert len(d.compute_capability) == 2 and d.compute_capability[0] > 0
    # Without tenants every session shares the device's one worker.
    assert d.workers == 1 and not d.own_worker


def test_session_context_manager_closes(client):
    sessions_before = client.devices()[0].sessions
    with client.session(device=0, lease=30) as s:
        assert len(s.token) == 32
        assert s.device == 0
        assert s.lease == pytest.approx(30)
        buf = s.alloc(64)
        assert client.devices()[0].sessions == sessions_before + 1
    assert s.closed
    assert client.devices()[0].sessions == sessions_before
    for call in (lambda: s.alloc(64), buf.read, s.synchronize, s.keep_alive):
        with pytest.raises(gpuexec.Error) as e:
            call()
        assert e.value.code in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION)
        assert s.token[:8] in e.value.message or "session" in e.value.message
    s.close()  # idempotent


def test_connect_failure_is_unavailable(tmp_path):
    with pytest.raises(gpuexec.Error) as e:
        gpuexec.connect(f"unix:{tmp_path}/none.sock", timeout=0.5)
    assert e.value.code == grpc.StatusCode.UNAVAILABLE


def test_bytes_round_trip_crosses_chunks(session):
    data = os.urandom(3 * MiB + 12345)  # chunks are 1 MiB
    buf = session.upload(data)
    assert buf.nbytes == len(data)
    assert buf.read() == data
    assert buf.read(offset=MiB - 7, size=2 * MiB) == data[MiB - 7:3 * MiB - 7]
    patch = os.urandom(MiB + 3)
    buf.write(patch, offset=5)
    assert buf.read() == data[:5] + patch + data[5 + len(patch):]
    assert buf.read(size=0) == b""


def test_read_into_fills_what_it_is_given(session):
    data = os.urandom(2 * MiB + 99)  # chunks are 1 MiB
    buf = session.upload(data)
    out = bytearray(len(data) - 10)
    assert buf.read_into(out, offset=10) is out
    assert out == data[10:]
    words = np.zeros(256, dtype=np.uint32)
    buf.read_into(words, offset=4)
    assert words.tobytes() == data[4:4 + 1024]
    assert buf.read_into(bytearray()) == bytearray()
    assert buf.write(b"", offset=3) == 0
    with pytest.raises(gpuexec.Error) as e:
        buf.read_into(bytearray(len(data)), offset=1)
    assert e.value.code == grpc.StatusCode.OUT_OF_RANGE
    assert "past the end" in e.value.message
    # All of out's bytes, whatever its shape or item type.
    matrix = np.zeros((2, 4), dtype=np.float32)
    buf.read_into(matrix)
    assert matrix.tobytes() == data[:32]
    doubles = array.array("d", [0.0, 0.0])
    buf.read_into(doubles, offset=8)
    assert doubles.tobytes() == data[8:24]
    for unfit in (b"immutable", np.zeros((4, 4), dtype=np.uint8)[:, 1], 7,
                  np.zeros(4, dtype=object)):
        with pytest.raises(gpuexec.Error) as e:
            buf.read_into(unfit)
        assert e.value.message.startswith("gpuexec client:")
    # A range past the end is the daemon's to refuse, with nothing allocated
    # for it first.
    with pytest.raises(gpuexec.Error) as e:
        buf.read(size=1 << 40)
    assert e.value.code == grpc.StatusCode.OUT_OF_RANGE


def test_read_responses_are_parsed_whole():
    parse = gpuexec._bytes._parse_read_response
    offset, data = parse(b"\x08\x05\x12\x03abc\x19" + bytes(8))  # and an unknown 64-bit field
    assert offset == 5 and bytes(data) == b"abc"
    for truncated in (b"\x08\x05\x19\x01", b"\x12\x05ab", b"\x08\x80"):
        with pytest.raises(ValueError):
            parse(truncated)


def test_numpy_round_trip(session):
    rng = np.random.default_rng(1)
    a = rng.standard_normal((1024, 1500), dtype=np.float32)  # 6 MiB
    buf = session.upload(a)
    assert buf.nbytes == a.nbytes and buf.size == a.size
    back = buf.read_array()
    assert back.dtype == np.float32 and back.shape == a.shape
    np.testing.assert_array_equal(back, a)
    np.testing.assert_array_equal(buf.read(np.float32), a.reshape(-1))
    np.testing.assert_array_equal(buf.read_array(np.float32, (10, 1500), offset=a[0].nbytes),
                                  a[1:11])
    # Non-contiguous input is copied contiguous.
    buf.write(a.T[:5].copy(order="F"))
    np.testing.assert_array_equal(buf.read(np.float32, size=5 * 1024 * 4),
                                  a.T[:5].reshape(-1))
    back[0, 0] = 1.0  # read arrays are writable


def test_memset_and_copy(session):
    with session.alloc(3 * MiB) as a, session.alloc(3 * MiB) as b:
        a.memset(0xAB)
        assert a.read() == b"\xab" * (3 * MiB)
        a.memset(0x01, offset=10, size=5)
        b.memset(0)
        b.copy_from(a, 100, src_offset=5, dst_offset=MiB)
        got = b.read(offset=MiB - 1, size=102)
        assert got == b"\0" + b"\xab" * 5 + b"\x01" * 5 + b"\xab" * 90 + b"\0"
        a.copy_to(b)
        assert b.read() == a.read()
        with pytest.raises(gpuexec.Error) as e:
            a.memset(1, offset=3 * MiB - 1, size=2)
        assert e.value.code == grpc.StatusCode.OUT_OF_RANGE


def test_buffer_with_frees(session):
    with session.alloc(1024) as buf:
        buf.memset(7)
    with pytest.raises(gpuexec.Error) as e:
        buf.read()
    assert e.value.code == grpc.StatusCode.NOT_FOUND


def test_module_load_is_cached(client, daemon):
    with open(daemon.cubin, "rb") as f:
        image = f.read()
    if daemon.is_test_double:
        # An image no other test loads; the double ignores unknown names.
        image += f"unused-{uuid.uuid4().hex}\n".encode()
    digest = hashlib.sha256(image).hexdigest()
    with client.session() as s1, client.session(device=s1.device) as s2:
        m1 = s1.load_module(image, kind="cubin")
        assert m1.sha256 == digest
        assert m1.kind == "cubin"
        if daemon.is_test_double:
            assert m1.uploaded
        loads = client.devices()[s1.device].module_loads_total
        m2 = s2.load_module(image, kind="cubin")
        assert m2.sha256 == digest
        assert not m2.uploaded  # the header alone was enough
        assert client.devices()[s1.device].module_loads_total == loads
        m3 = s1.load_module(daemon.cubin)  # from a path: kind from the name
        assert m3.kind == "cubin"
        assert m2.function("gx_saxpy").params == m3.function("gx_saxpy").params


def test_module_kind_needed_for_unknown_bytes(session):
    with pytest.raises(gpuexec.Error) as e:
        session.load_module(b"not an image")
    assert "kind" in e.value.message
    with pytest.raises(gpuexec.Error) as e:
        session.load_module(b"not an image", kind="cubin")
    assert e.value.code in (grpc.StatusCode.INVALID_ARGUMENT,
                            grpc.StatusCode.FAILED_PRECONDITION)


def test_function_layout(kernels):
    saxpy = kernels.function("gx_saxpy")
    assert saxpy.params == [(0, 4), (8, 8), (16, 8), (24, 8)]
    assert saxpy.attributes.max_threads_per_block > 0
    with pytest.raises(gpuexec.Error) as e:
        kernels.function("no_such_kernel")
    assert e.value.code == grpc.StatusCode.NOT_FOUND


@pytest.mark.parametrize("a", [np.float32(2.5), gpuexec.f32(2.5), 2.5])
def test_saxpy_matches_numpy(session, kernels, a):
    n = (1 << 20) + 3
    rng = np.random.default_rng(2)
    x = rng.standard_normal(n, dtype=np.float32)
    y = rng.standard_normal(n, dtype=np.float32)
    xb, yb = session.upload(x), session.upload(y)
    saxpy = kernels.function("gx_saxpy")
    assert saxpy.launch((n + 255) // 256, 256, a, xb, yb, gpuexec.u64(n)) is None
    out = yb.read_array()  # ordered after the launch on the session's stream
    # The kernel computes fma(a, x, y); a*x+y in float64 is that before rounding.
    expected = (2.5 * x.astype(np.float64) + y.astype(np.float64)).astype(np.float32)
    np.testing.assert_allclose(out, expected, rtol=1e-6, atol=0)
    gpu_time = session.synchronize()
    assert gpu_time >= 0.0
    gpu_time = saxpy.launch(64, 256, a, xb, yb, n, sync=True)
    assert gpu_time > 0.0
    assert session.synchronize() == 0.0  # nothing since


def test_fill_u32(session, kernels):
    n = 300000
    fill = kernels.function("gx_fill_u32")
    with session.alloc(4 * n) as buf:
        buf.memset(0)
        fill.launch(128, 256, buf, 0xDEADBEEF, n)  # ints typed by parameter size
        np.testing.assert_array_equal(buf.read(np.uint32), np.full(n, 0xDEADBEEF, np.uint32))
        # A pointer into the buffer, and numpy scalars.
        fill.launch(1, 32, buf.ptr(8), np.uint32(7), np.uint64(2))
        assert buf.read(size=16) == struct.pack("<IIII", 0xDEADBEEF, 0xDEADBEEF, 7, 7)


def test_launches_travel_on_the_command_stream(session, kernels):
    # Launches and synchronizes share one open Execute stream: many queued
    # without a round trip, and what a later read sees is their effect.
    n = 4096
    fill = kernels.function("gx_fill_u32")
    with session.alloc(4 * n) as buf:
        for v in range(1, 201):
            fill.launch_async(n // 256, 256, buf, v, n)
        np.testing.assert_array_equal(buf.read(np.uint32), np.full(n, 200, np.uint32))
        fill.launch_async(n // 256, 256, buf, 7, n)
        assert session.synchronize() > 0.0
        assert buf.read(size=8) == struct.pack("<II", 7, 7)
        assert fill.launch(n // 256, 256, buf, 9, n, sync=True) > 0.0
        assert buf.read(size=4) == struct.pack("<I", 9)


def test_an_async_launchs_failure_is_raised_by_the_next_waiting_call(session, kernels):
    fill = kernels.function("gx_fill_u32")
    buf = session.alloc(1024)
    buf.free()
    # Found by the daemon, not here: the launch returns at once...
    fill.launch_async(1, 32, buf, 1, 32)
    # ...and the session's next waiting call raises it, naming the buffer.
    with pytest.raises(gpuexec.Error) as e:
        session.synchronize()
    assert e.value.code == grpc.StatusCode.NOT_FOUND, e.value
    assert "parameter 0" in e.value.message and "gx_fill_u32" in e.value.message
    # Raised once: the stream goes on.
    assert session.synchronize() == 0.0
    with session.alloc(128) as ok:
        fill.launch_async(1, 32, ok, 5, 32)
        assert ok.read(size=4) == struct.pack("<I", 5)
    # Caught here, before anything is sent: an argument of the wrong kind.
    with pytest.raises(gpuexec.Error) as e:
        fill.launch_async(1, 32, np.zeros(4), 1, 32)
    assert e.value.message.startswith("gpuexec client:")


def test_a_launch_on_a_closed_session_is_not_found(client, daemon):
    s = client.session()
    fill = s.load_module(daemon.cubin).function("gx_fill_u32")
    buf = s.alloc(64)
    fill.launch(1, 16, buf, 3, 16)
    s.close()
    with pytest.raises(gpuexec.Error) as e:
        fill.launch(1, 16, buf, 3, 16)
    assert e.value.code == grpc.StatusCode.NOT_FOUND, e.value


def test_argument_errors_name_the_parameter(session, kernels):
    saxpy = kernels.function("gx_saxpy")
    x = session.alloc(64)
    cases = [
        ((gpuexec.f64(2.0), x, x, gpuexec.u64(16)), "parameter 0"),  # 8 bytes for 4
        ((gpuexec.f32(2.0), x, gpuexec.u32(1), gpuexec.u64(16)), "parameter 2"),
        ((gpuexec.f32(2.0), x, x.ptr(x.nbytes + 64), gpuexec.u64(16)), "parameter 2"),
        ((gpuexec.f32(2.0), x, x), "takes 4 parameters"),
        ((gpuexec.f32(2.0), x, x, gpuexec.u64(16), None), "takes 4 parameters"),
    ]
    for args, needle in cases:
        with pytest.raises(gpuexec.Error) as e:
            saxpy.launch(1, 32, *args)
        assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT, e.value
        assert needle in e.value.message, e.value.message
        assert "gx_saxpy" in e.value.message
    # Caught here, before a call: these name the argument.
    for args, needle in [((2.0, np.zeros(4), x, 16), "argument 1"),
                         ((2.0, x, x, 16, 5), "argument 4"),
                         ((2.0, x, x, 1 << 64), "argument 3"),
                         ((2.0, x, x, "16"), "argument 3")]:
        with pytest.raises(gpuexec.Error) as e:
            saxpy.launch(1, 32, *args)
        assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert needle in e.value.message and e.value.message.startswith("gpuexec client:")
    with pytest.raises(gpuexec.Error):
        gpuexec.u8(256)
    with pytest.raises(gpuexec.Error):
        gpuexec.i32(1.5)
    with pytest.raises(gpuexec.Error) as e:
        saxpy.launch(0, 32, 2.0, x, x, 16)
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT


def _bf16_bits(v):
    bits = int(np.float32(v).view(np.uint32))
    return (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16


def test_every_scalar_type(session, kernels):
    types = kernels.function("gx_types")
    with session.alloc(8 * 8) as out:
        types.launch(1, 1, np.int8(-5), np.int16(-300), gpuexec.u32(0xFEDCBA98),
                     gpuexec.i64(-(1 << 40)), np.float16(1.5), gpuexec.bf16(-2.75),
                     np.float32(3.25), np.float64(-1e300), out)
        got = out.read(np.uint64).tolist()
    assert got == [
        0xFB, 0xFED4, 0xFEDCBA98, (1 << 64) - (1 << 40),
        int(np.float16(1.5).view(np.uint16)), _bf16_bits(-2.75),
        int(np.float32(3.25).view(np.uint32)), int(np.float64(-1e300).view(np.uint64)),
    ]


def test_half_scalars_round_once(session, kernels):
    # A Python float is rounded once, by the daemon, from its double:
    # through float32 first, 1 + 2^-11 + 2^-40 would become 1.0. numpy's
    # float16 passes its own bits.
    types = kernels.function("gx_types")
    with session.alloc(8 * 8) as out:
        types.launch(1, 1, np.int8(0), np.int16(0), gpuexec.u32(0), gpuexec.i64(0),
                     gpuexec.f16(1 + 2**-11 + 2**-40), gpuexec.bf16(1 + 2**-8 + 2**-40),
                     np.float32(0), np.float64(0), out)
        got = out.read(np.uint64).tolist()
    assert got[4] == 0x3C01
    assert got[5] == 0x3F81
    with session.alloc(8 * 8) as out:
        types.launch(1, 1, np.int8(0), np.int16(0), gpuexec.u32(0), gpuexec.i64(0),
                     np.float16(-0.0), gpuexec.bf16(np.float32(-2.75)), np.float32(0),
                     np.float64(0), out)
        got = out.read(np.uint64).tolist()
    assert got[4] == 0x8000
    assert got[5] == _bf16_bits(-2.75)


def test_struct_argument_as_bytes(session, kernels):
    with session.alloc(16) as out:
        packed = struct.pack("<IIfI", 1, 2, 3.5, 4)
        kernels.function("gx_struct").launch(1, 1, packed, out, sync=True)
        assert out.read() == packed


def test_dynamic_shared_memory_above_48k(session, kernels):
    n = 16384  # 64 KiB of shared memory
    blocks = 3
    with session.alloc(4 * blocks) as out:
        kernels.function("gx_bigshared").launch(blocks, 256, out, gpuexec.u32(n),
                                                shared=4 * n, sync=True)
        expected = [sum(k ^ b for k in range(n)) & 0xFFFFFFFF for b in range(blocks)]
        assert out.read(np.uint32).tolist() == expected


def test_cluster_launch(session, kernels):
    with session.alloc(4 * 8) as out:
        kernels.function("gx_cluster_rank").launch(8, 32, out, cluster=2, sync=True)
        assert out.read(np.uint32).tolist() == [0, 1] * 4


def test_memory_freed_when_session_closes(client):
    big = DAEMON_MEMORY_LIMIT * 3 // 4
    s1 = client.session()
    with client.session() as s2:
        s1.alloc(big)
        with pytest.raises(gpuexec.Error) as e:
            s2.alloc(big)
        assert e.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "daemon memory limit" in e.value.message
        s1.close()
        with s2.alloc(big) as buf:
            assert buf.nbytes == big
        with s2.alloc(big):  # and Buffer's with freed it again
            pass


def test_session_memory_limit(client):
    with client.session(memory_limit=MiB) as s:
        assert s.memory_limit == MiB
        s.alloc(MiB // 2)
        with pytest.raises(gpuexec.Error) as e:
            s.alloc(MiB)
        assert e.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "session memory limit" in e.value.message


def test_without_numpy(daemon):
    # A fresh interpreter where numpy cannot be imported: bytes in and out.
    script = f"""
import sys
import time
sys.modules["numpy"] = None
import gpuexec
with gpuexec.connect({daemon.target!r}) as c, c.session() as s:
    b = s.upload(b"abc" * 1000000)
    assert b.read() == b"abc" * 1000000
    try:
        b.read(dtype="float32")
    except gpuexec.Error as e:
        assert "numpy" in e.message, e
    else:
        raise SystemExit("read(dtype) without numpy did not fail")
print("ok")
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_connect_takes_the_target_from_the_environment(daemon, monkeypatch):
    monkeypatch.setenv("GPUEXEC_TARGET", daemon.target)
    with gpuexec.connect() as c:
        assert c.devices()[0].index == 0
    monkeypatch.setenv("GPUEXEC_TARGET", "unix:/nonexistent/gpuexecd.sock")
    with pytest.raises(gpuexec.Error) as e:
        gpuexec.connect(timeout=0.2)
    assert e.value.code == grpc.StatusCode.UNAVAILABLE
    assert "/nonexistent/gpuexecd.sock" in e.value.message


def test_hung_kernel_past_the_session_time_limit_is_aborted(client, daemon):
    """The device's worker is ended and restarted; the hung kernel's session
    is closed, saying why, and a new session is served."""
    s = client.session(device=0, kernel_time_limit=0.5)
    assert s.kernel_time_limit == pytest.approx(0.5)
    spin = s.load_module(daemon.cubin).function("gx_spin")
    resets = client.devices()[0].resets
    with pytest.raises(gpuexec.Error) as e:
        spin.launch(1, 1, 1 << 50)  # eleven days: forever, for this test
        s.synchronize()
    assert e.value.code == grpc.StatusCode.ABORTED
    assert "gx_spin" in e.value.message and "time limit of 500 ms" in e.value.message
    with pytest.raises(gpuexec.Error) as closed:
        s.keep_alive()
    assert closed.value.code == grpc.StatusCode.NOT_FOUND
    assert "its kernel 'gx_spin' ran past its kernel time limit of 500 ms and reset device 0" \
        in closed.value.message
    deadline = time.monotonic() + 5
    while True:
        try:
            with client.session(device=0) as fresh:
                fill = fresh.load_module(daemon.cubin).function("gx_fill_u32")
                with fresh.alloc(64) as buf:
                    fill.launch(1, 16, buf, 3, 16)
                    assert buf.read(np.uint32).tolist() == [3] * 16
            break
        except gpuexec.Error as err:
            if err.code != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                raise
            time.sleep(0.01)
    d = client.devices()[0]
    assert d.resets == resets + 1
    assert "gx_spin" in d.last_reset
