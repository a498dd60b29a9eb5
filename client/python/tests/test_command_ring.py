"""Command rings from Python (gpuexec/_ring.py): a session on a daemon that
serves them (gpuexecd --shm_socket --command_rings) posts its launches and
synchronizes through shared memory, with the same results and the same
errors as on the Execute stream.

The launch tests of test_client.py, test_calls.py, test_graphs.py,
test_launch_attributes.py and test_triton_driver.py run here a second time,
on sessions of this module's daemon (the ``client`` fixture below replaces
conftest's), so every argument kind and attribute, and Triton's launcher,
go through ring records too.
"""

import logging
import os
import re
import signal
import struct
import subprocess
import sys
import time

import grpc
import numpy as np
import pytest

import gpuexec
from conftest import DAEMON_MEMORY_LIMIT, start_daemon, stop_daemon
from gpuexec import _ring, _ring_records
from gpuexec.v1 import gpuexec_pb2 as pb

# The launch tests, again over the ring (pytest collects them here too).
from test_client import (  # noqa: F401  pylint: disable=unused-import
    test_an_async_launchs_failure_is_raised_by_the_next_waiting_call,
    test_argument_errors_name_the_parameter, test_cluster_launch,
    test_dynamic_shared_memory_above_48k, test_every_scalar_type, test_fill_u32,
    test_half_scalars_round_once, test_launches_travel_on_the_command_stream,
    test_saxpy_matches_numpy, test_struct_argument_as_bytes)
from test_calls import (  # noqa: F401  pylint: disable=unused-import
    test_call_queues_like_launch_async, test_call_with_sync_returns_gpu_time,
    test_in_and_inout_round_trip, test_numba_configuration)
from test_graphs import (  # noqa: F401  pylint: disable=unused-import
    saxpy, test_a_pipeline_replays_with_named_and_indexed_patches,
    test_a_refused_recorded_launch_fails_the_block_and_no_graph_is_kept,
    test_what_a_recording_and_a_replay_refuse)
from test_session_faults import _session  # a session once device 0 is back from a reset
from test_triton_driver import (  # noqa: F401  pylint: disable=unused-import
    _inputs, _kernel, driver, test_a_freed_buffer_drops_the_kept_launches,
    test_a_launch_as_triton_makes_it, test_an_empty_grid_launches_nothing,
    test_do_bench_reports_gpu_milliseconds, test_events_time_the_work_between_two_records,
    test_repeated_launches_reuse_their_bytes_until_scratch_moves, test_scratch_and_clusters,
    test_views_are_pointers_at_their_offset)
from test_launch_attributes import (  # noqa: F401  pylint: disable=unused-import
    test_bad_tensor_maps_are_refused_by_the_daemon, test_cooperative_launch,
    test_programmatic_dependent_launch, test_tensor_map_copy,
    test_tensor_map_in_a_queued_launch, test_tensor_map_spellings_offset_and_nan_fill)

HEADER = os.path.join(os.path.dirname(__file__), "..", "..", "..", "proto", "gpuexec",
                      "command_ring.h")
BAD_ADDRESS = 16  # gx_fault writes here; no allocation holds it


@pytest.fixture(scope="module")
def ring_daemon(daemon, tmp_path_factory):
    """gpuexecd serving command rings on its host memory socket, without a
    strike limit (the fault tests reset the device)."""
    d = tmp_path_factory.mktemp("ring")
    unix, shm = d / "d.sock", d / "shm.sock"
    process, _ = start_daemon(
        daemon.binary,
        [f"--driver={daemon.driver}", "--listen=", f"--unix_socket={unix}",
         f"--shm_socket={shm}", "--command_rings", "--strike_limit=0",
         f"--daemon_memory_limit={DAEMON_MEMORY_LIMIT}"], d / "gpuexecd.log")
    yield f"unix:{unix}"
    stop_daemon(process)


@pytest.fixture
def client(ring_daemon):
    with gpuexec.connect(ring_daemon) as c:
        yield c


def _on_ring(session):
    """True when the session's commands went on its ring, never on an
    Execute stream."""
    commands = session._commands
    return commands._ring is not None and commands._stream._call is None


