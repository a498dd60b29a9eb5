"""Launches with attributes and tensor map arguments on the daemon:
gx_tensormap_copy (a TMA box copy), gx_coop_count (a grid-wide barrier, so
a cooperative launch), gx_pdl_produce/gx_pdl_consume (a programmatic
dependent launch pair) and gx_cluster_rank (clusters over 8 blocks)."""

import grpc
import numpy as np
import pytest

import gpuexec

ROWS, COLS = 30, 40  # a float32 tensor: 160-byte rows (TMA strides are multiples of 16)
BOX = (16, 8)  # innermost first: 16 floats (64 bytes) by 8 rows


def _tensor(session):
    data = np.arange(ROWS * COLS, dtype=np.float32).reshape(ROWS, COLS) + 1
    return data, session.upload(data)


def _box(data, x, y, fill=0.0):
    """What the box at (x, y) (innermost first) reads from ``data``."""
    out = np.full((BOX[1], BOX[0]), fill, np.float32)
    for j in range(BOX[1]):
        for i in range(BOX[0]):
            if 0 <= y + j < data.shape[0] and 0 <= x + i < data.shape[1]:
                out[j, i] = data[y + j, x + i]
    return out


def _copy(kernels, tensor_map, out, x, y):
    # x is a multiple of 4 floats: TMA starts a box's inner dimension on a
    # 16-byte boundary (on the H200 any other x faults the kernel with an
    # illegal instruction).
    count = BOX[0] * BOX[1]
    kernels.function("gx_tensormap_copy").launch(1, 128, tensor_map, out, x, y,
                                                 gpuexec.u32(count), sync=True)
    return out.read_array(np.float32, (BOX[1], BOX[0]))


def test_tensor_map_copy(session, kernels):
    data, buf = _tensor(session)
    out = session.alloc(4 * BOX[0] * BOX[1])
    tensor_map = gpuexec.TensorMap(buf, "float32", [COLS, ROWS], [4 * COLS], BOX)
    for x, y in [(0, 0), (8, 4), (24, 22), (32, 28), (-4, -2)]:
        np.testing.assert_array_equal(_copy(kernels, tensor_map, out, x, y), _box(data, x, y),
                                      err_msg=f"box at ({x}, {y})")


def test_tensor_map_spellings_offset_and_nan_fill(session, kernels):
    data, buf = _tensor(session)
    out = session.alloc(4 * BOX[0] * BOX[1])
    # Rows 4 on, as numpy gives the shape and strides (reversed: innermost first).
    view = data[4:]
    tensor_map = gpuexec.TensorMap(buf, np.float32, view.shape[::-1], view.strides[::-1],
                                   BOX, [1, 1], offset=4 * 4 * COLS, oob_fill="nan",
                                   l2_promotion="128b")
    np.testing.assert_array_equal(_copy(kernels, tensor_map, out, 28, 20),
                                  _box(view, 28, 20, fill=np.nan))


def test_tensor_map_in_a_queued_launch(session, kernels):
    data, buf = _tensor(session)
    outs = [session.alloc(4 * BOX[0] * BOX[1]) for _ in range(3)]
    tensor_map = gpuexec.TensorMap(buf, "fp32", [COLS, ROWS], [4 * COLS], BOX)
    copy = kernels.function("gx_tensormap_copy")
    for i, out in enumerate(outs):
        copy.launch_async(1, 128, tensor_map, out, 8 * i, 3 * i, gpuexec.u32(BOX[0] * BOX[1]))
    for i, out in enumerate(outs):
        np.testing.assert_array_equal(out.read_array(np.float32, (BOX[1], BOX[0])),
                                      _box(data, 8 * i, 3 * i))


