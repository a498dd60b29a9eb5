"""Buffers as arrays: dtypes, shapes, views, get/set and the array
constructors, against a real gpuexecd (see conftest.py)."""

import copy
import importlib.util
import pickle

import grpc
import numpy as np
import pytest

import gpuexec

# The keys of Triton 3.6's type_canonicalisation_dict (triton/_utils.py),
# which canonicalises str(dtype).split(".")[-1] through it, and what each
# maps to.
TRITON_CANONICAL = {
    "bool": "u1", "int1": "u1", "uint1": "u1", "i1": "u1", "float8e4nv": "fp8e4nv",
    "float8e5": "fp8e5", "float8e4b15": "fp8e4b15", "float8_e4m3fn": "fp8e4nv",
    "float8e4b8": "fp8e4b8", "float8_e4m3fnuz": "fp8e4b8", "float8_e5m2": "fp8e5",
    "float8e5b16": "fp8e5b16", "float8_e5m2fnuz": "fp8e5b16", "half": "fp16", "float16": "fp16",
    "bfloat16": "bf16", "float": "fp32", "float32": "fp32", "double": "fp64", "float64": "fp64",
    "int8": "i8", "int16": "i16", "int": "i32", "int32": "i32", "int64": "i64", "uint8": "u8",
    "uint16": "u16", "uint32": "u32", "uint64": "u64", "void": "void",
}
CONSTANTS = ["bool_", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
             "float16", "bfloat16", "float32", "float64"]
