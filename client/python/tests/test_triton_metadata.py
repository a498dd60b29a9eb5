"""gpuexec.triton's reading of Triton metadata (docs/triton.md) on the files
the C++ loader is tested on (tests/data/triton/, with expected.json), the
launches and descriptor expansions it makes, and what it refuses; no daemon
needed (a Function that records its launches stands in)."""

import json
import os

import grpc
import pytest

import gpuexec
from gpuexec import triton as gt
from gpuexec.v1 import gpuexec_pb2 as pb

_HERE = os.path.dirname(os.path.abspath(__file__))


def _data_dir():
    """tests/data/triton/ of the source tree, or the copy a GPU bundle
    carries beside these tests (data/triton/)."""
    for d in (os.environ.get("GPUEXEC_TEST_TRITON_DATA"),
              os.path.join(_HERE, "..", "..", "..", "tests", "data", "triton"),
              os.path.join(_HERE, "data", "triton")):
        if d and os.path.exists(os.path.join(d, "expected.json")):
            return d
    raise AssertionError("no tests/data/triton/expected.json (set GPUEXEC_TEST_TRITON_DATA)")


DATA = _data_dir()
with open(os.path.join(DATA, "expected.json"), encoding="utf-8") as _f:
    EXPECTED = json.load(_f)


def _path(name):
    return os.path.join(DATA, name)


def _reading(md):
    """A Metadata in expected.json's terms."""
    def scratch(s):
        return None if s is None else {"size": s.size, "align": s.align}
    return {
        "name": md.name, "num_warps": md.num_warps, "warp_size": md.warp_size,
        "num_ctas": md.num_ctas, "cluster": list(md.cluster), "shared": md.shared,
        "launch_cooperative_grid": md.launch_cooperative_grid, "launch_pdl": md.launch_pdl,
        "global_scratch": scratch(md.global_scratch),
        "profile_scratch": scratch(md.profile_scratch),
        "tensordesc_meta": [{"swizzle": d.swizzle, "elem_size": d.elem_size,
                             "elem_type": d.elem_type, "data_type": d.data_type,
                             "driver_data_type": d.driver_data_type,
                             "block_size": list(d.block_size)} for d in md.tensordesc_meta],
    }


@pytest.mark.parametrize("name", sorted(EXPECTED["metadata"]))
def test_metadata_reading(name):
    assert _reading(gt.read_metadata(_path(name))) == EXPECTED["metadata"][name]


@pytest.mark.parametrize("name", sorted(EXPECTED["metadata"]))
def test_metadata_from_text_bytes_and_dict(name):
    with open(_path(name), encoding="utf-8") as f:
        text = f.read()
    for source in (text, text.encode(), json.loads(text)):
        assert _reading(gt.read_metadata(source)) == EXPECTED["metadata"][name]


def _launch_in_expected_terms(config, grid):
    return {
        "grid": list(grid), "cuda_grid": list(config.grid), "block": list(config.block),
        "cluster": None if config.cluster is None else list(config.cluster),
        "cluster_scheduling_policy": (config.cluster_policy or "default").upper(),
        "non_portable_cluster": config.non_portable_cluster,
        "shared_memory_bytes": config.shared, "cooperative": config.cooperative,
        "programmatic_dependent_launch": config.pdl,
        "scratch": [{"what": w, "bytes": b} for w, b in config.scratch],
    }


@pytest.mark.parametrize("name", sorted(EXPECTED["launch"]))
def test_launch(name):
    want = EXPECTED["launch"][name]
    config = gt.read_metadata(_path(name)).launch_config(want["grid"])
    assert _launch_in_expected_terms(config, want["grid"]) == want


class _Session:
    closed = False

    def __init__(self):
        self.allocs = []

    def alloc(self, nbytes):
        buf = gpuexec.Buffer(self, 0x1000 + len(self.allocs), nbytes)
        buf.free = lambda: None
        self.allocs.append(buf)
        return buf


class _Function:
    """A loaded kernel's stand-in with ``params`` parameters: keeps each
    launch's arguments."""

    def __init__(self, params):
        self.params = [gpuexec.Param(8 * i, 8) for i in range(params)]
        self.session = _Session()
        self.launches = []

    def launch(self, grid, block, *args, **kwargs):
        self.launches.append((grid, block, args, kwargs))
        return 0.5 if kwargs.get("sync") else None

    def launch_async(self, grid, block, *args, **kwargs):
        self.launches.append((grid, block, args, kwargs))


