"""The session's command stream (launches and synchronizes on one Execute
call) against a real gpuexecd, on both of its transports: grpcio's core call
polled by the caller ("core") and grpcio's public streaming API
("iterator"). No test here asserts a time."""

import socket
import struct
import threading
import time

import grpc
import numpy as np
import pytest

import gpuexec
from gpuexec import _execute_call


@pytest.fixture(params=["core", "iterator"])
def transport(request, monkeypatch):
    if request.param == "iterator":
        monkeypatch.setenv(_execute_call.ENV_TRANSPORT, "iterator")
    else:
        monkeypatch.delenv(_execute_call.ENV_TRANSPORT, raising=False)
    return request.param


@pytest.fixture
def stream_session(daemon, transport):
    with gpuexec.connect(daemon.target) as client, client.session() as s:
        assert client.command_stream == transport
        yield s


@pytest.fixture
def fill(stream_session, daemon):
    return stream_session.load_module(daemon.cubin).function("gx_fill_u32")


class _NoopInterceptor(grpc.UnaryUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    def intercept_unary_unary(self, continuation, details, request):
        return continuation(details, request)

    def intercept_stream_stream(self, continuation, details, request_iterator):
        return continuation(details, request_iterator)


def test_a_channel_with_interceptors_of_its_own_uses_the_public_api(daemon, monkeypatch):
    monkeypatch.delenv(_execute_call.ENV_TRANSPORT, raising=False)
    with gpuexec.connect(daemon.target) as c:
        assert c.command_stream == "core"
    channel = grpc.intercept_channel(grpc.insecure_channel(daemon.target), _NoopInterceptor())
    with gpuexec.Client(channel) as c, c.session() as s:
        assert c.command_stream == "iterator"
        fill = s.load_module(daemon.cubin).function("gx_fill_u32")
        with s.alloc(64) as buf:
            fill.launch_async(1, 16, buf, 4, 16)
            assert fill.launch(1, 16, buf.ptr(4), 5, 1, sync=True) > 0.0
            assert buf.read(np.uint32).tolist() == [4, 5] + [4] * 14


def test_a_failure_in_the_middle_of_a_batch_is_raised_once_with_its_status(
        stream_session, fill):
    n = 1024
    freed = stream_session.alloc(64)
    freed.free()
    # The daemon's own words for this launch, from a launch that waits.
    with pytest.raises(gpuexec.Error) as direct:
        fill.launch(1, 32, freed, 1, 16)
    with stream_session.alloc(4 * n) as buf:
        for v in range(1, 301):
            fill.launch_async(n // 256, 256, buf, v, n)
        fill.launch_async(1, 32, freed, 1, 16)  # fails on the daemon
        for v in range(301, 601):
            fill.launch_async(n // 256, 256, buf, v, n)
        with pytest.raises(gpuexec.Error) as e:
            stream_session.synchronize()
        assert e.value.code == direct.value.code == grpc.StatusCode.NOT_FOUND
        assert e.value.message == direct.value.message
        # Once: the launches after it ran, and nothing more is raised.
        assert stream_session.synchronize() >= 0.0
        np.testing.assert_array_equal(buf.read(np.uint32), np.full(n, 600, np.uint32))
        fill.launch_async(n // 256, 256, buf, 9, n)
        assert fill.launch(1, 32, buf, 10, 1, sync=True) > 0.0
        assert buf.read(size=8) == struct.pack("<II", 10, 9)


def test_a_failure_is_raised_by_a_copy_that_waits_for_it(stream_session, fill):
    freed = stream_session.alloc(64)
    freed.free()
    with stream_session.alloc(64) as buf:
        fill.launch_async(1, 16, freed, 1, 16)
        with pytest.raises(gpuexec.Error) as e:
            buf.read()
        assert e.value.code == grpc.StatusCode.NOT_FOUND
        assert buf.read() == buf.read()  # raised once


def test_a_waiting_launch_after_many_queued_ones_runs_after_them(stream_session, fill):
    n = 256
    with stream_session.alloc(4 * n) as buf:
        for v in range(1, 3001):
            fill.launch_async(1, n, buf, v, n)
        assert fill.launch(1, n, buf, 7777, n, sync=True) > 0.0
        np.testing.assert_array_equal(buf.read(np.uint32), np.full(n, 7777, np.uint32))
        # An answered launch (not synchronizing) is ordered the same way.
        for v in range(1, 1001):
            fill.launch_async(1, n, buf, v, n)
        assert fill.launch(1, n, buf, 8888, n) is None
        np.testing.assert_array_equal(buf.read(np.uint32), np.full(n, 8888, np.uint32))


def test_threads_share_a_session(stream_session, fill):
    n, threads, rounds = 256, 4, 200
    bufs = [stream_session.alloc(4 * n) for _ in range(threads)]
    errors = []

    def work(t):
        try:
            for r in range(rounds):
                fill.launch_async(1, n, bufs[t], r, n)
                if r % 50 == 49:
                    fill.launch(1, n, bufs[t], 100000 + r, n, sync=r % 100 == 99)
            fill.launch_async(1, n, bufs[t], 1000 + t, n)
            stream_session.synchronize()
        except Exception as e:  # pylint: disable=broad-except
            errors.append(e)

    workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=120)
    assert not any(w.is_alive() for w in workers)
    assert not errors, errors
    for t, buf in enumerate(bufs):
        np.testing.assert_array_equal(buf.read(np.uint32), np.full(n, 1000 + t, np.uint32))


def test_queued_launches_of_a_closed_session_are_not_found(daemon, transport):
    with gpuexec.connect(daemon.target) as client:
        s = client.session()
        fill = s.load_module(daemon.cubin).function("gx_fill_u32")
        buf = s.alloc(64)
        fill.launch_async(1, 16, buf, 3, 16)
        s.close()
        fill.launch_async(1, 16, buf, 3, 16)
        with pytest.raises(gpuexec.Error) as e:
            s.synchronize()
        assert e.value.code == grpc.StatusCode.NOT_FOUND, e.value
        with pytest.raises(gpuexec.Error) as e:
            s.synchronize()
        assert e.value.code == grpc.StatusCode.NOT_FOUND, e.value


def test_closing_the_client_ends_its_sessions_streams(daemon, transport):
    """grpcio's close waits for every call; a session left open keeps its
    stream, which the client ends first."""
    done = threading.Event()

    def run():
        client = gpuexec.connect(daemon.target)
        s = client.session(lease=5)
        fill = s.load_module(daemon.cubin).function("gx_fill_u32")
        buf = s.alloc(64)
        fill.launch_async(1, 16, buf, 3, 16)
        fill.launch(1, 16, buf, 4, 16, sync=True)
        fill.launch_async(1, 16, buf, 5, 16)
        client.close()
        done.set()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout=30)
    assert done.is_set(), "Client.close() did not return"


class _Proxy:
    """A TCP listener on loopback that relays each connection to the
    daemon's Unix socket, and can cut every connection it relays."""

    def __init__(self, unix_path):
        self._unix_path = unix_path
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(16)
        self.target = "127.0.0.1:%d" % self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._sockets = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                near, _ = self._listener.accept()
            except OSError:
                return
            far = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            far.connect(self._unix_path)
            with self._lock:
                self._sockets += [near, far]
            for a, b in ((near, far), (far, near)):
                threading.Thread(target=self._relay, args=(a, b), daemon=True).start()

    @staticmethod
    def _relay(a, b):
        try:
            while True:
                data = a.recv(1 << 16)
                if not data:
                    break
                b.sendall(data)
        except OSError:
            pass
        for s in (a, b):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cut(self):
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for s in sockets:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def close(self):
        self._listener.close()
        self.cut()


def test_launches_after_a_broken_stream_reopen_it(daemon, transport):
    assert daemon.target.startswith("unix:")
    proxy = _Proxy(daemon.target[len("unix:"):])
    try:
        with gpuexec.connect(proxy.target) as client, client.session() as s:
            fill = s.load_module(daemon.cubin).function("gx_fill_u32")
            buf = s.alloc(64)
            for v in range(100):
                fill.launch_async(1, 16, buf, v, 16)
            assert s.synchronize() >= 0.0
            fill.launch_async(1, 16, buf, 1, 16)
            proxy.cut()
            with pytest.raises(gpuexec.Error) as e:
                s.synchronize()
            assert e.value.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL), e.value
            assert "may not have run" in e.value.message, e.value
            # A new stream for the same session: the launches go on. (The
            # channel may still call itself ready on the cut connection for
            # a moment: a stream opened then fails as the first did.)
            deadline = time.monotonic() + 10
            while True:
                grpc.channel_ready_future(client.channel).result(timeout=10)
                try:
                    fill.launch_async(1, 16, buf, 2, 16)
                    fill.launch(1, 16, buf.ptr(4), 3, 1, sync=True)
                    break
                except gpuexec.Error as again:
                    if again.code != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
            assert buf.read(np.uint32).tolist() == [2, 3] + [2] * 14
    finally:
        proxy.close()