SIZES = {"bool": 1, "int8": 1, "int16": 2, "int32": 4, "int64": 8, "uint8": 1, "uint16": 2,
         "uint32": 4, "uint64": 8, "float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}


def _refused(call, *needles, code=grpc.StatusCode.INVALID_ARGUMENT):
    with pytest.raises(gpuexec.Error) as e:
        call()
    assert e.value.code == code, e.value
    assert e.value.message.startswith("gpuexec client:"), e.value.message
    for needle in needles:
        assert needle in e.value.message, e.value.message
    return e.value.message


def test_triton_table_copy_is_triton_s():
    utils = pytest.importorskip("triton._utils")
    assert utils.type_canonicalisation_dict.items() >= TRITON_CANONICAL.items()


@pytest.mark.parametrize("name", CONSTANTS)
def test_each_dtype_is_named_as_numpy_and_triton_name_it(name):
    d = getattr(gpuexec, name)
    assert type(d) is gpuexec.DType
    assert str(d) == d.name == name.rstrip("_")
    assert d.itemsize == SIZES[d.name]
    # Triton reads str(dtype).split(".")[-1] through its table.
    assert TRITON_CANONICAL[str(d).split(".")[-1]] == d.triton
    for alias in (d.name, d.triton, d.name.upper(), f"torch.{d.name}", d):
        assert gpuexec.dtype(alias) is d
    assert d.is_floating_point == (d.name in ("float16", "bfloat16", "float32", "float64"))
    assert repr(d) == f"gpuexec.{name}"
    if d.name != "bfloat16":
        assert d.numpy == np.dtype(d.name)
        assert gpuexec.dtype(np.dtype(d.name)) is d
        assert gpuexec.dtype(np.dtype(d.name).type) is d
    # One object per type: hashing and equality are the object's own.
    assert copy.deepcopy(d) is d and pickle.loads(pickle.dumps(d)) is d
    assert {d: 1}[gpuexec.dtype(d.name)] == 1
    assert d != d.name
    with pytest.raises(AttributeError):
        d.itemsize = 3


def test_every_triton_name_of_a_buffer_type_reads_back():
    for key, short in TRITON_CANONICAL.items():
        if key in ("int", "float", "void", "float8e4b15", "float8e4b15x4"):
            continue  # ambiguous between numpy and Triton, or no buffer type
        d = gpuexec.dtype(key)
        assert d.triton == short, key
        assert TRITON_CANONICAL[str(d)] == short


def test_dtype_other_spellings_and_refusals():
    assert gpuexec.dtype("f32") is gpuexec.float32
    assert gpuexec.dtype("fp16") is gpuexec.dtype("half") is gpuexec.float16
    assert gpuexec.dtype("int1") is gpuexec.dtype(bool) is gpuexec.bool_
    assert gpuexec.dtype("<u4") is gpuexec.uint32  # numpy's codes
    assert gpuexec.dtype("B") is gpuexec.uint8 and gpuexec.dtype("b") is gpuexec.int8
    assert gpuexec.dtype(np.float64) is gpuexec.dtype(float) is gpuexec.float64
    assert gpuexec.dtype("float8_e4m3fn").itemsize == 1
    _refused(lambda: gpuexec.dtype("int"), "ambiguous", "int32 or int64")
    _refused(lambda: gpuexec.dtype("float"), "ambiguous", "float32 or float64")
    _refused(lambda: gpuexec.dtype(np.complex64), "complex64", "a.view(numpy.uint8)")
    _refused(lambda: gpuexec.dtype(">f4"), "not an element type")
    message = _refused(lambda: gpuexec.dtype("x" * 10000), "not an element type", "float32")
    assert len(message) < 400
    _refused(lambda: gpuexec.dtype(3.5), "dtype must be")


def test_bfloat16_has_numpy_dtype_only_with_ml_dtypes():
    if importlib.util.find_spec("ml_dtypes") is None:
        _refused(lambda: gpuexec.bfloat16.numpy, "bfloat16 has no numpy dtype",
                 "buf.view(dtype='uint16')")
    else:
        assert gpuexec.bfloat16.numpy.name == "bfloat16"


def test_array_facts(session):
    b = session.empty((3, 4), "float32")
    assert b.dtype is gpuexec.float32 and b.shape == (3, 4) and b.strides == (16, 4)
    assert b.stride() == (4, 1) and b.stride(0) == 4 and b.stride(-1) == 1
    assert (b.size, b.nbytes, b.ndim, b.itemsize, b.element_size(), b.numel()) == \
        (12, 48, 2, 4, 4, 12)
    assert len(b) == 3 and b.offset == 0 and b.base is None and b.is_contiguous()
    assert repr(b) == f"<gpuexec.Buffer 0x{b.handle:x} float32[3, 4], session {session.token[:8]}>"
    raw = session.alloc(10)
    assert raw.dtype is gpuexec.uint8 and raw.shape == (10,) and raw.nbytes == 10
    typed = session.alloc(10, dtype="float32")  # as many as fit
    assert typed.shape == (2,) and typed.nbytes == 8
    _refused(lambda: session.alloc(8, dtype="float32", shape=(3,)), "needs 12 bytes")
    _refused(lambda: b.stride(2), "stride(dim=2)")
    _refused(lambda: session.empty((2, -1)), "non-negative")
    with pytest.raises(TypeError) as e:
        len(b[0][0])
    assert "0-d" in str(e.value)
    with pytest.raises(TypeError):
        iter(b)
    assert bool(session.empty((0,)))  # always true; test len() or size


def test_views_and_slices(session):
    a = np.arange(24, dtype=np.float32).reshape(6, 4)
    b = session.asarray(a)
    v = b[1:3]
    assert (v.shape, v.offset, v.base, v.handle, v.nbytes) == ((2, 4), 16, b, b.handle, 32)
    assert type(v) is gpuexec.Buffer and v.is_contiguous()
    np.testing.assert_array_equal(v.get(), a[1:3])
    assert "view of" in repr(v) and "at byte 16" in repr(v)
    np.testing.assert_array_equal(b[-1].get(), a[-1])
    assert b[-1].offset == 80
    scalar = b[2][1]
    assert scalar.shape == () and scalar.get() == a[2, 1]
    assert v[1].base is b and v[1].offset == 32  # a view's view: the owner is the base
    np.testing.assert_array_equal(b[4:2].get(), a[4:2])
    np.testing.assert_array_equal(b[(slice(-2, None),)].get(), a[-2:])
    words = b.view(8, (3,), "int32")
    assert words.dtype is gpuexec.int32 and words.offset == 8
    np.testing.assert_array_equal(words.get(), a.reshape(-1)[2:5].view(np.int32))
    rest = v.view(4)  # as many elements as fit before v's end
    assert rest.shape == (7,) and rest.offset == 20
    flat = b.reshape(-1, 3)
    assert flat.shape == (8, 3)
    np.testing.assert_array_equal(flat.get(), a.reshape(-1, 3))
    assert b[1:5].reshape((2, 8)).offset == 16
    column = b.view(0, (6,), strides=(16,))
    assert not column.is_contiguous() and column.stride() == (4,)
    assert "strides (16,)" in repr(column)
    _refused(column.get, "not contiguous")
    _refused(lambda: column.reshape(3, 2), "not contiguous")
    # Refusals, each before any call.
    _refused(lambda: b[::2], "step 1")
    _refused(lambda: b[6], "index out of range for length 6", code=grpc.StatusCode.OUT_OF_RANGE)
    _refused(lambda: b[1, 2], "first dimension")
    _refused(lambda: b.view(0, (7, 4)), "bytes [0, 112)", "it holds [0, 96)",
             code=grpc.StatusCode.OUT_OF_RANGE)
    _refused(lambda: v.view(40), "past its end (32 bytes)", code=grpc.StatusCode.OUT_OF_RANGE)
    _refused(lambda: b.view(2, (2,)), "not aligned to their 4 bytes")
    _refused(lambda: b.view(-4), "offsets are >= 0")
    _refused(lambda: b.reshape(5, -1), "do not fill")
    _refused(lambda: b.reshape(5, 5), "25 elements, it has 24")


def test_reads_and_writes_are_relative_to_the_view(session):
    data = bytes(range(256))
    b = session.upload(data)
    v = b[16:48]
    assert v.read() == data[16:48]
    assert v.read(offset=4, size=8) == data[20:28]
    assert v.write(b"\xff" * 4, offset=2) == 4
    v.memset(0, offset=10, size=3)
    expected = bytearray(data)
    expected[18:22] = b"\xff" * 4
    expected[26:29] = bytes(3)
    assert b.read() == bytes(expected)
    out = bytearray(8)
    assert v.read_into(out, offset=24) is out and out == expected[40:48]
    b[100:108].copy_from(v, 8, src_offset=2)
    expected[100:108] = expected[18:26]
    b[200:].copy_to(b[0:8])  # what fits: 8 bytes
    expected[0:8] = expected[200:208]
    assert b.read() == bytes(expected)
    np.testing.assert_array_equal(v.read_array(np.uint32, (2, 2), offset=8),
                                  np.frombuffer(bytes(expected[24:40]), np.uint32).reshape(2, 2))
    for call in (lambda: v.read(offset=30, size=3), lambda: v.write(b"x" * 33),
                 lambda: v.memset(1, offset=32, size=1), lambda: v.read_into(bytearray(40)),
                 lambda: b[0:4].copy_from(v, 8)):
        _refused(call, "past the end", code=grpc.StatusCode.OUT_OF_RANGE)
    message = _refused(lambda: v.read(offset=30, size=3), code=grpc.StatusCode.OUT_OF_RANGE)
    assert "bytes [30, 33) are past the end of its 32 bytes" in message
    assert b.read() == bytes(expected)  # nothing was written by the refused calls


def test_data_ptr_keeps_alignment_and_names_each_allocation(session):
    first, second = session.alloc(1024), session.alloc(1024)
    bases = {first.data_ptr(), second.data_ptr()}
    assert len(bases) == 2 and all(p % 256 == 0 for p in bases)
    assert first.data_ptr() == first.data_ptr()  # stable
    at4 = first.view(4)
    assert at4.data_ptr() % 16 == 4 and at4.data_ptr() == first.data_ptr() + 4
    assert first[64:].data_ptr() == first.data_ptr() + 64
    assert first[64:].data_ptr() % 16 == 0
    third = session.alloc(16)
    assert third.data_ptr() not in bases and third.data_ptr() % 256 == 0


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int8, np.int64,
                                   np.uint16, np.uint64, np.bool_])