def _buffer(nbytes=1 << 24, dtype="float16"):
    return gpuexec.Buffer(None, 0xBEEF, nbytes, dtype=dtype)


def _descriptors(name):
    out = []
    for d in EXPECTED["descriptors"][name]:
        spec = d["descriptor"]
        out.append(gt.TensorDescriptor(_buffer(), spec["shape"], spec["strides"],
                                       offset=spec["byte_offset"], padding=spec["padding"]))
    return out


def _tensor_map_in_expected_terms(tensor_map):
    p = tensor_map._as_kernel_arg().to_proto().tensor_map
    T = pb.TensorMapArg
    return {
        "data_type": T.DataType.Name(p.data_type), "global_dims": list(p.global_dims),
        "global_strides": list(p.global_strides), "box_dims": list(p.box_dims),
        "element_strides": list(p.element_strides),
        "interleave": T.Interleave.Name(p.interleave), "swizzle": T.Swizzle.Name(p.swizzle),
        "l2_promotion": T.L2Promotion.Name(p.l2_promotion),
        "oob_fill": T.OobFill.Name(p.oob_fill),
    }


def _check_params(params, want, byte_offset):
    rank = len(want["shape_i32"])
    assert len(params) == 1 + 2 * rank
    tensor_map = params[0]
    assert isinstance(tensor_map, gpuexec.TensorMap)
    assert _tensor_map_in_expected_terms(tensor_map) == want["tensor_map"]
    p = tensor_map._as_kernel_arg().to_proto().tensor_map
    assert (getattr(p, "global").buffer, getattr(p, "global").offset) == (0xBEEF, byte_offset)
    assert [(a.kind, a.value) for a in params[1:1 + rank]] == [("i32", v)
                                                              for v in want["shape_i32"]]
    assert [(a.kind, a.value) for a in params[1 + rank:]] == [("i64", v)
                                                             for v in want["strides_i64"]]


@pytest.mark.parametrize("name", sorted(EXPECTED["descriptors"]))
def test_descriptor_expansion(name):
    md = gt.read_metadata(_path(name))
    wants = EXPECTED["descriptors"][name]
    descs = _descriptors(name)
    for n, (desc, want) in enumerate(zip(descs, wants)):
        _check_params(desc.kernel_params(md.tensordesc_meta[n], n), want,
                      want["descriptor"]["byte_offset"])
    # In a launch: the n-th descriptor with the n-th entry, among the others.
    mixed = [_buffer(), descs[0], 7, descs[1], None]
    out = md.kernel_args(mixed)
    assert out[0] is mixed[0] and out[1 + 5] == 7 and out[-1] is None
    _check_params(out[1:6], wants[0], wants[0]["descriptor"]["byte_offset"])
    _check_params(out[7:12], wants[1], wants[1]["descriptor"]["byte_offset"])


def test_descriptors_through_a_kernel_launch():
    md = gt.read_metadata(_path("sm90_3_5.json"))
    # The kernel's own (say) a_desc, b_desc, c_ptr, M: 2 x (1 + 2 + 2) + 2,
    # then the two scratch pointers.
    function = _Function(2 * 5 + 2 + 2)
    kernel = gt.Kernel(function, md)
    assert kernel.num_args == 4
    a, b = _descriptors("sm90_3_5.json")
    out = _buffer()
    assert kernel.launch(132, a, b, out, 1000, sync=True) == 0.5
    grid, block, args, kwargs = function.launches[-1]
    assert (grid, block) == ((132, 1, 1), (128, 1, 1))
    assert len(args) == 14 and args[10] is out and args[11] == 1000
    assert args[12:] == (None, None)  # the scratch pointers, size 0
    assert kwargs == {"shared": 32768, "cluster": None, "sync": True, "cooperative": False,
                      "pdl": False, "non_portable_cluster": False, "cluster_policy": None}
    wants = EXPECTED["descriptors"]["sm90_3_5.json"]
    _check_params(args[0:5], wants[0], 0)
    _check_params(args[5:10], wants[1], 4096)
    with pytest.raises(gpuexec.Error) as e:
        kernel.launch(132, a, b, out)
    assert "takes 4 arguments" in e.value.message and "got 3" in e.value.message
    assert "2 tensor descriptors counted once" in e.value.message
    with pytest.raises(gpuexec.Error) as e:
        kernel.launch(132, a, out, out, 1000)  # a buffer where a descriptor goes
    assert "takes 2 host tensor descriptors" in e.value.message and "got 1" in e.value.message
    with pytest.raises(gpuexec.Error) as e:
        kernel.launch(132, a, b, a, 1000)
    assert "argument 2 is one more" in e.value.message
    kernel.launch_async(0, a, b, out, 1000)  # an empty grid launches nothing
    assert len(function.launches) == 1


