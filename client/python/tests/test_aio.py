"""gpuexec.aio against a real gpuexecd on the driver double: connect,
sessions, copies and launches from coroutines, many at once on one session,
and the errors they raise. Each test drives its coroutines with
asyncio.run (no asyncio plugin)."""

import asyncio
import os
import socket
import time
import warnings

import grpc
import numpy as np
import pytest

import gpuexec
import gpuexec.aio
# The fixtures of test_auth.py: a CA and certificates, a daemon on TLS with
# tenants.
import test_auth
# test_session_faults.py's daemon without a strike limit, and its checks.
import test_session_faults

pki = test_auth.pki
tls_daemon = test_auth.tls_daemon
fault_daemon = test_session_faults.fault_daemon

HINT = "(set the target with connect(target) or $GPUEXEC_TARGET)"


def _saxpy(session, cubin):
    async def get():
        module = await session.load_module(cubin)
        return await module.function("gx_saxpy")
    return get()


def test_connect_and_devices(daemon):
    async def main():
        async with gpuexec.aio.connect(daemon.target) as client:
            devices = await client.devices()
            assert devices and all(isinstance(d, gpuexec.Device) for d in devices)
            assert any(d.healthy for d in devices)
        # Awaited rather than entered: the same client, closed by hand.
        client = await gpuexec.aio.connect(daemon.target)
        try:
            assert [d.index for d in await client.devices()] == [d.index for d in devices]
        finally:
            await client.close()
    asyncio.run(main())


def test_saxpy_matches_numpy(daemon):
    n = 1000
    x = np.arange(n, dtype=np.float32)
    y = np.linspace(-1, 1, n, dtype=np.float32)

    async def main():
        async with gpuexec.aio.connect(daemon.target) as client, client.session() as s:
            xb, yb = await s.upload(x), await s.asarray(y)
            assert (xb.shape, xb.dtype, xb.size, xb.nbytes) == ((n,), gpuexec.float32, n, 4 * n)
            saxpy = await _saxpy(s, daemon.cubin)
            assert saxpy.params == [(0, 4), (8, 8), (16, 8), (24, 8)]
            assert await saxpy.launch((n + 255) // 256, 256, gpuexec.f32(3.0), xb, yb,
                                      gpuexec.u64(n)) is None
            got = await yb.get()
            np.testing.assert_allclose(got, 3.0 * x + y, rtol=1e-6)
            # sync=True: the session's GPU seconds; plain int and float typed
            # by the kernel's parameters.
            seconds = await saxpy.launch(4, 256, 1.0, xb, yb, n, sync=True)
            assert isinstance(seconds, float) and seconds >= 0.0
            got = await yb.get()
            np.testing.assert_allclose(got, 4.0 * x + y, rtol=1e-6)
            assert await yb.read() == got.tobytes()
    asyncio.run(main())