def test_get_and_set_round_trip(session, dtype):
    rng = np.random.default_rng(7)
    a = (rng.standard_normal((5, 7)) * 100).astype(dtype)
    b = session.asarray(a)
    assert b.dtype is gpuexec.dtype(dtype) and b.shape == a.shape
    got = b.get()
    assert got.dtype == a.dtype and got.shape == a.shape
    np.testing.assert_array_equal(got, a)
    b.set(a[::-1])  # a non-contiguous array is copied contiguous
    np.testing.assert_array_equal(b.get(), a[::-1])


def test_set_converts_as_numpy_assigns(session):
    b = session.zeros((2, 3), "float32")
    b.set(np.arange(6, dtype=np.float64).reshape(2, 3))  # same kind: converted
    np.testing.assert_array_equal(b.get(), np.arange(6, dtype=np.float32).reshape(2, 3))
    b[1].set([7, 8, 9])
    np.testing.assert_array_equal(b.get()[1], [7, 8, 9])
    ints = session.zeros(3, "int32")
    _refused(lambda: ints.set(np.ones(3, np.float32)), "float32 values do not convert",
             "a.astype('int32')")
    _refused(lambda: b.set(np.ones(6, np.float32)), "shape (6,)", "the buffer's is (2, 3)")


def test_numpy_does_not_download_implicitly(session):
    b = session.zeros(4)
    for convert in (np.asarray, np.array):
        with pytest.raises(TypeError) as e:
            convert(b)
        text = str(e.value)
        assert text.startswith("gpuexec.Buffer <gpuexec.Buffer")
        assert "an implicit copy from the device is not made; call .get() to download it " \
            "(a network copy)" in text
    assert not hasattr(b, "__cuda_array_interface__") and not hasattr(b, "__dlpack__")