def test_cooperative_pdl_cluster_and_scratch_through_a_kernel_launch():
    function = _Function(3 + 2)
    kernel = gt.Kernel(function, gt.read_metadata(_path("sm90_3_6.json")))
    assert kernel.num_args == 3 and kernel.block == (256, 1, 1)
    assert kernel.cooperative and kernel.pdl and kernel.cluster == (2, 1, 1)
    kernel[(3, 2)](1, 2, 3)
    grid, block, args, kwargs = function.launches[-1]
    assert grid == (6, 2, 1)
    assert args[:3] == (1, 2, 3) and args[3] is kernel.global_scratch and args[4] is None
    assert kernel.global_scratch.size == 1280
    assert kwargs == {"shared": 98304, "cluster": (2, 1, 1), "sync": False, "cooperative": True,
                      "pdl": True, "non_portable_cluster": False, "cluster_policy": "spread"}
    function = _Function(1 + 2)
    kernel = gt.Kernel(function, _path("sm90_3_4_cluster.json"))
    kernel.launch_async((3, 2), 5)
    grid, block, args, kwargs = function.launches[-1]
    assert grid == (12, 4, 2) and args == (5, None, None)
    assert kwargs == {"shared": 0, "cluster": (4, 2, 2), "cooperative": False, "pdl": False,
                      "non_portable_cluster": True, "cluster_policy": "spread"}


def test_too_few_parameters_for_the_descriptors():
    with pytest.raises(gpuexec.Error) as e:
        gt.Kernel(_Function(2 * 4 + 2 + 1), gt.read_metadata(_path("sm90_3_5.json")))
    assert "too few" in e.value.message and "2 tensor descriptors" in e.value.message


@pytest.mark.parametrize("name", sorted(EXPECTED["refused"]))
def test_refused(name):
    want = EXPECTED["refused"][name]
    with pytest.raises(gpuexec.Error) as e:
        gt.read_metadata(_path(name))
    assert e.value.code.name == want["code"]
    assert f"'{want['key']}'" in e.value.message


# ---------------------------------------------------------- reading rules

def _md(**changes):
    md = {"name": "k", "num_warps": 4}
    md.update(changes)
    return md


class Refused:
    """A reading refused with a message naming ``key``."""

    def __init__(self, key):
        self.key = key

    def __repr__(self):
        return f"Refused({self.key!r})"