def test_buffers_write_read_memset_zeros_free(daemon):
    async def main():
        async with gpuexec.aio.connect(daemon.target) as client, client.session() as s:
            raw = await s.alloc(64)
            assert (raw.nbytes, raw.shape, raw.dtype) == (64, (64,), gpuexec.uint8)
            assert not (await raw.get()).any()  # the daemon clears new memory
            assert await raw.write(bytes(range(64))) == 64
            assert await raw.read(offset=60) == bytes(range(60, 64))
            await raw.memset(7, offset=8, size=8)
            assert await raw.read(offset=6, size=12) == bytes([6, 7] + [7] * 8 + [16, 17])
            zeros = await s.zeros((4, 8), "int32")
            got = await zeros.get()
            assert got.shape == (4, 8) and got.dtype == np.int32 and not got.any()
            empty = await s.empty(3, np.float64)
            assert (empty.shape, empty.nbytes) == ((3,), 24)
            typed = await s.alloc(18, dtype="float32")  # as many as fit
            assert (typed.shape, typed.dtype, typed.nbytes) == ((4,), gpuexec.float32, 16)
            await typed.set([1, 2, 3, 4])  # converted to the buffer's dtype
            np.testing.assert_array_equal(await typed.get(), np.arange(1, 5, dtype=np.float32))
            np.testing.assert_array_equal(await typed.read("int32", offset=4, size=8),
                                          np.array([2.0, 3.0], np.float32).view(np.int32))
            # Ranges past the end are refused before any call.
            with pytest.raises(gpuexec.Error) as past:
                await typed.read(offset=8, size=12)
            assert past.value.code == grpc.StatusCode.OUT_OF_RANGE, past.value
            assert past.value.message == (
                f"gpuexec client: read of {typed!r}: bytes [8, 20) are past the end of its 16 "
                "bytes; ask for a range inside it")
            with pytest.raises(gpuexec.Error):
                await typed.write(bytes(17))
            # asarray: a buffer of the session as it is; data converted.
            assert await s.asarray(typed) is typed
            ints = await s.asarray([[1, 2], [3, 4]], dtype="int16")
            assert (ints.shape, ints.dtype) == ((2, 2), gpuexec.int16)
            np.testing.assert_array_equal(await ints.get(), [[1, 2], [3, 4]])
            # A numpy dtype a buffer does not hold travels as its bytes.
            c = await s.upload(np.ones(2, np.complex64))
            assert (c.shape, c.dtype) == ((16,), gpuexec.uint8)
            await raw.free()
            with pytest.raises(gpuexec.Error) as e:
                await raw.read()
            assert e.value.code == grpc.StatusCode.NOT_FOUND, e.value
    asyncio.run(main())


def test_100_concurrent_launch_async_then_synchronize(daemon):
    n = 256

    async def main():
        async with gpuexec.aio.connect(daemon.target) as client, client.session() as s:
            x = await s.upload(np.ones(n, dtype=np.float32))
            y = await s.zeros(n, np.float32)
            saxpy = await _saxpy(s, daemon.cubin)
            results = await asyncio.gather(*(
                saxpy.launch_async(1, 256, gpuexec.f32(1.0), x, y, gpuexec.u64(n))
                for _ in range(100)))
            assert results == [None] * 100
            seconds = await s.synchronize()
            assert isinstance(seconds, float) and seconds >= 0.0
            np.testing.assert_array_equal(await y.get(), np.full(n, 100.0, np.float32))
    asyncio.run(main())


def test_an_untimed_session_reports_no_gpu_time(daemon):
    n = 256

    async def main():
        async with gpuexec.aio.connect(daemon.target) as client, \
                client.session(gpu_time=False) as s:
            assert s.gpu_time is False
            x = await s.upload(np.ones(n, dtype=np.float32))
            y = await s.zeros(n, np.float32)
            saxpy = await _saxpy(s, daemon.cubin)
            await saxpy.launch_async(1, 256, gpuexec.f32(2.0), x, y, gpuexec.u64(n))
            assert await s.synchronize() == 0.0
            np.testing.assert_array_equal(await y.get(), np.full(n, 2.0, np.float32))
    asyncio.run(main())


def test_reads_and_writes_keep_the_order_their_calls_started_in(daemon):
    """Coroutines of one session interleaved: each read sees exactly the
    launches and writes started before it."""
    n = 64

    async def main():
        async with gpuexec.aio.connect(daemon.target) as client, client.session() as s:
            x = await s.upload(np.ones(n, dtype=np.float32))
            y = await s.zeros(n, np.float32)
            saxpy = await _saxpy(s, daemon.cubin)
            calls = []
            for i in range(10):
                calls.append(saxpy.launch_async(1, 64, gpuexec.f32(1.0), x, y, gpuexec.u64(n)))
                calls.append(y.get())
                if i == 4:
                    calls.append(y.write(np.full(n, 100.0, np.float32)))
            results = await asyncio.gather(*calls)
            seen = [r[0] for r in results if r is not None and not isinstance(r, int)]
            assert seen == [1, 2, 3, 4, 5, 101, 102, 103, 104, 105], seen
    asyncio.run(main())


