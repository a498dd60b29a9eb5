"""A pool of daemons on the loopback range, placed by the client: four
gpuexecd processes on 127.0.0.1 to 127.0.0.4 (one port), each on the test
double with a different amount of device memory, the fourth without a
usable device (it serves NOT_SERVING). Sessions go where their memory fits
and never to the daemon without a device; a daemon killed mid-way fails its
sessions with UNAVAILABLE naming it, and new sessions go to the others.
"""

import collections
import os
import socket
import tempfile

import grpc
import pytest

import gpuexec
from conftest import start_daemon, stop_daemon

MIB = 1 << 20


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def pool_daemons(daemon):
    """Four daemons: 256 MiB, 2 GiB and 4 GiB of device memory, and one
    whose driver finds no device. Yields their addresses and processes."""
    if not daemon.is_test_double:
        pytest.skip("the pool test runs on the test double")
    port = free_port()
    envs = [{"GXFAKE_MEMORY_BYTES": str(256 * MIB)}, {"GXFAKE_MEMORY_BYTES": str(2048 * MIB)},
            {"GXFAKE_MEMORY_BYTES": str(4096 * MIB)}, {"GXFAKE_FAIL_INIT": "1"}]
    tmp = tempfile.TemporaryDirectory(prefix="gpuexec-pool-")
    addresses, processes = [], []
    try:
        for i, env in enumerate(envs, start=1):
            address = f"127.0.0.{i}:{port}"
            process, _ = start_daemon(
                daemon.binary, [f"--driver={daemon.driver}", f"--listen={address}",
                                f"--advertise_address={address}"],
                os.path.join(tmp.name, f"d{i}.log"), env=env)
            addresses.append(address)
            processes.append(process)
        yield addresses, processes
    finally:
        for p in processes:
            if p.poll() is None:
                stop_daemon(p)
        tmp.cleanup()


def test_sessions_are_placed_where_they_fit_and_move_on_when_a_daemon_dies(pool_daemons):
    at, processes = pool_daemons
    with gpuexec.connect("pool://" + ",".join(at)) as pool:
        assert isinstance(pool, gpuexec.Pool)
        pool.choices = 4
        assert sorted(pool.daemons) == sorted(at)

        # 30 sessions: 10 large ones (300 MiB, used at once) and 20 small ones.
        sessions, held = [], []
        large_on, small_on = collections.Counter(), collections.Counter()
        for i in range(30):
            large = i % 3 == 0
            nbytes = 300 * MIB if large else 16 * MIB
            s = pool.session(memory_limit=nbytes)
            held.append(s.alloc(nbytes))
            (large_on if large else small_on)[s.daemon] += 1
            sessions.append(s)
        assert large_on[at[0]] == 0, "a 300 MiB session on the 256 MiB daemon"
        assert large_on[at[3]] + small_on[at[3]] == 0, "a session on the daemon without a device"
        assert large_on[at[2]] > large_on[at[1]], "the most free memory draws the large ones"

        # The whole pool's listing: each daemon names itself; the fourth has
        # no device.
        listed = pool.devices()
        assert [d.daemon for d in listed] == sorted(at)
        by_daemon = {d.daemon: d for d in listed}
        for i, address in enumerate(at):
            d = by_daemon[address]
            assert d.error is None, d.error
            assert len(d.devices) == (0 if i == 3 else 1)
            assert all(dev.daemon_address == address for dev in d.devices)

        # No device of compute capability 10.0: refused, saying why.
        with pytest.raises(gpuexec.Error) as e:
            pool.session(min_compute_capability=(10, 0))
        assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
        assert "3 below compute capability 10.0" in e.value.message

        # A session on a daemon that dies gets UNAVAILABLE naming it.
        processes[2].kill()
        processes[2].wait()
        on_dead = [s for s in sessions if s.daemon == at[2]]
        assert on_dead
        with pytest.raises(gpuexec.Error) as e:
            on_dead[0].alloc(MIB)
        assert e.value.code == grpc.StatusCode.UNAVAILABLE
        assert f"daemon {at[2]}" in e.value.message
        listed = {d.daemon: d for d in pool.devices()}
        assert listed[at[2]].error is not None
        assert listed[at[2]].error.code == grpc.StatusCode.UNAVAILABLE
        assert at[2] in listed[at[2]].error.message

        # New sessions go to the others.
        for _ in range(5):
            s = pool.session(memory_limit=16 * MIB)
            assert s.daemon not in (at[2], at[3])
            sessions.append(s)

        # Nothing fits 8 GiB: refused, saying why.
        with pytest.raises(gpuexec.Error) as e:
            pool.session(memory_limit=8192 * MIB)
        assert e.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "no device with 8589934592 bytes free" in e.value.message

        for s in sessions:
            if s.daemon != at[2]:
                s.close()