def test_zeros_full_and_likes(session):
    junk = session.upload(b"\xa5" * 4096)
    junk.free()
    z = session.zeros((32, 32), "float32")  # reuses freed memory, reads as zeros
    np.testing.assert_array_equal(z.get(), np.zeros((32, 32), np.float32))
    np.testing.assert_array_equal(session.full((3, 2), 2.5).get(), np.full((3, 2), 2.5,
                                                                           np.float32))
    np.testing.assert_array_equal(session.full(5, -1, "int32").get(), np.full(5, -1, np.int32))
    np.testing.assert_array_equal(session.full(5, 1, "int8").get(), np.ones(5, np.int8))
    np.testing.assert_array_equal(session.full(4, 0x0102, "uint16").get(),
                                  np.full(4, 0x0102, np.uint16))
    assert session.full(3, 0.0, "float64").get().tolist() == [0.0] * 3
    bf = session.full(2, 1.0, "bfloat16")
    assert bf.view(dtype="uint16").get().tolist() == [0x3F80, 0x3F80]
    _refused(lambda: session.full(3, 300, "uint8"), "300 is out of the range of uint8")
    _refused(lambda: session.full(3, 1.5, "int32"), "must be an integer")
    _refused(lambda: session.full(3, "x"), "must be a number")
    like = session.empty_like(np.zeros((2, 5), np.int16))
    assert like.shape == (2, 5) and like.dtype is gpuexec.int16
    zl = session.zeros_like(z, dtype="float64")
    assert zl.shape == (32, 32) and zl.dtype is gpuexec.float64
    assert zl.get().sum() == 0.0
    _refused(lambda: session.empty_like(3), "a Buffer or a numpy array")


