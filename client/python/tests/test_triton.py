"""gpuexec.triton on gx_add_scratch, a kernel shaped like Triton 3.x output
(x, y, out, n, then the global and profile scratch pointers), with the
metadata JSON Triton writes next to a cubin (tests/data/gx_add_scratch.json)."""

import json
import os
import shutil

import grpc
import numpy as np
import pytest

import gpuexec
from gpuexec import triton as gt

METADATA = os.path.join(os.path.dirname(__file__), "data", "gx_add_scratch.json")


def _metadata(**changes):
    with open(METADATA) as f:
        md = json.load(f)
    md.update(changes)
    return md


def _inputs(session, n):
    rng = np.random.default_rng(3)
    x = rng.standard_normal(n, dtype=np.float32)
    y = rng.standard_normal(n, dtype=np.float32)
    return x, y, session.upload(x), session.upload(y), session.alloc(4 * n)


def test_launch_with_null_scratch(session, daemon):
    kernel = gt.load(session, daemon.cubin, METADATA)
    assert kernel.name == "gx_add_scratch"
    assert kernel.num_args == 4 and kernel.hidden_params == 2
    assert kernel.block == (128, 1, 1)
    n = 100003
    x, y, xb, yb, out = _inputs(session, n)
    grid = ((n + 1023) // 1024,)
    # Sizes 0: both pointers are null. (Anything else that is not a live
    # allocation makes the kernel fault.)
    assert kernel.launch(grid, xb, yb, out, n, sync=True) > 0.0
    assert kernel.global_scratch is None and kernel.profile_scratch is None
    np.testing.assert_array_equal(out.read(np.float32), x + y)
    out.memset(0)
    kernel[grid](xb, yb, out, np.int32(n))  # Triton's own launch syntax
    np.testing.assert_array_equal(out.read(np.float32), x + y)


def test_scratch_buffers_and_clusters(session, daemon):
    md = _metadata(num_ctas=2, global_scratch_size=40, global_scratch_align=128,
                   profile_scratch_size=12, profile_scratch_align=8)
    kernel = gt.load(session, daemon.cubin, md)
    n = 5000
    x, y, xb, yb, out = _inputs(session, n)
    # Triton grid 3 with num_ctas 2: 6 CTAs in clusters of 2.
    assert kernel.cuda_grid(3) == (6, 1, 1)
    kernel.launch(3, xb, yb, out, n, sync=True)
    np.testing.assert_array_equal(out.read(np.float32), x + y)
    g, p = kernel.global_scratch, kernel.profile_scratch
    assert g.size == 256  # 40 bytes * 6 CTAs, aligned up to 128
    assert p.size == 72   # 12 * 6
    # The kernel wrote b + 1 to word b of each scratch buffer it was given.
    assert g.read(np.uint32, size=24).tolist() == [1, 2, 3, 4, 5, 6]
    assert p.read(np.uint32, size=24).tolist() == [1, 2, 3, 4, 5, 6]
    # Reused while large enough; replaced when the grid grows.
    kernel.launch(2, xb, yb, out, n)
    assert kernel.global_scratch is g
    kernel.launch((4, 2), xb, yb, out, n, sync=True)  # 16 CTAs
    assert kernel.global_scratch is not g and kernel.global_scratch.size == 640
    assert kernel.global_scratch.read(np.uint32, size=64).tolist() == list(range(1, 17))
    with pytest.raises(gpuexec.Error) as e:
        g.read()  # the old one was freed
    assert e.value.code == grpc.StatusCode.NOT_FOUND
    kernel.close()
    assert kernel.global_scratch is None


def test_argument_count_is_checked(session, daemon):
    kernel = gt.load(session, daemon.cubin, METADATA)
    x = session.alloc(16)
    with pytest.raises(gpuexec.Error) as e:
        kernel.launch(1, x, x, x)
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "takes 4 arguments" in e.value.message and "got 3" in e.value.message
    with pytest.raises(gpuexec.Error) as e:
        kernel.launch(1, x, x, x, 4, None, None)  # the scratch pointers are not the user's
    assert "got 6" in e.value.message
    assert kernel.launch(0, x, x, x, 4) is None  # an empty grid launches nothing


def test_metadata_next_to_the_cubin(session, daemon, tmp_path):
    cubin = tmp_path / "gx_add_scratch.cubin"
    shutil.copy(daemon.cubin, cubin)
    shutil.copy(METADATA, tmp_path / "gx_add_scratch.json")
    kernel = gt.load(session, str(cubin))
    with open(daemon.cubin, "rb") as f:
        image = f.read()
    assert gt.load(session, image, METADATA).function.params == kernel.function.params
    n = 1000
    x, y, xb, yb, out = _inputs(session, n)
    kernel.launch(1, xb, yb, out, n, sync=True)
    np.testing.assert_array_equal(out.read(np.float32), x + y)


def test_cooperative_and_dependent_launches(session, daemon):
    md = _metadata(launch_cooperative_grid=True, launch_pdl="True")
    kernel = gt.load(session, daemon.cubin, md)
    assert kernel.cooperative and kernel.pdl
    n = 4000
    x, y, xb, yb, out = _inputs(session, n)
    kernel.launch(4, xb, yb, out, n, sync=True)
    np.testing.assert_array_equal(out.read(np.float32), x + y)
    out.memset(0)
    kernel.launch_async(2, xb, yb, out, n)
    np.testing.assert_array_equal(out.read(np.float32), x + y)


def test_cluster_dims_of_triton_3_4(session, daemon):
    # cluster_dims, when its product is over 1, is the cluster shape.
    md = _metadata(num_ctas=1, cluster_dims=[2, 1, 1], global_scratch_size=4)
    kernel = gt.load(session, daemon.cubin, md)
    assert kernel.cluster == (2, 1, 1) and kernel.cuda_grid((3, 2)) == (6, 2, 1)
    n = 3000
    x, y, xb, yb, out = _inputs(session, n)
    kernel.launch((3, 2), xb, yb, out, n, sync=True)
    np.testing.assert_array_equal(out.read(np.float32), x + y)
    assert kernel.global_scratch.read(np.uint32, size=48).tolist() == list(range(1, 13))


def test_refused_metadata(session, daemon):
    for md, needle in [(_metadata(tensordesc_meta=[{"swizzle": 128}]), "'swizzle'"),
                       (_metadata(launch_cooperative_grid="yes"), "'launch_cooperative_grid'"),
                       (_metadata(global_scratch_align=1024), "'global_scratch_align'"),
                       ({"name": "gx_add_scratch"}, "'num_warps'")]:
        with pytest.raises(gpuexec.Error) as e:
            gt.load(session, daemon.cubin, md)
        assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert needle in e.value.message
    with pytest.raises(gpuexec.Error) as e:  # too few parameters for a Triton 3.x kernel
        gt.load(session, daemon.cubin, _metadata(name="gx_empty"))
    assert "scratch" in e.value.message


def test_a_descriptor_for_a_kernel_without_tensordesc_meta(session, daemon):
    kernel = gt.load(session, daemon.cubin, METADATA)
    x = session.alloc(4096)
    with pytest.raises(gpuexec.Error) as e:
        kernel.launch(1, gt.TensorDescriptor(x, [32, 32]), x, x, 4)
    assert "no tensordesc_meta" in e.value.message