def test_many_sessions_on_one_client_at_once(daemon):
    async def one(client, value):
        async with client.session() as s:
            b = await s.upload(np.full(16, value, np.int32))
            await b.memset(0, offset=0, size=4)
            got = await b.get()
            return int(got[0]), int(got[1:].sum())

    async def main():
        async with gpuexec.aio.connect(daemon.target) as client:
            got = await asyncio.gather(*(one(client, v) for v in range(8)))
        assert got == [(0, 15 * v) for v in range(8)]
    asyncio.run(main())


def test_an_error_of_the_daemon_is_a_gpuexec_error_with_its_code(daemon):
    async def main():
        async with gpuexec.aio.connect(daemon.target) as client, client.session() as s:
            saxpy = await _saxpy(s, daemon.cubin)
            x = await s.zeros(16, np.float32)
            gone = await s.alloc(64)
            await gone.free()
            # A waiting launch with a freed buffer: the daemon's NOT_FOUND.
            with pytest.raises(gpuexec.Error) as e:
                await saxpy.launch(1, 16, 1.0, x, gone, 16)
            assert e.value.code == grpc.StatusCode.NOT_FOUND, e.value
            assert "buffer" in e.value.message, e.value
            # Queued without waiting: raised by the next waiting call, once.
            await saxpy.launch_async(1, 16, 1.0, x, gone, 16)
            with pytest.raises(gpuexec.Error) as queued:
                await s.synchronize()
            assert queued.value.code == grpc.StatusCode.NOT_FOUND, queued.value
            assert queued.value.message == e.value.message
            assert await s.synchronize() >= 0.0
            # ... or by a read, which then is not made.
            await saxpy.launch_async(1, 16, 1.0, x, gone, 16)
            with pytest.raises(gpuexec.Error) as by_read:
                await x.get()
            assert by_read.value.message == e.value.message
            assert not (await x.get()).any()
            # A buffer of 2^60 bytes: the daemon refuses it, the session lives.
            with pytest.raises(gpuexec.Error) as big:
                await s.alloc(1 << 60)
            assert big.value.code in (grpc.StatusCode.RESOURCE_EXHAUSTED,
                                      grpc.StatusCode.INVALID_ARGUMENT), big.value
            with pytest.raises(gpuexec.Error) as missing:
                await (await s.load_module(daemon.cubin)).function("gx_no_such_kernel")
            assert missing.value.code == grpc.StatusCode.NOT_FOUND, missing.value
            assert "gx_no_such_kernel" in missing.value.message
    asyncio.run(main())


def test_a_session_is_closed_by_async_with(daemon):
    async def main():
        async with gpuexec.aio.connect(daemon.target) as client:
            async with client.session() as s:
                b = await s.upload(b"abc")
                token = s.token
            assert s.closed
            before = sum(d.sessions for d in await client.devices())
            # The daemon no longer knows it: its buffer's read is refused.
            with pytest.raises(gpuexec.Error) as e:
                await b.read()
            assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION, e.value
            assert "closed by close()" in e.value.message
            # An exception in the block closes it too, and goes on unchanged.
            with pytest.raises(KeyError):
                async with client.session() as s2:
                    raise KeyError("from the block")
            assert s2.closed
            assert sum(d.sessions for d in await client.devices()) == before
            # On the daemon: a sync client with the token gets NOT_FOUND.
            with gpuexec.connect(daemon.target) as sync_client:
                with pytest.raises(grpc.RpcError) as gone:
                    sync_client.stub.KeepAlive(gpuexec.v1.gpuexec_pb2.KeepAliveRequest(
                        session=token))
                assert gone.value.code() == grpc.StatusCode.NOT_FOUND
            await s.close()  # idempotent
    asyncio.run(main())


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_connection_refused_is_explained_at_once(tmp_path):
    async def refused(target):
        start = time.monotonic()
        with pytest.raises(gpuexec.Error) as e:
            await gpuexec.aio.connect(target, timeout=30)
        assert time.monotonic() - start < 5.0, e.value
        assert e.value.code == grpc.StatusCode.UNAVAILABLE, e.value
        return e.value.message

    async def main():
        target = f"127.0.0.1:{_free_port()}"
        assert await refused(target) == (f"gpuexec: cannot connect to {target}: connection "
                                         f"refused: is gpuexecd running? {HINT}")
        missing = f"unix:{os.path.join(str(tmp_path), 'none.sock')}"
        assert await refused(missing) == (f"gpuexec: cannot connect to {missing}: no such "
                                          f"socket: is gpuexecd running? {HINT}")
    asyncio.run(main())