@pytest.mark.parametrize("change", [
    {"global_dims": [COLS, ROWS + 10]},  # past the buffer's end
    {"offset": 8},                       # not 16-byte aligned
    {"global_strides": [4 * COLS + 4]},  # not a multiple of 16
    {"box_dims": [16, 512]},             # over 256
])
def test_bad_tensor_maps_are_refused_by_the_daemon(session, kernels, change):
    _, buf = _tensor(session)
    out = session.alloc(4 * BOX[0] * BOX[1])
    args = {"global_dims": [COLS, ROWS], "global_strides": [4 * COLS], "box_dims": BOX}
    args.update(change)
    offset = args.pop("offset", 0)
    tensor_map = gpuexec.TensorMap(buf, "float32", offset=offset, **args)
    with pytest.raises(gpuexec.Error) as e:
        _copy(kernels, tensor_map, out, 0, 0)
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT, e.value


def test_a_tensor_map_where_a_pointer_goes_is_refused(session, kernels):
    _, buf = _tensor(session)
    tensor_map = gpuexec.TensorMap(buf, "float32", [COLS, ROWS], [4 * COLS], BOX)
    with pytest.raises(gpuexec.Error) as e:
        kernels.function("gx_fill_u32").launch(1, 32, tensor_map, 0, 0, sync=True)
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize("grid", [1, 16, (4, 2, 2)])
def test_cooperative_launch(session, kernels, grid):
    counter, out = session.alloc(4), session.alloc(4)
    counter.memset(0)
    out.memset(0xFF)
    kernels.function("gx_coop_count").launch(grid, 64, counter, out, cooperative=True,
                                             sync=True)
    blocks = int(np.prod(grid))
    assert out.read(np.uint32).tolist() == [blocks]
    assert counter.read(np.uint32).tolist() == [blocks]


def test_a_cooperative_grid_larger_than_the_device_is_refused(session, kernels):
    counter, out = session.alloc(4), session.alloc(4)
    counter.memset(0)
    with pytest.raises(gpuexec.Error) as e:
        kernels.function("gx_coop_count").launch(1 << 20, 1024, counter, out, cooperative=True,
                                                 sync=True)
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT, e.value


@pytest.mark.parametrize("queued", [False, True])
def test_programmatic_dependent_launch(session, kernels, queued):
    n = 100003
    data, out = session.alloc(4 * n), session.alloc(4 * n)
    data.memset(0)
    out.memset(0)
    produce, consume = kernels.function("gx_pdl_produce"), kernels.function("gx_pdl_consume")
    grid = (n + 255) // 256
    for _ in range(3):
        if queued:
            produce.launch_async(grid, 256, data, gpuexec.u32(n))
            consume.launch_async(grid, 256, data, out, gpuexec.u32(n), pdl=True)
        else:
            produce.launch(grid, 256, data, gpuexec.u32(n))
            consume.launch(grid, 256, data, out, gpuexec.u32(n), pdl=True)
    session.synchronize()
    expected = 2 * (np.arange(n, dtype=np.uint32) + 1)
    np.testing.assert_array_equal(out.read(np.uint32), expected)


def test_cluster_over_8_blocks_needs_the_opt_in(session, kernels, daemon):
    rank = kernels.function("gx_cluster_rank")
    out = session.alloc(4 * 32)
    with pytest.raises(gpuexec.Error) as e:
        rank.launch(32, 32, out, cluster=16, sync=True)
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "non_portable_cluster" in e.value.message
    try:
        rank.launch(32, 32, out, cluster=16, non_portable_cluster=True, cluster_policy="spread",
                    sync=True)
    except gpuexec.Error as e:
        if daemon.is_test_double:
            raise
        pytest.skip(f"the device refuses a 16-block cluster: {e}")
    assert out.read(np.uint32).tolist() == [b % 16 for b in range(32)]


@pytest.mark.parametrize("policy", ["spread", "load_balancing", "default", None])
def test_cluster_policies(session, kernels, policy):
    out = session.alloc(4 * 16)
    kernels.function("gx_cluster_rank").launch(16, 32, out, cluster=(4, 1, 1),
                                               cluster_policy=policy, sync=True)
    assert out.read(np.uint32).tolist() == [b % 4 for b in range(16)]


def test_a_cluster_policy_needs_a_cluster(session, kernels):
    out = session.alloc(4 * 16)
    with pytest.raises(gpuexec.Error) as e:
        kernels.function("gx_cluster_rank").launch(16, 32, out, cluster_policy="spread",
                                                   sync=True)
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "cluster" in e.value.message