def test_the_layout_is_the_headers():
    if not os.path.exists(HEADER):
        pytest.skip("proto/gpuexec/command_ring.h is not beside the tests")
    with open(HEADER) as f:
        lines = re.findall(r"^// LAYOUT (\S+) (\d+) (\d+)$", f.read(), re.M)
    assert {name: (int(off), int(size)) for name, off, size in lines} == _ring.LAYOUT
    layout = _ring.LAYOUT
    # Each struct spans its record's fields, end to end.
    for prefix, s in (("submit", _ring.HEAD), ("complete", _ring.COMPLETE),
                      ("arg", _ring_records.SLOT), ("tensor_map", _ring_records.TENSOR_MAP),
                      ("memset", _ring_records.MEMSET), ("copy_buffer", _ring_records.COPY_BUFFER),
                      ("region_copy", _ring_records.REGION_COPY)):
        fields = [v for k, v in layout.items() if k.startswith(prefix + ".")]
        assert s.size == max(off + size for off, size in fields), prefix
    launch = [v for k, v in layout.items() if k.startswith("launch.")]
    assert (_ring_records.LAUNCH_FIXED.size + _ring_records.LAUNCH_COUNTS.size
            == max(off + size for off, size in launch) == 64)
    assert _ring_records.LAUNCH_FIXED.size == layout["launch.nargs"][0]


def test_launches_and_synchronizes_ride_the_ring(client, daemon, caplog):
    caplog.set_level(logging.DEBUG, logger="gpuexec")
    with _session(client) as s:
        fill = s.load_module(daemon.cubin).function("gx_fill_u32")
        with s.alloc(4 * 64) as buf:
            assert fill.launch(1, 64, buf, 7, 64, sync=True) >= 0.0
            for v in range(1, 301):
                fill.launch_async(1, 64, buf, v, 64)
            assert s.synchronize() >= 0.0
            assert _on_ring(s)
            # A gRPC Read after queued launches sees them (the read waits
            # for the ring's commands to start).
            fill.launch_async(1, 64, buf, 1234, 64)
            np.testing.assert_array_equal(buf.read(np.uint32), np.full(64, 1234, np.uint32))
            # A gRPC Write before a launch on the ring is seen by it.
            buf.write(np.arange(64, dtype=np.uint32))
            fill.launch(1, 32, buf.ptr(128), 9, 32)
            got = buf.read(np.uint32)
            assert got[:32].tolist() == list(range(32)) and got[32:].tolist() == [9] * 32
    assert any(re.search(r"command ring: ring \d+ carries session commands", r.getMessage())
               for r in caplog.records)


def test_an_untimed_session_rides_the_ring_and_reports_no_gpu_time(client, daemon):
    with client.session(gpu_time=False) as s:
        assert s.gpu_time is False
        fill = s.load_module(daemon.cubin).function("gx_fill_u32")
        with s.alloc(4 * 64) as buf:
            assert fill.launch(1, 64, buf, 7, 64, sync=True) == 0.0
            for v in range(1, 101):
                fill.launch_async(1, 64, buf, v, 64)
            assert s.synchronize() == 0.0
            assert _on_ring(s)
            np.testing.assert_array_equal(buf.read(np.uint32), np.full(64, 100, np.uint32))
    with client.session() as timed:
        assert timed.gpu_time is True


def test_a_waiting_command_takes_one_round_of_waiting(client, daemon):
    """A launch that waits ends its wait at its answer, not first at its
    start (the daemon's submission head) and then again at the answer."""
    with client.session() as s:
        # A kernel of 300 us on a GPU (and on the test double): the command
        # starts well before its answer comes.
        spin = s.load_module(daemon.cubin).function("gx_spin")
        spin.launch(1, 1, 300_000, sync=True)
        ring = s._commands._ring
        assert ring is not None
        n = 100
        before = ring._rounds
        for _ in range(n):
            spin.launch(1, 1, 300_000, sync=True)
        assert ring._rounds - before <= n + n // 10