def test_what_the_client_refuses_before_any_call(daemon):
    async def main():
        with pytest.raises(gpuexec.Error) as pool:
            await gpuexec.aio.connect("pool://gpuexec-pool.example:50051")
        assert pool.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert "pools are the sync client's only" in pool.value.message
        with pytest.raises(gpuexec.Error) as token:
            await gpuexec.aio.connect("gpu.example:50051", token="t0ken")
        assert token.value.code == grpc.StatusCode.FAILED_PRECONDITION
        async with gpuexec.aio.connect(daemon.target) as client, client.session() as s:
            saxpy = await _saxpy(s, daemon.cubin)
            x = await s.zeros(4, np.float32)
            with pytest.raises(gpuexec.Error) as arg:
                await saxpy.launch_async(1, 4, 1.0, x, np.zeros(4), 4)
            assert arg.value.code == grpc.StatusCode.INVALID_ARGUMENT
            assert "upload it" in arg.value.message
            with pytest.raises(gpuexec.Error) as shape:
                await s.empty((2, -1))
            assert "shape" in shape.value.message
            async with client.session() as other:
                theirs = await other.zeros(4, np.float32)
                with pytest.raises(gpuexec.Error) as foreign:
                    await saxpy.launch_async(1, 4, 1.0, x, theirs, 4)
                assert foreign.value.code == grpc.StatusCode.INVALID_ARGUMENT
                assert foreign.value.message == (
                    f"gpuexec client: argument 2 of kernel 'gx_saxpy': the buffer belongs to "
                    f"session {other.token[:8]}, the kernel to session {s.token[:8]}; a launch "
                    "takes buffers of its own session: upload the data in this one")
    asyncio.run(main())


def test_a_cancelled_call_leaves_the_session_in_order(daemon):
    n = 64

    async def main():
        async with gpuexec.aio.connect(daemon.target) as client, client.session() as s:
            x = await s.upload(np.ones(n, dtype=np.float32))
            y = await s.zeros(n, np.float32)
            saxpy = await _saxpy(s, daemon.cubin)
            await saxpy.launch_async(1, 64, 1.0, x, y, n)
            # A read cancelled while it waits for its turn, another after it.
            cancelled = asyncio.ensure_future(y.get())
            later = asyncio.ensure_future(y.get())
            await asyncio.sleep(0)
            cancelled.cancel()
            with pytest.raises(asyncio.CancelledError):
                await cancelled
            np.testing.assert_array_equal(await later, np.ones(n, np.float32))
            await saxpy.launch_async(1, 64, 1.0, x, y, n)
            np.testing.assert_array_equal(await y.get(), np.full(n, 2.0, np.float32))
    asyncio.run(main())


def test_calls_after_the_client_closed_say_so(daemon):
    async def main():
        client = await gpuexec.aio.connect(daemon.target)
        s = await client.session()
        b = await s.upload(b"abcd")
        await s.close()
        s = await client.session()
        b = await s.upload(b"abcd")
        await client.close()
        assert client.closed
        for call in (s.synchronize, b.read, client.devices, lambda: s.load_module(b"x"),
                     s.close):
            with pytest.raises(gpuexec.Error) as e:
                await call()
            assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION, e.value
            assert e.value.message == (
                f"gpuexec client: the client of {daemon.target} was closed by close(): "
                "connect again (its sessions stay open on the daemon until their lease "
                "lapses)")
    asyncio.run(main())


