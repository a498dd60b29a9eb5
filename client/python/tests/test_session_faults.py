"""What a session says after its kernel faults: the first error names the
kernel and the CUDA error, whether the launch waited (the ABORTED) or was
queued (the ABORTED, or the daemon's NOT_FOUND for the session it closed);
close() of a session the daemon ended is silent; later calls lead with the
daemon's cause; an exception inside ``with`` goes on unchanged.

The faults run on a daemon of this module's own, without a strike limit
(three resets by one peer would otherwise refuse the other tests' launches).
"""

import os
import re
import sys
import tempfile
import time
import warnings

import grpc
import pytest

import gpuexec
from conftest import start_daemon, stop_daemon
from gpuexec._errors import SessionFate

# gx_fault writes to this device address, which no allocation holds.
BAD_ADDRESS = 16


@pytest.fixture(scope="module")
def fault_daemon(daemon):
    tmp = tempfile.TemporaryDirectory(prefix="gpuexec-faults-")
    socket = os.path.join(tmp.name, "d.sock")
    process, _ = start_daemon(daemon.binary, [f"--driver={daemon.driver}", "--listen=",
                                              f"--unix_socket={socket}", "--strike_limit=0"],
                              os.path.join(tmp.name, "gpuexecd.log"))
    yield f"unix:{socket}"
    stop_daemon(process)
    tmp.cleanup()


@pytest.fixture
def fclient(fault_daemon):
    with gpuexec.connect(fault_daemon) as c:
        yield c


def _session(client):
    """A new session on device 0, once the device is back from the reset an
    earlier test caused."""
    deadline = time.monotonic() + 20
    while True:
        try:
            return client.session(device=0)
        except gpuexec.Error as e:
            if e.code != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                raise
            time.sleep(0.02)


# The first word of a queued launch's fault: its ABORTED, or the daemon's
# NOT_FOUND for the session it closed, when that call reached it later.
QUEUED = (grpc.StatusCode.ABORTED, grpc.StatusCode.NOT_FOUND)


def _assert_names_the_fault(error, kernel="'gx_fault'", codes=(grpc.StatusCode.ABORTED,)):
    assert error.code in codes, error
    assert kernel in error.message, error
    assert "CUDA_ERROR_ILLEGAL_ADDRESS" in error.message, error
    assert "illegal memory access" in error.message, error


# The daemon's own words for a session closed by gx_fault's reset.
FAULT_CAUSE = ("its kernel 'gx_fault' made an illegal memory access (CUDA_ERROR_ILLEGAL_ADDRESS) "
               "and reset device 0 at ")


def _assert_leads_with_the_fault(error, session):
    """``error`` leads with the daemon's cause, which names the kernel and the
    CUDA error."""
    short = session.token[:8]
    assert error.code == grpc.StatusCode.NOT_FOUND, error
    assert error.message.startswith(
        f"session {short} was closed by its earlier failure: {FAULT_CAUSE}"), error
    assert error.message.endswith(": open a new session"), error


def _reset_time(error):
    """The time of day of the reset ``error`` names ("17:00:23.882 UTC")."""
    m = re.search(r"reset device \d+ at (\d\d:\d\d:\d\d\.\d+ UTC)", error.message)
    assert m is not None, error
    return m.group(1)


def _first_not_found(call):
    """The first NOT_FOUND ``call`` raises: before it, the failures of
    launches queued behind the fault (ABORTED: they ran on a reset device)."""
    for _ in range(10):
        with pytest.raises(gpuexec.Error) as e:
            call()
        if e.value.code != grpc.StatusCode.ABORTED:
            return e.value
    pytest.fail("no NOT_FOUND after 10 calls")


def _wait_for_reset(client, resets_before):
    deadline = time.monotonic() + 20
    while client.devices()[0].resets == resets_before:
        assert time.monotonic() < deadline, "the fault did not reset device 0"
        time.sleep(0.01)


def test_a_fault_inside_with_raises_the_aborted_naming_the_kernel(fclient, daemon):
    with pytest.raises(gpuexec.Error) as e:
        with _session(fclient) as s:
            fault = s.load_module(daemon.cubin).function("gx_fault")
            fault.launch(1, 1, gpuexec.u64(BAD_ADDRESS), sync=True)
    _assert_names_the_fault(e.value)
    # close() found the session ended by the daemon: nothing noted on the error.
    assert not getattr(e.value, "__notes__", None)
    assert s.closed
    s.close()  # again: idempotent