def test_waiting_launches_are_answered_by_the_worker_after_a_failure(client, daemon):
    """A daemon of layout version 2 gives the ring an answer area: the
    worker posts each waiting launch's or synchronize's success there
    itself, and a refusal before one is still raised first, by that
    launch, which ran."""
    with _session(client) as s:
        fill = s.load_module(daemon.cubin).function("gx_fill_u32")
        with s.alloc(256) as buf:
            for v in range(1, 11):
                assert fill.launch(1, 64, buf, v, 64, sync=True) >= 0.0
            ring = s._commands._ring
            assert ring is not None and ring._aq_bytes > 0
            assert ring._aq_tail_word.value // _ring.SLOT == 10
            for v in range(5):
                fill.launch_async(1, 64, buf, v, 64)
            assert s.synchronize() >= 0.0
            assert ring._aq_tail_word.value // _ring.SLOT == 11
            gone = s.alloc(256)
            gone.free()
            fill.launch_async(1, 64, gone, 77, 64)
            with pytest.raises(gpuexec.Error) as e:
                fill.launch(1, 64, buf, 11, 64, sync=True)
            assert e.value.code == grpc.StatusCode.NOT_FOUND, e.value
            fill.launch(1, 64, buf, 12, 64, sync=True)  # told once
            assert buf.read(np.uint32)[0] == 12


def test_recordings_and_replays_ride_the_ring(client, daemon):
    with _session(client) as s:
        fill = s.load_module(daemon.cubin).function("gx_fill_u32")
        with s.alloc(4 * 64) as buf:
            with s.graph() as g:
                buf.memset(0x11)
                fill.launch_async(1, 64, buf, g.arg("v", 5), gpuexec.u64(16))
            assert g.nodes == 2
            assert g.launch(sync=True) >= 0.0
            got = buf.read(np.uint32)
            assert got[15] == 5 and got[16] == 0x11111111
            for v in range(100, 110):
                g(v=v)
            g.launch([(1, 2, gpuexec.u64(32))], sync=True)
            got = buf.read(np.uint32)
            assert got[31] == 109 and got[32] == 0x11111111
            # A patch the daemon refuses comes back at the next wait.
            g.launch([(0, 0, gpuexec.u32(1))])
            with pytest.raises(gpuexec.Error, match="node 0"):
                s.synchronize()
            g.free()
            assert _on_ring(s)


def test_a_queued_launchs_refusal_comes_back_at_its_place(client, daemon):
    with _session(client) as s:
        fill = s.load_module(daemon.cubin).function("gx_fill_u32")
        buf = s.alloc(256)
        gone = s.alloc(256)
        gone.free()
        for i in range(10):
            fill.launch_async(1, 64, gone if i == 6 else buf, i, 64)
        with pytest.raises(gpuexec.Error) as e:
            s.synchronize()
        assert e.value.code == grpc.StatusCode.NOT_FOUND, e.value
        assert "gx_fill_u32" in e.value.message and "parameter 0" in e.value.message
        # Only the refused one: the launches after it ran.
        assert buf.read(np.uint32)[0] == 9
        s.synchronize()  # reported once: no error now
        assert _on_ring(s)


def test_a_fault_names_the_kernel_and_close_is_silent(client, daemon, recwarn):
    s = _session(client)
    fault = s.load_module(daemon.cubin).function("gx_fault")
    with pytest.raises(gpuexec.Error) as e:
        fault.launch(1, 1, gpuexec.u64(BAD_ADDRESS), sync=True)
    assert e.value.code == grpc.StatusCode.ABORTED, e.value
    assert "'gx_fault'" in e.value.message and "CUDA_ERROR_ILLEGAL_ADDRESS" in e.value.message
    s.close()
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]
    # The next session's commands ride a ring of their own.
    s2 = _session(client)
    with s2:
        fill = s2.load_module(daemon.cubin).function("gx_fill_u32")
        with s2.alloc(64) as buf:
            fill.launch(1, 16, buf, 5, 16, sync=True)
            assert buf.read(np.uint32)[0] == 5
        assert _on_ring(s2)


def test_a_queued_fault_is_raised_by_the_next_wait_naming_the_kernel(client, daemon):
    s = _session(client)
    fault = s.load_module(daemon.cubin).function("gx_fault")
    fault.launch_async(1, 1, gpuexec.u64(BAD_ADDRESS))
    with pytest.raises(gpuexec.Error) as e:
        s.synchronize()
    assert e.value.code in (grpc.StatusCode.ABORTED, grpc.StatusCode.NOT_FOUND), e.value
    assert "'gx_fault'" in e.value.message, e.value
    s.close()