@pytest.mark.parametrize("changes,attr,value", [
    ({"num_warps": "8"}, "num_warps", 8),
    ({"shared": "0x10"}, "shared", Refused("shared")),  # neither JSON nor a literal number
    ({"launch_pdl": "true"}, "launch_pdl", True),
    ({"launch_pdl": "True"}, "launch_pdl", True),
    ({"launch_pdl": "False"}, "launch_pdl", False),
    ({"launch_pdl": None}, "launch_pdl", False),
    ({"launch_pdl": "None"}, "launch_pdl", False),
    ({"launch_pdl": 1}, "launch_pdl", Refused("launch_pdl")),
    ({"launch_cooperative_grid": True}, "launch_cooperative_grid", True),
    ({"num_ctas": "None"}, "num_ctas", 1),
    ({"num_ctas": 17}, "num_ctas", Refused("num_ctas")),
    ({"num_ctas": 4}, "cluster", (4, 1, 1)),
    ({"num_ctas": 4, "cluster_dims": "(1, 1, 1)"}, "cluster", (4, 1, 1)),
    ({"num_ctas": 4, "cluster_dims": "[2, 2, 1]"}, "cluster", (2, 2, 1)),
    ({"cluster_dims": [1, 17, 1]}, "cluster", Refused("cluster_dims")),
    ({"cluster_dims": (2, 1, 1)}, "cluster", (2, 1, 1)),
    ({"warp_size": 64}, "warp_size", 64),
    ({"warp_size": 0}, "warp_size", Refused("warp_size")),
    ({"warp_size": None, "target": ["hip", "gfx942", 64]}, "warp_size", 64),
    ({"target": "['cuda', 90, 16]"}, "warp_size", 16),
    ({"target": {"backend": "cuda", "arch": 90, "warp_size": 8}}, "warp_size", 8),
    ({"target": "{'backend': 'cuda', 'arch': 90, 'warp_size': 4}"}, "warp_size", 4),
    ({"target": "GPUTarget(backend='hip', arch='gfx90a', warp_size=64)"}, "warp_size", 64),
    ({"target": "GPUTarget(backend='cuda', arch=90)"}, "warp_size", Refused("target")),
    ({"target": {"backend": "cuda"}}, "warp_size", Refused("target")),
    ({"target": ["cuda", 90]}, "warp_size", Refused("target")),
    ({"target": None}, "warp_size", 32),
    ({"warp_size": 32, "target": "nonsense"}, "warp_size", 32),
    ({"shared": 1 << 32}, "shared", Refused("shared")),
    ({"shared": (1 << 32) - 1}, "shared", (1 << 32) - 1),
    ({"shared": 1.0}, "shared", Refused("shared")),
    ({"global_scratch_size": "None"}, "global_scratch", None),
    ({"global_scratch_size": 8, "global_scratch_align": 512}, "global_scratch",
     Refused("global_scratch_align")),
    ({"global_scratch_size": 8, "global_scratch_align": "256"}, "global_scratch",
     gt.Scratch(8, 256)),
    ({"profile_scratch_size": -1}, "profile_scratch", Refused("profile_scratch_size")),
    ({"name": ""}, "name", Refused("name")),
    ({"name": 5}, "name", Refused("name")),
    ({"name": "None"}, "name", Refused("name")),
    ({"num_warps": 0}, "num_warps", Refused("num_warps")),
    ({"num_warps": True}, "num_warps", Refused("num_warps")),
    ({"tensordesc_meta": None}, "tensordesc_meta", ()),
    ({"tensordesc_meta": "[]"}, "tensordesc_meta", ()),
    ({"tensordesc_meta": {"swizzle": 0}}, "tensordesc_meta", Refused("tensordesc_meta")),
    ({"tensordesc_meta": [5]}, "tensordesc_meta", Refused("tensordesc_meta")),
    ({"tensordesc_meta": [{"swizzle": "1", "elem_size": "4", "elem_type": "7",
                           "block_size": "(16,)", "fp4_padded": "False"}]},
     "tensordesc_meta", (gt.TensorDescMeta(1, 4, 7, (16,)),)),
    ({"tensordesc_meta": "[{'swizzle': 0, 'elem_size': 8, 'elem_type': 9, "
                         "'block_size': (2, 4, 8), 'is_im2col': False}]"},
     "tensordesc_meta", (gt.TensorDescMeta(0, 8, 9, (2, 4, 8)),)),
    ({"tensordesc_meta": [{"elem_size": 2, "elem_type": 6, "block_size": [8]}]},
     "tensordesc_meta", Refused("swizzle")),
    ({"tensordesc_meta": [{"swizzle": 0, "elem_size": 2, "elem_type": 6}]},
     "tensordesc_meta", Refused("block_size")),
    ({"tensordesc_meta": [{"swizzle": 0, "elem_size": 2, "elem_type": 6, "block_size": []}]},
     "tensordesc_meta", Refused("block_size")),
    ({"tensordesc_meta": [{"swizzle": 0, "elem_size": 2, "elem_type": -1,
                           "block_size": [8]}]}, "tensordesc_meta", Refused("elem_type")),
    ({"unknown_key": "[{'x'"}, "name", "k"),  # keys not named are ignored
])
def test_reading_rules(changes, attr, value):
    md = _md(**changes)
    if isinstance(value, Refused):
        with pytest.raises(gpuexec.Error) as e:
            gt.read_metadata(md)
        assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert f"'{value.key}'" in e.value.message, e.value.message
    else:
        assert getattr(gt.read_metadata(md), attr) == value


def test_elem_types_map_to_the_driver_and_the_proto():
    names = ["UINT8", "UINT16", "UINT32", "INT32", "UINT64", "INT64", "FLOAT16", "FLOAT32",
             "FLOAT32_FTZ", "FLOAT64", "BFLOAT16", "TFLOAT32", "TFLOAT32_FTZ"]
    for elem_type, name in enumerate(names):
        meta = gt.TensorDescMeta(0, 4, elem_type, (8,))
        assert meta.data_type == name
        assert pb.TensorMapArg.DataType.Value(name) == meta.driver_data_type + 1