def test_close_of_a_session_the_daemon_ended_is_silent(fclient, daemon):
    s = _session(fclient)
    fault = s.load_module(daemon.cubin).function("gx_fault")
    with pytest.raises(gpuexec.Error) as e:
        fault.launch(1, 1, gpuexec.u64(BAD_ADDRESS))
        s.synchronize()
    _assert_names_the_fault(e.value, codes=QUEUED)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the cause was raised already: no warning either
        s.close()
    assert s.closed


def test_later_calls_lead_with_the_first_fault(fclient, daemon):
    s = _session(fclient)
    fault = s.load_module(daemon.cubin).function("gx_fault")
    buf = s.alloc(64)
    with pytest.raises(gpuexec.Error) as first:
        fault.launch(1, 1, gpuexec.u64(BAD_ADDRESS), sync=True)
    _assert_names_the_fault(first.value)
    for call in (s.keep_alive, s.synchronize, buf.read, lambda: s.alloc(64),
                 lambda: buf.write(b"x" * 8), lambda: fault.launch(1, 1, 0),
                 lambda: s.load_module(daemon.cubin)):
        with pytest.raises(gpuexec.Error) as later:
            call()
        _assert_leads_with_the_fault(later.value, s)
        # The same reset as the ABORTED's.
        assert f"device 0 was reset at {_reset_time(later.value)}" in first.value.message
    s.close()


def test_the_first_error_after_queued_launches_names_the_kernel(fclient, daemon):
    s = _session(fclient)
    fault = s.load_module(daemon.cubin).function("gx_fault")
    fill = s.load_module(daemon.cubin).function("gx_fill_u32")
    buf = s.alloc(64)
    resets = fclient.devices()[0].resets
    fault.launch_async(1, 1, gpuexec.u64(BAD_ADDRESS))
    fill.launch_async(1, 16, buf, 7, 16)
    # However the daemon learns it (the read on the faulted device: ABORTED,
    # or the session it closed since: NOT_FOUND), the first error names the
    # kernel and the CUDA error. (Which kernel the daemon blames is the
    # driver's word: CUDA reports a fault at the next call, which may be
    # gx_fill_u32's.)
    with pytest.raises(gpuexec.Error) as first:
        buf.read()
    _assert_names_the_fault(first.value, kernel="kernel 'gx_", codes=QUEUED)
    _wait_for_reset(fclient, resets)
    later = _first_not_found(s.synchronize)
    assert later.code == grpc.StatusCode.NOT_FOUND, later
    # Both launches may still be in flight when the fault is found; the
    # driver does not say which of them faulted, and the daemon says so.
    head = f"session {s.token[:8]} was closed by its earlier failure: "
    assert (later.message.startswith(head + "its kernel 'gx_")
            or later.message.startswith(head + "one of its 2 kernels in flight")), later
    assert "CUDA_ERROR_ILLEGAL_ADDRESS" in later.message and "open a new" in later.message
    s.close()


def test_a_queued_fault_found_after_the_session_closed_is_the_daemons_word(fclient, daemon):
    """Nobody waits for the launch; the next call reaches the daemon after it
    closed the session: the daemon's NOT_FOUND, raised as it came, names the
    kernel and the CUDA error; later calls lead with its cause."""
    s = _session(fclient)
    fault = s.load_module(daemon.cubin).function("gx_fault")
    resets = fclient.devices()[0].resets
    fault.launch_async(1, 1, gpuexec.u64(BAD_ADDRESS))
    _wait_for_reset(fclient, resets)
    with pytest.raises(gpuexec.Error) as first:
        s.keep_alive()
    _assert_names_the_fault(first.value, codes=(grpc.StatusCode.NOT_FOUND,))
    assert first.value.message.startswith(f"session {s.token[:8]} was closed: {FAULT_CAUSE}")
    assert first.value.message.endswith(": open a new session"), first.value
    with pytest.raises(gpuexec.Error) as later:
        s.keep_alive()
    _assert_leads_with_the_fault(later.value, s)
    s.close()