def test_off_the_stream_carries_everything(ring_daemon, daemon, caplog, monkeypatch):
    caplog.set_level(logging.DEBUG, logger="gpuexec")
    for off in ({"command_ring": False}, {}):
        if not off:
            monkeypatch.setenv("GPUEXEC_COMMAND_RING", "0")
        with gpuexec.connect(ring_daemon, **off) as c, _session(c) as s:
            fill = s.load_module(daemon.cubin).function("gx_fill_u32")
            with s.alloc(64) as buf:
                fill.launch(1, 16, buf, 3, 16, sync=True)
                assert buf.read(np.uint32)[0] == 3
            assert s._commands._ring is None and s._commands._stream._call is not None
    assert any("command ring: off" in r.getMessage() for r in caplog.records)


def test_a_daemon_without_rings_leaves_the_stream(daemon, caplog):
    caplog.set_level(logging.DEBUG, logger="gpuexec")
    with gpuexec.connect(daemon.target) as c, _session(c) as s:
        fill = s.load_module(daemon.cubin).function("gx_fill_u32")
        with s.alloc(64) as buf:
            fill.launch(1, 16, buf, 4, 16, sync=True)
        assert s._commands._ring is None
    assert any("the daemon serves none to this client" in r.getMessage()
               for r in caplog.records)


def test_a_ring_the_daemon_closed_falls_back_to_the_stream(client, daemon):
    with _session(client) as s:
        fill = s.load_module(daemon.cubin).function("gx_fill_u32")
        buf = s.alloc(64)
        fill.launch(1, 16, buf, 1, 16, sync=True)
        ring = s._commands._ring
        assert ring is not None
        # The daemon ends the ring when its lifeline hangs up; its session
        # would close too (close_session_on_hangup), so end it by breaking
        # the framing instead: a record whose seq skips one.
        with ring._cond:
            _ring.HEAD.pack_into(ring._view, _ring.HEADER_BYTES + ring._tail % ring._sq_bytes,
                                 _ring.SYNCHRONIZE, 1, _ring.REPLY, 999, ring._seq + 5, 0, 0)
            ring._tail += _ring.SLOT
            ring._sq_tail_word.value = ring._tail
            ring._wake_daemon()
        deadline = time.monotonic() + 10
        while ring.check() is None:
            assert time.monotonic() < deadline, "the daemon did not close the ring"
            time.sleep(0.01)
        assert "command ring closed" in ring.broken.message
        # The next launch goes on the stream, and works.
        fill.launch(1, 16, buf, 2, 16, sync=True)
        assert buf.read(np.uint32)[0] == 2
        assert s._commands._ring is None and s._commands._stream._call is not None


def test_answers_posted_before_the_close_are_taken_first(client, daemon):
    """The daemon posts a ring's last answers and then says closed. A
    drain that read the completion tail just before that post and the
    state just after it still takes the answer, so that the waiting
    command gets it rather than the close."""
    with client.session() as s:
        fill = s.load_module(daemon.cubin).function("gx_fill_u32")
        buf = s.alloc(64)
        fill.launch(1, 16, buf, 1, 16, sync=True)
        ring = s._commands._ring
        assert ring is not None
        view, layout = ring._view, _ring.LAYOUT
        with ring._cond:
            # What the daemon writes for a waiting command's answer and then
            # for the ring's close, written here as it would write them (the
            # session's own commands are all answered: its thread posts
            # nothing more).
            command_id = ring._next_id + 1000
            ring._awaited.add(command_id)
            at = _ring.HEADER_BYTES + ring._sq_bytes + ring._cq_head % ring._cq_bytes
            _ring.COMPLETE.pack_into(view, at, _ring.SYNCHRONIZE, 1, 0, command_id, 99, 1234, 0,
                                     0, 0, 0)
            ring._cq_tail_word.value = ring._cq_head + _ring.SLOT
            why = b"session 1234 was closed: the test closed it"
            start = layout["header.close_message"][0]
            view[start:start + len(why)] = why
            struct.pack_into("<I", view, layout["header.close_message_bytes"][0], len(why))
            struct.pack_into("<i", view, layout["header.close_code"][0],
                             grpc.StatusCode.NOT_FOUND.value[0])
            ring._state.value = 1
            # The end of a drain whose look at the tail came before the post.
            ring._check_closed_locked(lifeline=False)
            answer = ring._results.pop(command_id, None)
            ring._awaited.discard(command_id)
        assert answer is not None, "the answer posted before the close was dropped"
        assert answer.code == 0 and answer.gpu_time_ns == 1234
        assert ring.broken is not None and ring.broken.code == grpc.StatusCode.NOT_FOUND
        assert "the test closed it" in ring.broken.message


