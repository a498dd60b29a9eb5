"""Launches as CuPy and PyCUDA users write them: f(grid, block, args), and
numpy arrays copied around a launch with gpuexec.In/Out/InOut."""

import grpc
import numpy as np
import pytest

import gpuexec

MiB = 1 << 20


def saxpy_expected(a, x, y):
    # The kernel computes fma(a, x, y); a*x+y in float64 is that before rounding.
    return (np.float64(a) * x.astype(np.float64) + y.astype(np.float64)).astype(np.float32)


def data(n, seed=3):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(n, dtype=np.float32), rng.standard_normal(n, dtype=np.float32))


def test_call_queues_like_launch_async(session, kernels):
    saxpy = kernels.function("gx_saxpy")
    n = 1000
    x, y = data(n)
    xb, yb = session.upload(x), session.upload(y)
    assert saxpy(((n + 255) // 256,), (256,), (np.float32(2.0), xb, yb, np.uint64(n))) is None
    # A list is taken too; the read waits for both launches (same stream).
    assert saxpy((n + 255) // 256, 256, [2.0, xb, yb, n]) is None
    np.testing.assert_array_equal(yb.read_array(),
                                  saxpy_expected(2.0, x, saxpy_expected(2.0, x, y)))


def test_call_without_sync_does_not_wait_for_the_daemon(session, kernels):
    fill = kernels.function("gx_fill_u32")
    buf = session.alloc(1024)
    buf.free()
    # Found by the daemon, not here: the call returns at once...
    assert fill(1, 32, (buf, 1, 32)) is None
    # ...and the session's next waiting call raises it.
    with pytest.raises(gpuexec.Error) as e:
        session.synchronize()
    assert e.value.code == grpc.StatusCode.NOT_FOUND, e.value
    assert "parameter 0" in e.value.message and "gx_fill_u32" in e.value.message
    # With sync=True the call itself raises it.
    with pytest.raises(gpuexec.Error) as e:
        fill(1, 32, (buf, 1, 32), sync=True)
    assert e.value.code == grpc.StatusCode.NOT_FOUND, e.value
    assert session.synchronize() == 0.0


def test_call_with_sync_returns_gpu_time(session, kernels):
    saxpy = kernels.function("gx_saxpy")
    n = 256
    x, y = data(n)
    xb, yb = session.upload(x), session.upload(y)
    gpu_time = saxpy(1, 256, (0.5, xb, yb, n), sync=True)
    assert isinstance(gpu_time, float) and gpu_time > 0.0
    np.testing.assert_array_equal(yb.read_array(), saxpy_expected(0.5, x, y))


def test_an_untimed_session_reports_no_gpu_time(client, daemon):
    with client.session(gpu_time=False) as s:
        assert s.gpu_time is False
        saxpy = s.load_module(daemon.cubin).function("gx_saxpy")
        x, y = data(256)
        xb, yb = s.upload(x), s.upload(y)
        assert saxpy(1, 256, (0.5, xb, yb, 256), sync=True) == 0.0
        np.testing.assert_array_equal(yb.read_array(), saxpy_expected(0.5, x, y))
        saxpy(1, 256, (0.5, xb, yb, 256))
        assert s.synchronize() == 0.0


def test_call_takes_shared_mem_and_the_launch_attributes(session, kernels):
    saxpy = kernels.function("gx_saxpy")
    x, y = data(64)
    xb, yb = session.upload(x), session.upload(y)
    saxpy(1, 64, (1.0, xb, yb, 64), shared_mem=128, cooperative=True, sync=True)
    np.testing.assert_array_equal(yb.read_array(), saxpy_expected(1.0, x, y))
    with pytest.raises(gpuexec.Error) as e:
        saxpy(1, 64, (1.0, xb, yb, 64), cluster_policy="sideways")
    assert "cluster_policy" in e.value.message


def test_in_and_inout_round_trip(session, kernels):
    saxpy = kernels.function("gx_saxpy")
    n = (1 << 16) + 5
    x, y = data(n)
    y0 = y.copy()
    assert saxpy((n + 255) // 256, 256,
                 (np.float32(3.0), gpuexec.In(x), gpuexec.InOut(y), np.uint64(n))) is None
    np.testing.assert_array_equal(y, saxpy_expected(3.0, x, y0))
    # Function.launch and sync=True copy the same way.
    y1 = y.copy()
    assert saxpy.launch((n + 255) // 256, 256, 3.0, gpuexec.In(x), gpuexec.InOut(y), n) is None
    np.testing.assert_array_equal(y, saxpy_expected(3.0, x, y1))
    y2 = y.copy()
    gpu_time = saxpy((n + 255) // 256, 256, (3.0, gpuexec.In(x), gpuexec.InOut(y), n), sync=True)
    assert gpu_time > 0.0
    np.testing.assert_array_equal(y, saxpy_expected(3.0, x, y2))


def test_numba_configuration(session, kernels):
    saxpy = kernels.function("gx_saxpy")
    n = 1000
    x, y = data(n)
    y0 = y.copy()
    configured = saxpy[(n + 255) // 256, 256]
    assert repr(configured) == "<gpuexec.Function 'gx_saxpy'[4, 256]>"
    assert configured(np.float32(2.0), gpuexec.In(x), gpuexec.InOut(y), np.uint64(n)) is None
    np.testing.assert_array_equal(y, saxpy_expected(2.0, x, y0))
    yb = session.upload(y0)
    saxpy[(n + 255) // 256, 256, 0, 64](2.0, gpuexec.In(x), yb, n)
    np.testing.assert_array_equal(yb.read_array(), saxpy_expected(2.0, x, y0))
    for config, needle in [((1,), "a launch configuration is f[grid, block] or "
                                   "f[grid, block, stream, shared_mem], got f[(1,)]"),
                           (1, "a launch configuration is f[grid, block] or "
                               "f[grid, block, stream, shared_mem], got f[1]"),
                           ((1, 32, 7), "stream 7 in f[grid, block, stream, ...]: a session "
                                        "has one stream")]:
        with pytest.raises(gpuexec.Error) as e:
            saxpy[config]
        assert e.value.message.startswith("gpuexec client: kernel 'gx_saxpy': " + needle), \
            e.value.message
    with pytest.raises(gpuexec.Error) as e:
        saxpy[1, 32](2.0, x, yb, 16)
    assert "a numpy array (float32, shape (1000,)) is host memory" in e.value.message


def test_out_is_read_back_and_in_is_left_alone(session, kernels):
    fill = kernels.function("gx_fill_u32")
    out = np.zeros(100, dtype=np.uint32)
    fill(1, 128, (gpuexec.Out(out), 7, 100))
    np.testing.assert_array_equal(out, np.full(100, 7, dtype=np.uint32))
    # What the kernel writes over an In array stays on the device.
    kept = np.arange(100, dtype=np.uint32)
    fill(1, 128, (gpuexec.In(kept), 9, 100))
    np.testing.assert_array_equal(kept, np.arange(100, dtype=np.uint32))
    # A bytearray is host memory too.
    raw = bytearray(16)
    fill(1, 32, (gpuexec.Out(raw), 0x01020304, 4))
    assert bytes(raw) == bytes([4, 3, 2, 1]) * 4


def test_transfers_mixed_with_a_buffer_and_a_zero_size_array(session, kernels):
    saxpy = kernels.function("gx_saxpy")
    x, y = data(300)
    yb = session.upload(y)
    saxpy(2, 256, (2.0, gpuexec.In(x), yb, 300))
    np.testing.assert_array_equal(yb.read_array(), saxpy_expected(2.0, x, y))
    empty = np.zeros(0, dtype=np.float32)
    # n = 0: the kernel touches nothing; an empty array is a null pointer.
    saxpy(1, 32, (2.0, gpuexec.In(empty), gpuexec.InOut(empty.copy()), 0))


def test_the_argument_count_is_checked_first(session, kernels):
    saxpy = kernels.function("gx_saxpy")
    x = np.zeros(4, dtype=np.float32)
    for args, given in [((2.0, gpuexec.In(x), gpuexec.InOut(x)), 3), ((), 0),
                        ((2.0, x, x, 4, 5), 5)]:
        with pytest.raises(gpuexec.Error) as e:
            saxpy(1, 32, args)
        assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert e.value.message == (f"gpuexec client: kernel 'gx_saxpy' takes 4 arguments, "
                                   f"{given} given; pass one per parameter, in order")
    # Function.launch with copies counts before it uploads anything.
    with pytest.raises(gpuexec.Error) as e:
        saxpy.launch(1, 32, 2.0, gpuexec.In(x), gpuexec.InOut(x))
    assert "kernel 'gx_saxpy' takes 4 arguments, 3 given" in e.value.message


def test_args_must_be_a_tuple_or_list(session, kernels):
    saxpy = kernels.function("gx_saxpy")
    xb = session.alloc(64)
    for args in [xb, 2.0, {"a": 1}, iter([1, 2, 3, 4])]:
        with pytest.raises(gpuexec.Error) as e:
            saxpy(1, 32, args)
        assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert e.value.message.startswith(
            "gpuexec client: kernel 'gx_saxpy': args must be a tuple or list of the kernel's "
            f"arguments, got {type(args).__name__}; call it as f(grid, block, (a, x, y, n))")
    # A launch's own mistakes are still named: the argument, the geometry.
    with pytest.raises(gpuexec.Error) as e:
        saxpy(1, 32, (2.0, xb, xb, "16"))
    assert e.value.message.startswith("gpuexec client: argument 3 of kernel 'gx_saxpy'")
    with pytest.raises(gpuexec.Error) as e:
        saxpy([1] * 10000, 32, (2.0, xb, xb, 16))
    assert e.value.message.startswith("gpuexec client: grid must be an int")
    assert len(e.value.message) < 300


def test_a_bare_numpy_array_is_refused_with_what_to_do(session, kernels):
    saxpy = kernels.function("gx_saxpy")
    x = np.zeros(16, dtype=np.float32)
    yb = session.alloc(64)
    expected = ("gpuexec client: argument 1 of kernel 'gx_saxpy': a numpy array (float32, "
                "shape (16,)) is host memory; wrap it as gpuexec.In(x), Out(x) or InOut(x) to "
                "copy it around the launch, or upload it with session.asarray(x) and pass the "
                "buffer")
    for launch in (lambda: saxpy(1, 32, (2.0, x, yb, 16)),
                   lambda: saxpy.launch(1, 32, 2.0, x, yb, 16),
                   lambda: saxpy.launch_async(1, 32, 2.0, x, yb, 16)):
        with pytest.raises(gpuexec.Error) as e:
            launch()
        assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert e.value.message == expected
    # Nothing was queued: the session's next wait finds no failure.
    session.synchronize()
    # A numpy scalar and a 0-d array are scalar arguments.
    xb = session.upload(x + 1)
    saxpy(1, 32, (np.float32(2.0), xb, yb, np.array(16, dtype=np.uint64)))
    yb.memset(0)
    saxpy(1, 32, (np.array(2.0, dtype=np.float32), xb, yb, 16), sync=True)
    np.testing.assert_array_equal(yb.read_array(np.float32), np.full(16, 2.0, np.float32))


def test_launch_async_refuses_copies(session, kernels):
    saxpy = kernels.function("gx_saxpy")
    x, y = data(16)
    y0 = y.copy()
    for launch in (lambda: saxpy.launch_async(1, 32, 2.0, gpuexec.In(x), gpuexec.InOut(y), 16),
                   lambda: session.launch_async(saxpy, 1, 32, 2.0, gpuexec.In(x),
                                                gpuexec.InOut(y), 16),
                   lambda: session.launch(saxpy, 1, 32, 2.0, gpuexec.In(x), gpuexec.InOut(y),
                                          16)):
        with pytest.raises(gpuexec.Error) as e:
            launch()
        assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert e.value.message.startswith(
            "gpuexec client: argument 1 of kernel 'gx_saxpy': gpuexec.In(a float32 array of "
            "shape (16,)) is copied around a launch that finishes"), e.value.message
        assert "call the function, f(grid, block, args), or use function.launch(...)" in \
            e.value.message
    np.testing.assert_array_equal(y, y0)
    session.synchronize()


def test_transfer_arrays_are_checked_when_wrapped():
    x = np.zeros((4, 4), dtype=np.float32)
    cases = [
        (lambda: gpuexec.In(x[:, 1]), "gpuexec.In() of a float32 array of shape (4,): the array "
                                      "is not contiguous"),
        (lambda: gpuexec.Out(x.T), "gpuexec.Out() of a float32 array of shape (4, 4): the array "
                                   "is not contiguous"),
        (lambda: gpuexec.InOut(np.frombuffer(b"\0" * 16, dtype=np.float32)),
         "gpuexec.InOut() of a float32 array of shape (4,): the array is read-only and the "
         "launch writes it back; pass a writable array (x.copy())"),
        (lambda: gpuexec.Out(b"1234"), "gpuexec.Out() of a bytes: the data is read-only"),
        (lambda: gpuexec.In([1.0, 2.0]), "gpuexec.In() of a list: it takes a numpy array or a "
                                         "bytes-like object"),
        (lambda: gpuexec.In(np.array([object()])), "gpuexec.In() of a object array of shape "
                                                   "(1,): an array of Python objects"),
    ]
    for make, needle in cases:
        with pytest.raises(gpuexec.Error) as e:
            make()
        assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert e.value.message.startswith("gpuexec client: " + needle), e.value.message
    # Read-only data is fine for In.
    assert repr(gpuexec.In(b"1234")) == "gpuexec.In(a bytes)"


def test_another_sessions_buffer_is_refused_naming_both(client, session, kernels):
    saxpy = kernels.function("gx_saxpy")
    mine = session.alloc(64)
    with client.session() as other:
        theirs = other.alloc(64)
        a, b = other.token[:8], session.token[:8]
        for launch in (lambda: saxpy(1, 16, (2.0, mine, theirs, 16)),
                       lambda: saxpy.launch(1, 16, 2.0, mine, theirs, 16),
                       lambda: saxpy.launch_async(1, 16, 2.0, mine, theirs, 16),
                       lambda: saxpy(1, 16, (2.0, gpuexec.In(np.zeros(16, np.float32)),
                                             theirs, 16))):
            with pytest.raises(gpuexec.Error) as e:
                launch()
            assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
            assert e.value.message == (
                f"gpuexec client: argument 2 of kernel 'gx_saxpy': the Buffer belongs to "
                f"session {a}, the kernel to session {b}; a launch takes buffers of its own "
                f"session: copy the data through the host into session {b} "
                f"(session.asarray(buffer.get())), or load the module in session {a} too")
        # A view of their buffer, and a tensor map over it, are theirs too.
        for arg, what in [(theirs[8:], "Buffer"),
                          (gpuexec.TensorMap(theirs, "float32", [16], [], [16]),
                           "TensorMap's buffer")]:
            with pytest.raises(gpuexec.Error) as e:
                saxpy(1, 16, (2.0, mine, arg, 16))
            assert e.value.message.startswith(
                f"gpuexec client: argument 2 of kernel 'gx_saxpy': the {what} belongs to "
                f"session {a}, the kernel to session {b};"), e.value.message
        # Nothing reached the daemon: the session has no failure queued.
        session.synchronize()


def test_temporaries_are_freed(client, daemon):
    # 12 launches with two 256 KiB temporaries each would hold 6 MiB if
    # they were kept; the session may hold 1 MiB.
    with client.session(memory_limit=MiB) as s:
        saxpy = s.load_module(daemon.cubin).function("gx_saxpy")
        n = 64 << 10
        x, y = data(n)
        y0 = y.copy()
        for _ in range(12):
            saxpy(n // 256, 256, (1.0, gpuexec.In(x), gpuexec.InOut(y), n))
        expected = y0
        for _ in range(12):
            expected = saxpy_expected(1.0, x, expected)
        np.testing.assert_array_equal(y, expected)
        # All of the session's memory is free again.
        s.alloc(MiB).free()


def test_a_failure_on_the_way_frees_what_was_made(client, daemon):
    with client.session(memory_limit=MiB) as s:
        saxpy = s.load_module(daemon.cubin).function("gx_saxpy")
        n = 96 << 10  # 384 KiB an array: x and y fit, x and twice y do not
        x, y = data(n)
        y0 = y.copy()
        big = np.zeros(n, dtype=np.float32)
        with pytest.raises(gpuexec.Error) as e:
            saxpy.launch(n // 256, 256, 1.0, gpuexec.In(x),
                         gpuexec.InOut(np.concatenate([y, big])), n)
        assert e.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED, e.value
        # The In temporary was freed: the whole limit can be had again.
        s.alloc(MiB).free()
        # The daemon refuses the launch (a grid of 0 blocks): both
        # temporaries are freed and the arrays keep their values.
        with pytest.raises(gpuexec.Error) as e:
            saxpy(0, 256, (1.0, gpuexec.In(x), gpuexec.InOut(y), n))
        assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT, e.value
        assert "gx_saxpy" in e.value.message
        np.testing.assert_array_equal(y, y0)
        s.alloc(MiB).free()
        # The session goes on.
        saxpy(n // 256, 256, (1.0, gpuexec.In(x), gpuexec.InOut(y), n))
        np.testing.assert_array_equal(y, saxpy_expected(1.0, x, y0))