def test_token_and_tls_as_gpuexec_connect(daemon, tls_daemon, pki):
    n = 1 << 17  # Write and Read in several chunks

    async def main():
        x = np.arange(n, dtype=np.float32)
        async with gpuexec.aio.connect(tls_daemon.target, token=pki.token_a,
                                       root_ca=pki.ca, chunk_bytes=64 << 10) as client:
            assert (await client.devices())[0].healthy
            async with client.session() as s:
                # Every kind of call carries the token: unary, the module
                # load, Write, Read and the command stream.
                saxpy = await _saxpy(s, daemon.cubin)
                xb, yb = await s.upload(x), await s.zeros(n)
                await saxpy.launch_async((n + 255) // 256, 256, 2.0, xb, yb, n)
                np.testing.assert_array_equal(await yb.get(), 2.0 * x)
        async with gpuexec.aio.connect(tls_daemon.target, root_ca=pki.ca) as client:
            with pytest.raises(gpuexec.Error) as e:
                await client.session()
            assert e.value.code == grpc.StatusCode.UNAUTHENTICATED, e.value
        with pytest.raises(gpuexec.Error) as e:
            await gpuexec.aio.connect(tls_daemon.target, root_ca=pki.rogue_ca, timeout=30)
        assert e.value.code == grpc.StatusCode.UNAVAILABLE, e.value
        assert e.value.message.startswith(
            f"gpuexec: cannot connect to {tls_daemon.target}: TLS: the daemon's certificate "
            "is not signed by the CA given"), e.value
        with pytest.raises(gpuexec.Error) as e:
            await gpuexec.aio.connect(tls_daemon.target, timeout=30)
        assert "the daemon speaks TLS, and this client plain TCP" in e.value.message, e.value
    asyncio.run(main())


async def _session_on_device_0(client):
    """A new session on device 0, once it is back from an earlier reset."""
    deadline = time.monotonic() + 20
    while True:
        try:
            return await client.session(device=0)
        except gpuexec.Error as e:
            if e.code != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.02)


def test_a_fault_names_the_kernel_and_later_calls_lead_with_it(fault_daemon, daemon):
    async def main():
        async with gpuexec.aio.connect(fault_daemon) as client:
            s = await _session_on_device_0(client)
            fault = await (await s.load_module(daemon.cubin)).function("gx_fault")
            buf = await s.alloc(64)
            with pytest.raises(gpuexec.Error) as first:
                await fault.launch(1, 1, gpuexec.u64(test_session_faults.BAD_ADDRESS),
                                   sync=True)
            test_session_faults._assert_names_the_fault(first.value)
            async def queued_then_synchronize():
                await fault.launch_async(1, 1, 0)
                await s.synchronize()

            for call in (s.keep_alive, s.synchronize, buf.read, lambda: s.alloc(64),
                         lambda: buf.write(b"x" * 8), lambda: fault.launch(1, 1, 0),
                         queued_then_synchronize, lambda: s.load_module(daemon.cubin)):
                with pytest.raises(gpuexec.Error) as later:
                    await call()
                test_session_faults._assert_leads_with_the_fault(later.value, s)
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # told already: no warning
                await s.close()
            # A queued fault: the next waiting call names it.
            s = await _session_on_device_0(client)
            fault = await (await s.load_module(daemon.cubin)).function("gx_fault")
            await fault.launch_async(1, 1, gpuexec.u64(test_session_faults.BAD_ADDRESS))
            with pytest.raises(gpuexec.Error) as queued:
                await s.synchronize()
            test_session_faults._assert_names_the_fault(queued.value,
                                                        codes=test_session_faults.QUEUED)
            await s.close()
    asyncio.run(main())