_CHILD = """
import os, sys, time
import gpuexec
c = gpuexec.connect(sys.argv[1])
s = c.session()
f = s.load_module(sys.argv[2]).function("gx_fill_u32")
b = s.alloc(1 << 16)
f.launch(1, 64, b, 1, 64, sync=True)
print(s.token, flush=True)
while True:
    f.launch_async(1, 64, b, 2, 64)
"""


def test_a_killed_client_ends_its_session(client, daemon, ring_daemon):
    child = subprocess.Popen([sys.executable, "-c", _CHILD, ring_daemon, daemon.cubin],
                             stdout=subprocess.PIPE, env=dict(os.environ))
    try:
        token = child.stdout.readline().decode().strip()
        assert token, "the child opened no session"
        time.sleep(0.2)  # launches queued
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    request = pb.KeepAliveRequest(session=token)
    deadline = time.monotonic() + 10
    while True:
        try:
            client.stub.KeepAlive(request, timeout=5)
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.NOT_FOUND, e
            break
        assert time.monotonic() < deadline, "the killed client's session lives on"
        time.sleep(0.02)
    # The daemon serves others as before.
    with _session(client) as s:
        fill = s.load_module(daemon.cubin).function("gx_fill_u32")
        with s.alloc(64) as buf:
            fill.launch(1, 16, buf, 8, 16, sync=True)
            assert buf.read(np.uint32)[0] == 8
        assert _on_ring(s)


def test_threads_share_a_sessions_ring(client, daemon):
    import threading  # pylint: disable=import-outside-toplevel
    with _session(client) as s:
        fill = s.load_module(daemon.cubin).function("gx_fill_u32")
        bufs = [s.alloc(256) for _ in range(4)]
        errors = []

        def work(i):
            try:
                for v in range(200):
                    if v % 10 == 9:
                        fill.launch(1, 64, bufs[i], v, 64, sync=True)
                    else:
                        fill.launch_async(1, 64, bufs[i], v, 64)
            except Exception as e:  # pylint: disable=broad-except
                errors.append(e)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        s.synchronize()
        for b in bufs:
            assert b.read(np.uint32)[0] == 199
        assert _on_ring(s)


def test_records_hold_what_the_stream_would_name():
    # Past what a record holds: None, and the launch goes on the stream.
    fixed = bytes(_ring_records.LAUNCH_FIXED.size)
    assert _ring_records.launch_body(fixed, [b""] * (_ring_records.MAX_ARGS + 1), [], 0) is None
    assert _ring_records.launch_body(fixed, [], [b""], 32768) is None
    assert len(_ring_records.launch_body(fixed, [bytes(24)], [], 0)) == 64 + 24
    s = _ring_records.arg_slot(gpuexec.i8(-5), [], [0])
    assert struct.unpack("<HHIQQ", s) == (3, 0, 0, (1 << 64) - 5, 0)
    blob, at = [], [0]
    s = _ring_records.arg_slot(gpuexec.raw(b"abc"), blob, at)
    assert struct.unpack("<HHIQQ", s) == (17, 0, 3, 0, 0) and b"".join(blob) == b"abc" + bytes(5)
    assert at == [8]


def test_triton_launches_ride_the_ring(session, daemon, driver):
    launcher, function = _kernel(driver, daemon)
    n = 4096
    x, y, xb, yb, out = _inputs(session, n)
    for _ in range(3):
        launcher(4, 1, 1, 0, function, None, None, None, None, xb, yb, out, n, 1024)
    assert launcher.launch((4, 1, 1), function, (xb, yb, out, n, 1024), sync=True) >= 0.0
    assert [op[0] for op in launcher._ops.values()] == ["ring"]
    np.testing.assert_array_equal(out.get(), x + y)
    assert session._commands._ring is not None
