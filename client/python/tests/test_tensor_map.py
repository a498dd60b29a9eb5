"""gpuexec.TensorMap: the spellings it takes, the protos it makes and what it
refuses before any call (no daemon needed; the launches are in
test_launch_attributes.py)."""

import grpc
import numpy as np
import pytest

import gpuexec
from gpuexec.v1 import gpuexec_pb2 as pb

T = pb.TensorMapArg
BUFFER = gpuexec.Buffer(None, 0x42, 1 << 20)


def _proto(tensor_map):
    return tensor_map._as_kernel_arg().to_proto().tensor_map


@pytest.mark.parametrize("dtype,expected", [
    ("float16", T.FLOAT16), ("fp16", T.FLOAT16), ("FLOAT16", T.FLOAT16), (np.float16, T.FLOAT16),
    (np.dtype("float32"), T.FLOAT32), ("f32", T.FLOAT32), ("bfloat16", T.BFLOAT16),
    ("bf16", T.BFLOAT16), ("tf32", T.TFLOAT32), ("TFLOAT32_FTZ", T.TFLOAT32_FTZ),
    ("float32_ftz", T.FLOAT32_FTZ), ("float64", T.FLOAT64), (np.uint8, T.UINT8),
    (np.int8, T.UINT8), ("int16", T.UINT16), ("uint32", T.UINT32), (np.int32, T.INT32),
    ("uint64", T.UINT64), (np.int64, T.INT64),
])
def test_data_types(dtype, expected):
    assert _proto(gpuexec.TensorMap(BUFFER, dtype, [64], [], [16])).data_type == expected


def test_fields_reach_the_proto():
    m = gpuexec.TensorMap(BUFFER, "float32", [100, 50, 7], [512, 512 * 50], [32, 8, 1],
                          [1, 2, 1], offset=256, interleave=None, swizzle="128B",
                          l2_promotion="256b", oob_fill="NaN")
    p = _proto(m)
    assert (getattr(p, "global").buffer, getattr(p, "global").offset) == (0x42, 256)
    assert list(p.global_dims) == [100, 50, 7]
    assert list(p.global_strides) == [512, 25600]
    assert list(p.box_dims) == [32, 8, 1]
    assert list(p.element_strides) == [1, 2, 1]
    assert (p.interleave, p.swizzle, p.l2_promotion, p.oob_fill) == (
        T.INTERLEAVE_NONE, T.SWIZZLE_128B, T.L2_PROMOTION_256B, T.OOB_FILL_NAN_REQUEST_ZERO_FMA)
    assert "SWIZZLE_128B" in repr(m) and "buffer 0x42 + 256" in repr(m)


def test_numpy_strides_are_taken():
    a = np.zeros((30, 40), np.float32)
    m = gpuexec.TensorMap(BUFFER, a.dtype, a.shape[::-1], a.strides[::-1], [8, 8])
    assert list(_proto(m).global_strides) == [160]  # the innermost (4, the element) dropped
    assert gpuexec.TensorMap(BUFFER, "float32", [40, 30], [160], [8, 8]) == m


def test_is_immutable_and_hashable():
    m = gpuexec.TensorMap(BUFFER, "float32", [40, 30], [160], [8, 8])
    with pytest.raises(AttributeError):
        m.offset = 16
    same = gpuexec.TensorMap(BUFFER, "fp32", (40, 30), (160,), (8, 8))
    assert m == same and hash(m) == hash(same) and len({m, same}) == 1
    assert m != gpuexec.TensorMap(BUFFER, "float32", [40, 30], [160], [8, 8], offset=16)
    assert m._as_kernel_arg() == same._as_kernel_arg()


@pytest.mark.parametrize("kwargs,needle", [
    ({"buffer": None}, "Buffer"),
    ({"buffer": 0x42}, "Buffer"),
    ({"dtype": "float8"}, "dtype"),
    ({"dtype": object()}, "dtype"),
    ({"dtype": np.complex64}, "complex64"),
    ({"global_dims": []}, "rank"),
    ({"global_dims": [1, 2, 3, 4, 5, 6], "box_dims": [1] * 6,
      "global_strides": [16] * 5}, "rank"),
    ({"global_dims": [64, -1]}, "global_dims"),
    ({"global_dims": [64, 1.5]}, "global_dims"),
    ({"global_dims": [1 << 64, 2]}, "global_dims"),
    ({"global_strides": []}, "global_strides"),
    ({"global_strides": [256, 256]}, "global_strides"),
    ({"global_strides": [-16]}, "global_strides"),
    ({"box_dims": [8]}, "box_dims"),
    ({"box_dims": [8, 1 << 32]}, "box_dims"),
    ({"element_strides": [1]}, "element_strides"),
    ({"offset": -16}, "offset"),
    ({"offset": 1.0}, "offset"),
    ({"interleave": "64b"}, "interleave"),
    ({"swizzle": 3}, "swizzle"),  # bytes, not the enum's number
    ({"swizzle": True}, "swizzle"),
    ({"l2_promotion": "512b"}, "l2_promotion"),
    ({"oob_fill": "one"}, "oob_fill"),
])
def test_refusals(kwargs, needle):
    args = {"buffer": BUFFER, "dtype": "float32", "global_dims": [64, 32],
            "global_strides": [256], "box_dims": [8, 8]}
    args.update(kwargs)
    with pytest.raises(gpuexec.Error) as e:
        gpuexec.TensorMap(**args)
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert e.value.message.startswith("gpuexec client: TensorMap")
    assert needle in e.value.message


def test_exported():
    assert "TensorMap" in gpuexec.__all__ and gpuexec.TensorMap.__module__.startswith("gpuexec")