def test_a_dict_as_triton_gives_it():
    """compiled.metadata._asdict(): tuples, and a GPUTarget object."""
    class GPUTarget:
        backend, arch, warp_size = "cuda", 90, 32
    md = gt.read_metadata({"name": "k", "num_warps": 2, "target": GPUTarget(),
                           "cluster_dims": (1, 2, 1), "tensordesc_meta": [
                               {"swizzle": 3, "elem_size": 2, "elem_type": 6,
                                "block_size": (64, 64), "fp4_padded": False}]})
    assert md.warp_size == 32 and md.cluster == (1, 2, 1) and md.block == (64, 1, 1)
    assert md.tensordesc_meta[0].block_size == (64, 64)


# ---------------------------------------------------- descriptor refusals

_META = gt.read_metadata(_path("sm90_3_5.json"))
_ENTRY = _META.tensordesc_meta[0]  # fp16, block [128, 64], 128B swizzle


def _refused(call, *needles):
    with pytest.raises(gpuexec.Error) as e:
        call()
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    for needle in needles:
        assert needle in e.value.message, e.value.message


def test_descriptor_refusals():
    b = _buffer()
    _refused(lambda: gt.TensorDescriptor(b, [4, 8, 16]).kernel_params(_ENTRY, 0),
             "rank 3", "rank 2")
    _refused(lambda: gt.TensorDescriptor(b, [64, 64], block_shape=[64]), "block_shape")
    _refused(lambda: gt.TensorDescriptor(b, [64, 64], block_shape=[1, 64, 64]), "block_shape")
    _refused(lambda: gt.TensorDescriptor(b, [64, 64], [1, 64]), "last stride must be 1")
    _refused(lambda: gt.TensorDescriptor(b, [64, 64], [64]), "rank")
    _refused(lambda: gt.TensorDescriptor(b, [64, 64], dtype="float32").kernel_params(_ENTRY, 0),
             "4 bytes", "2 bytes", "FLOAT16")
    _refused(lambda: gt.TensorDescriptor(_buffer(dtype=gpuexec.float64), [64, 64])
             .kernel_params(_ENTRY, 1), "tensor descriptor 1", "8 bytes")
    _refused(lambda: gt.TensorDescriptor(b, [64, 64], padding="inf"), "padding")
    _refused(lambda: gt.TensorDescriptor(b, [64, 64], offset=16, element_offset=8), "not both")
    _refused(lambda: gt.TensorDescriptor(b, [64, 64], offset=-1), "offset")
    _refused(lambda: gt.TensorDescriptor(b, []), "rank 0")
    _refused(lambda: gt.TensorDescriptor(b, [2] * 6), "rank 6")
    _refused(lambda: gt.TensorDescriptor(object(), [64, 64]), "gpuexec Buffer")
    _refused(lambda: gt.TensorDescriptor(b, [1 << 31, 64]).kernel_params(_ENTRY, 0),
             "32 bits")
    no_descriptors = gt.read_metadata(_path("sm90_3_6.json"))
    _refused(lambda: no_descriptors.kernel_args([b, gt.TensorDescriptor(b, [64, 64])]),
             "argument 1 is a tensor descriptor", "no tensordesc_meta")


def test_descriptor_options():
    b = _buffer()
    contiguous = gt.TensorDescriptor(b, [3, 5, 7])
    assert contiguous.strides == (35, 7, 1)
    params = gt.TensorDescriptor(b, [1000, 512], element_offset=10,
                                 dtype="float16").kernel_params(_ENTRY, 0)
    assert getattr(params[0].to_proto(), "global").offset == 20
    assert gt.TensorDescriptor(_buffer(dtype=gpuexec.float16), [64, 64]).element_size == 2


class _TritonDescriptor:
    """An object with the attributes of Triton's TensorDescriptor."""

    def __init__(self, base, shape, strides, block_shape, padding="zero"):
        self.base, self.shape, self.strides = base, shape, strides
        self.block_shape, self.padding = block_shape, padding


def test_a_triton_shaped_descriptor_is_taken():
    want = EXPECTED["descriptors"]["sm90_3_5.json"]
    a = _TritonDescriptor(_buffer(), [1000, 512], [512, 1], [128, 64])
    b = gt.TensorDescriptor(_buffer(), [300, 200], [256, 1], offset=4096, padding="nan")
    out = _META.kernel_args([a, b])
    _check_params(out[:5], want[0], 0)
    _check_params(out[5:], want[1], 4096)
    _refused(lambda: _META.kernel_args([_TritonDescriptor(object(), [8, 8], [8, 1], [8, 8]), b]),
             "gpuexec Buffer")
    _refused(lambda: _META.kernel_args([_TritonDescriptor(_buffer(), [8, 8], [8, 1], [8]), b]),
             "block_shape")
