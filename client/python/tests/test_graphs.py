"""Graphs from Python: `with session.graph() as g:` records a pipeline of
three kernels and a copy, replayed as recorded, with named arguments and
with (node, argument, value) patches, each checked against numpy; and what
is refused, with the session left usable."""

import grpc
import numpy as np
import pytest

import gpuexec

N = 1000
GRID, BLOCK = (N + 255) // 256, 256


@pytest.fixture
def saxpy(kernels):
    return kernels.function("gx_saxpy")


def _record(session, saxpy, x1, x2, y, z):
    """z = a * x + x2 + x2, with a and x named."""
    with session.graph() as g:
        y.memset(0)
        saxpy.launch_async(GRID, BLOCK, g.arg("a", 2.0), g.arg("x", x1), y, gpuexec.u64(N))
        saxpy.launch_async(GRID, BLOCK, 1.0, x2, y, gpuexec.u64(N))
        saxpy.launch_async(GRID, BLOCK, 1.0, x2, y, gpuexec.u64(N))
        z.copy_from(y)
    return g


def test_a_pipeline_replays_with_named_and_indexed_patches(session, saxpy):
    a1, a2, a3 = (session.asarray(np.random.default_rng(s).standard_normal(N)
                                  .astype(np.float32)) for s in (1, 2, 3))
    h1, h2, h3 = a1.get(), a2.get(), a3.get()
    y = session.zeros(N)
    z = session.zeros(N)
    g = _record(session, saxpy, a1, a2, y, z)
    assert g.nodes == 5
    assert g.instantiate_time > 0
    np.testing.assert_array_equal(z.get(), np.zeros(N, np.float32), err_msg="recording ran")

    g()
    session.synchronize()
    np.testing.assert_allclose(z.get(), 2 * h1 + 2 * h2, rtol=1e-5, atol=1e-5)

    # Named: a and x, for this replay and the ones after it.
    g(a=3.0, x=a3)
    session.synchronize()
    np.testing.assert_allclose(z.get(), 3 * h3 + 2 * h2, rtol=1e-5, atol=1e-5)
    seconds = g.launch(sync=True)
    assert seconds >= 0
    np.testing.assert_allclose(z.get(), 3 * h3 + 2 * h2, rtol=1e-5, atol=1e-5)

    # By index: node 3 (the second saxpy after the memset) reads a1 instead.
    g.launch([(3, 1, a1)], sync=True)
    np.testing.assert_allclose(z.get(), 3 * h3 + h2 + h1, rtol=1e-5, atol=1e-5)
    g.free()
    y.free()  # a freed graph no longer holds its buffers


def test_what_a_recording_and_a_replay_refuse(session, saxpy, client):
    x, y = session.zeros(N), session.zeros(N)
    with pytest.raises(gpuexec.Error) as e:
        with session.graph() as g:
            saxpy.launch_async(GRID, BLOCK, 1.0, x, y, gpuexec.u64(N))
            y.set(np.ones(N, np.float32))  # a host transfer inside a recording
    assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert "graph" in e.value.message
    # The session records no more, and runs work again.
    saxpy.launch(GRID, BLOCK, 1.0, x, y, gpuexec.u64(N), sync=True)

    g = _record(session, saxpy, x, x, y, y)
    with pytest.raises(gpuexec.Error, match="no argument named 'b'"):
        g(b=1.0)
    with pytest.raises(gpuexec.Error, match="node from 0 to 4"):
        g.launch([(9, 0, gpuexec.f32(1.0))], sync=True)
    # A replay queued without waiting: its refusal comes at the next wait.
    g.launch([(0, 0, gpuexec.f32(1.0))])
    with pytest.raises(gpuexec.Error, match="only kernel nodes take patches"):
        session.synchronize()
    with client.session() as other:
        theirs = other.zeros(N)
        with pytest.raises(gpuexec.Error, match="belongs to session"):
            g(x=theirs)
    with pytest.raises(gpuexec.Error, match="Python identifier"):
        g.arg("sync", 1)
    with pytest.raises(gpuexec.Error, match="no graph"):
        g.free()
        g()


def test_a_refused_recorded_launch_fails_the_block_and_no_graph_is_kept(session, saxpy):
    x, y = session.zeros(N), session.zeros(N)
    with pytest.raises(gpuexec.Error) as e:
        with session.graph() as g:
            saxpy.launch_async(GRID, BLOCK, 1.0, x, y, gpuexec.u64(N))
            saxpy.launch_async(GRID, BLOCK, 1.0, x, y, gpuexec.u64(N), pdl=True)
    assert "programmatic dependent launch cannot be recorded" in e.value.message
    with pytest.raises(gpuexec.Error, match="has no graph"):
        g()
    # Nodes by index past the end are the client's to refuse.
    g2 = _record(session, saxpy, x, x, y, y)
    with pytest.raises(gpuexec.Error, match="node from 0 to 4"):
        g2.launch([(1 << 40, 0, 1.0)])
    saxpy.launch(GRID, BLOCK, 1.0, x, y, gpuexec.u64(N), sync=True)


def test_a_placeholder_outside_its_recording_is_refused(session, saxpy):
    x, y = session.zeros(N), session.zeros(N)
    g = session.graph()
    with pytest.raises(gpuexec.Error, match="outside the recording"):
        saxpy.launch_async(GRID, BLOCK, g.arg("a", 1.0), x, y, gpuexec.u64(N))