@pytest.mark.parametrize("target,message", [
    ("pool://", "is not HOST:PORT"),
    ("pool://a:1,b", "'b' is not HOST:PORT"),
    ("pool://a:0", "'a:0' is not HOST:PORT"),
    ("pool://" + "x" * 5000, "is not HOST:PORT"),
])
def test_malformed_pool_targets_are_refused(target, message):
    with pytest.raises(gpuexec.Error) as e:
        gpuexec.connect(target)
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert message in e.value.message
    assert len(e.value.message) < 400, "the target echoed whole"


def test_names_are_resolved_and_unknown_ones_refused():
    with pytest.raises(gpuexec.Error) as e:
        gpuexec.connect("pool://no-such-host.invalid:50051")
    assert e.value.code == grpc.StatusCode.UNAVAILABLE
    assert "cannot resolve" in e.value.message
    pool = gpuexec.Pool("pool://localhost:50051", choices=2)
    assert "127.0.0.1:50051" in pool.daemons
    pool.close()
    with pytest.raises(gpuexec.Error):
        gpuexec.Pool("pool://localhost:50051", choices=0)


def test_a_pool_of_silent_daemons_is_unavailable():
    port = free_port()  # nobody listens there
    with gpuexec.Pool(f"pool://127.0.0.1:{port},127.0.0.2:{port}", probe_timeout=0.2) as pool:
        with pytest.raises(gpuexec.Error) as e:
            pool.session()
        assert e.value.code == grpc.StatusCode.UNAVAILABLE
        assert "no daemon answered" in e.value.message
        listed = pool.devices()
        assert len(listed) == 2 and all(d.error is not None for d in listed)


def test_a_draining_daemon_is_passed_over_and_says_why(pool_daemons):
    """SIGUSR1 drains the 4 GiB daemon (the one large sessions prefer): the
    pool's new sessions go elsewhere and its listing says why; a daemon that
    is asked directly refuses with UNAVAILABLE naming the drain."""
    import signal
    import time

    at, processes = pool_daemons
    processes[2].send_signal(signal.SIGUSR1)
    with gpuexec.connect(at[2]) as direct:
        deadline = time.monotonic() + 10
        while not direct.devices()[0].daemon_draining and time.monotonic() < deadline:
            time.sleep(0.02)
        assert "(SIGUSR1)" in direct.devices()[0].daemon_draining
        with pytest.raises(gpuexec.Error) as refused:
            direct.session()
        assert refused.value.code == grpc.StatusCode.UNAVAILABLE
        assert "draining" in str(refused.value)
    with gpuexec.connect("pool://" + ",".join(at)) as pool:
        pool.choices = 4
        placed = collections.Counter(pool.session(memory_limit=300 * MIB).daemon
                                     for _ in range(6))
        assert placed[at[2]] == 0, "a session on the draining daemon"
        assert placed[at[1]] == 6
        only_draining = gpuexec.connect("pool://" + at[2])
        with only_draining, pytest.raises(gpuexec.Error) as none:
            only_draining.session()
        assert none.value.code == grpc.StatusCode.UNAVAILABLE
        assert "draining" in str(none.value)