def test_close_warns_of_a_queued_fault_nobody_was_told_of(fclient, daemon):
    s = _session(fclient)
    fault = s.load_module(daemon.cubin).function("gx_fault")
    resets = fclient.devices()[0].resets
    with pytest.warns(RuntimeWarning) as caught:
        with s:
            fault.launch_async(1, 1, gpuexec.u64(BAD_ADDRESS))
            _wait_for_reset(fclient, resets)
    [warning] = caught
    text = str(warning.message)
    assert text.startswith(f"gpuexec: session {s.token[:8]} was closed by the daemon before "
                           f"close(): {FAULT_CAUSE}"), text


def test_an_exception_inside_with_goes_on_unchanged(daemon, tmp_path):
    """close() fails (the daemon is gone): the block's own exception is
    raised, the close's failure at most a note on it."""
    socket = tmp_path / "d.sock"
    process, _ = start_daemon(daemon.binary, [f"--driver={daemon.driver}", "--listen=",
                                              f"--unix_socket={socket}"],
                              tmp_path / "gpuexecd.log")
    try:
        client = gpuexec.connect(f"unix:{socket}")
        mine = ValueError("the caller's own")
        with pytest.raises(ValueError) as e:
            with client.session() as s:
                stop_daemon(process)
                raise mine
        assert e.value is mine
        assert e.value.__context__ is None
        if sys.version_info >= (3, 11):
            [note] = e.value.__notes__
            assert note.startswith(f"gpuexec: closing session {s.token[:8]} then failed too: "
                                   "UNAVAILABLE: "), note
        client.close()
    finally:
        if process.poll() is None:
            stop_daemon(process)


# ------------------------------------------------ SessionFate alone, no daemon

TOKEN = "85f4886a" + "0" * 56
CAUSE = ("its kernel 'gx_fault' made an illegal memory access (CUDA_ERROR_ILLEGAL_ADDRESS) and "
         "reset device 0 at 17:00:23.882 UTC (strike 1 for peer unix:uid=0 within 600 s): open a "
         "new session")
CLOSED = gpuexec.Error(grpc.StatusCode.NOT_FOUND, f"session 85f4886a was closed: {CAUSE}")


def test_fate_raises_the_daemons_word_first_then_leads_with_its_cause():
    fate = SessionFate(TOKEN)
    assert fate.failed(CLOSED) is CLOSED
    later = fate.failed(CLOSED)
    assert later.code == grpc.StatusCode.NOT_FOUND
    assert later.message == f"session 85f4886a was closed by its earlier failure: {CAUSE}"
    assert fate.untold(CLOSED) is None  # told already


def test_fate_leads_with_the_cause_after_the_aborted_of_the_same_reset():
    fate = SessionFate(TOKEN)
    other = gpuexec.Error(grpc.StatusCode.ABORTED, "device 0 was reset at 16:59:00.000 UTC: x")
    mine = gpuexec.Error(grpc.StatusCode.ABORTED,
                         "kernel 'gx_fault' of session 85f4886a made an illegal memory access "
                         "(CUDA_ERROR_ILLEGAL_ADDRESS); device 0 was reset at 17:00:23.882 UTC. "
                         "The session was closed: open a new session")
    # Another reset's ABORTED: the NOT_FOUND is the first word of this one.
    assert fate.failed(other) is other
    assert fate.untold(CLOSED) == CAUSE
    fate = SessionFate(TOKEN)
    assert fate.failed(mine) is mine
    later = fate.failed(CLOSED)
    assert later.message == f"session 85f4886a was closed by its earlier failure: {CAUSE}"
    assert fate.untold(CLOSED) is None


def test_fate_leaves_other_errors_alone():
    fate = SessionFate(TOKEN)
    for e in (gpuexec.Error(grpc.StatusCode.NOT_FOUND, "session 85f4886a does not exist (never "
                            "opened, closed, or its lease lapsed)"),
              gpuexec.Error(grpc.StatusCode.NOT_FOUND, "session 85f4886a was closed: its lease "
                            "of 1000 ms lapsed"),
              gpuexec.Error(grpc.StatusCode.NOT_FOUND, f"session 11111111 was closed: {CAUSE}"),
              gpuexec.Error(grpc.StatusCode.UNAVAILABLE, "daemon x: gone")):
        assert fate.failed(e) is e
        assert fate.untold(e) is None
    assert not fate.told