def test_asarray_and_upload(session, client):
    b = session.asarray([[1, 2], [3, 4]], dtype="int32")
    assert b.dtype is gpuexec.int32 and b.get().tolist() == [[1, 2], [3, 4]]
    assert session.asarray(b) is b
    _refused(lambda: session.asarray(b, dtype="float32"), "not converted on the device")
    with client.session() as other:
        theirs = other.zeros(4)
        _refused(lambda: session.asarray(theirs), f"session {other.token[:8]}",
                 "session.asarray(buffer.get())")
    # Arrays of types no buffer holds travel as their bytes.
    c = np.arange(4, dtype=np.complex64)
    raw = session.upload(c)
    assert raw.dtype is gpuexec.uint8 and raw.shape == (32,)
    assert raw.read() == c.tobytes()
    _refused(lambda: session.asarray(c), "complex64")
    assert session.upload(b"abc").dtype is gpuexec.uint8


def test_a_view_as_a_launch_argument_starts_at_its_offset(session, kernels):
    n = 1000
    x = session.full(n, 1.0)
    y = session.zeros(n + 8)
    saxpy = kernels.function("gx_saxpy")
    saxpy.launch((n + 255) // 256, 256, gpuexec.f32(3.0), x, y[8:], gpuexec.u64(n), sync=True)
    got = y.get()
    np.testing.assert_array_equal(got[:8], np.zeros(8, np.float32))
    np.testing.assert_array_equal(got[8:], np.full(n, 3.0, np.float32))
    fill = kernels.function("gx_fill_u32")
    words = session.zeros(8, "uint32")
    fill.launch(1, 32, words[2:4], 7, 2)  # the cached launch field carries the offset
    fill.launch(1, 32, words.view(24).ptr(), 9, 1)
    assert words.get().tolist() == [0, 0, 7, 7, 0, 0, 9, 0]
    assert words[2:].ptr(4) == gpuexec.Arg("buffer", words.handle, 12)


def test_free_of_a_view_and_a_view_of_a_freed_buffer(session):
    b = session.zeros(16, "uint32")
    v = b[4:8]
    _refused(v.free, "a view is part of", "free its owner")
    with v:  # a view's with block frees nothing
        v.memset(1)
    assert b.read(offset=16, size=4) == b"\x01" * 4
    b.free()
    _refused(v.get, "its owner", "was freed", code=grpc.StatusCode.NOT_FOUND)
    _refused(lambda: v.write(b"abcd"), "was freed", code=grpc.StatusCode.NOT_FOUND)
    _refused(lambda: b[1:], "was freed", code=grpc.StatusCode.NOT_FOUND)
    # The owner itself goes to the daemon, which no longer knows it.
    with pytest.raises(gpuexec.Error) as e:
        b.read()
    assert e.value.code == grpc.StatusCode.NOT_FOUND


def test_an_empty_buffer(session):
    e = session.empty((0, 3), "float32")
    assert e.size == 0 and e.nbytes == 0 and len(e) == 0
    assert e.get().shape == (0, 3)
    assert e.read() == b""


def test_a_tensor_map_over_a_view_starts_at_the_view(session):
    b = session.zeros((64, 64), "float32")
    view = b[16:]
    m = gpuexec.TensorMap(view, view.dtype, [64, 48], [256], [16, 16], offset=256)
    assert m.handle == b.handle and m.offset == view.offset + 256 == 16 * 256 + 256


def test_read_array_keeps_its_old_defaults(session):
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = session.upload(a)
    for got in (b.read_array(), b.read_array(np.float32), b.read_array("float32")):
        assert got.shape == (3, 4)
        np.testing.assert_array_equal(got, a)
    assert b.read_array(np.uint32).shape == (12,)  # another dtype: flat, to the end
    # Bytes read as a numpy dtype no buffer holds.
    pairs = b.read(np.complex64)
    np.testing.assert_array_equal(pairs, a.reshape(-1).view(np.complex64))
    assert b.read_array(np.complex64, (2, 3)).shape == (2, 3)
