"""Element types of buffers: gpuexec.dtype(x) -> gpuexec.DType.

A DType names one element type with numpy's name ("float32", "bfloat16",
"int32", "bool"), which is also a key of Triton's type table (Triton reads
``str(dtype).split(".")[-1]``), so a Buffer's dtype is understood by Triton
and by numpy (``.numpy``) alike. There is one DType object per type: they
compare (``==``) and hash as themselves, and are equal only to themselves
(never to a string or a numpy dtype: compare ``d.name`` for that).

numpy is optional: it is imported only for ``.numpy`` or a numpy argument.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

from ._errors import Error, client_error


class DType:
    """One element type of a Buffer; make it with ``gpuexec.dtype(x)``.

    - ``name`` / ``str(d)``: numpy's name ("float32", "bfloat16", "bool").
    - ``itemsize``: bytes of one element.
    - ``is_floating_point``: True for float types (torch's attribute, which
      Triton reads).
    - ``triton``: Triton's short name ("fp32", "bf16", "i32", "u1").
    - ``numpy``: the numpy dtype (bfloat16 and float8 types have one only
      where ml_dtypes is installed).
    """

    __slots__ = ("name", "itemsize", "is_floating_point", "is_signed", "triton", "_kind")

    name: str
    itemsize: int
    is_floating_point: bool
    is_signed: bool
    triton: str
    _kind: str

    def __init__(self, name: str, itemsize: int, kind: str, triton: str) -> None:
        for attr, value in (("name", name), ("itemsize", itemsize),
                            ("is_floating_point", kind == "f"),
                            ("is_signed", kind in "fi"), ("triton", triton), ("_kind", kind)):
            object.__setattr__(self, attr, value)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("a gpuexec.DType is immutable")

    def __delattr__(self, name: str) -> None:
        raise AttributeError("a gpuexec.DType is immutable")

    def __repr__(self) -> str:
        return f"gpuexec.{_CONSTANT_NAMES.get(self.name, self.name)}"

    def __str__(self) -> str:
        return self.name

    def __reduce__(self) -> Tuple[Any, Tuple[str]]:
        return (dtype, (self.name,))  # the one DType of that name, when unpickled

    def __copy__(self) -> DType:
        return self

    def __deepcopy__(self, memo: Any) -> DType:
        return self

    @property
    def numpy(self) -> Any:
        """The numpy dtype of these elements. bfloat16 and the float8 types
        need ml_dtypes (numpy has none of its own): without it this raises
        an Error saying to view the buffer as uint16 (uint8) instead."""
        np = _numpy_module()
        if self._kind == "f" and self.name not in ("float16", "float32", "float64"):
            try:
                import ml_dtypes  # type: ignore
            except ImportError:
                bits = "uint16" if self.itemsize == 2 else "uint8"
                raise client_error(
                    f"dtype {self.name} has no numpy dtype (numpy has no {self.name}; "
                    f"ml_dtypes, which adds it, is not installed): view the buffer as its "
                    f"bits, buf.view(dtype='{bits}'), or install ml_dtypes") from None
            return np.dtype(getattr(ml_dtypes, self.name))
        return np.dtype(self.name)


def _numpy_module() -> Any:
    from ._bytes import _numpy  # pylint: disable=import-outside-toplevel
    return _numpy()


def _make(name: str, itemsize: int, kind: str, triton: str) -> DType:
    d = DType(name, itemsize, kind, triton)
    _BY_NAME[name] = d
    return d


_BY_NAME: Dict[str, DType] = {}
bool_ = _make("bool", 1, "b", "u1")
int8 = _make("int8", 1, "i", "i8")
int16 = _make("int16", 2, "i", "i16")
int32 = _make("int32", 4, "i", "i32")
int64 = _make("int64", 8, "i", "i64")
uint8 = _make("uint8", 1, "u", "u8")
uint16 = _make("uint16", 2, "u", "u16")
uint32 = _make("uint32", 4, "u", "u32")
uint64 = _make("uint64", 8, "u", "u64")
float16 = _make("float16", 2, "f", "fp16")
bfloat16 = _make("bfloat16", 2, "f", "bf16")
float32 = _make("float32", 4, "f", "fp32")
float64 = _make("float64", 8, "f", "fp64")
float8_e4m3fn = _make("float8_e4m3fn", 1, "f", "fp8e4nv")
float8_e5m2 = _make("float8_e5m2", 1, "f", "fp8e5")
float8_e4m3fnuz = _make("float8_e4m3fnuz", 1, "f", "fp8e4b8")
float8_e5m2fnuz = _make("float8_e5m2fnuz", 1, "f", "fp8e5b16")

# The module constant of each DType whose name differs from it.
_CONSTANT_NAMES = {"bool": "bool_"}

# Every name dtype() takes: numpy's, Triton's canonical and short ones,
# torch's, and the package's scalar helpers' (f32, u64 ...). "int" and
# "float" are not among them: numpy and Triton read them differently.
_ALIASES: Dict[str, DType] = dict(_BY_NAME)
for _d in list(_BY_NAME.values()):
    _ALIASES[_d.triton] = _d
for _alias, _d in {
        "bool_": bool_, "int1": bool_, "uint1": bool_, "i1": bool_, "u1": bool_,
        "f16": float16, "half": float16, "f32": float32, "double": float64, "f64": float64,
        "float8e4nv": float8_e4m3fn, "float8e5": float8_e5m2, "float8e4b8": float8_e4m3fnuz,
        "float8e5b16": float8_e5m2fnuz}.items():
    _ALIASES[_alias] = _d
_AMBIGUOUS = {"int": "int32 or int64", "float": "float32 or float64"}
_PYTHON_TYPES = {bool: bool_, int: int64, float: float64}  # numpy's reading
_MAX_NAME = 40  # of a name quoted in an error


def _clip(text: str) -> str:
    text = repr(text)
    return text if len(text) <= _MAX_NAME else text[:_MAX_NAME - 4] + "...'"


def dtype(x: Any) -> DType:
    """The DType of ``x``: a DType, a name ("float32", "fp32", "f32",
    "float16", "bfloat16", "bf16", "int8" .. "uint64", "bool" or "int1",
    "float64", the float8 names of numpy's ml_dtypes, torch and Triton), a
    numpy dtype or scalar type (np.float32), a torch dtype, or Python's
    bool, int (int64) and float (float64), as numpy reads them.

    Raises gpuexec.Error (INVALID_ARGUMENT) naming what it was given and
    the types there are.
    """
    if type(x) is DType:
        return x
    if isinstance(x, str):
        key = x.strip().lower()
        if key.startswith("torch."):
            key = key[len("torch."):]
        found = _ALIASES.get(key)
        if found is not None:
            return found
        if key not in _AMBIGUOUS:
            found = _numpy_string(x.strip())  # numpy's codes: "f4", "<u4", "B"
            if found is not None:
                return found
        else:
            raise client_error(f"dtype {_clip(x)} is ambiguous (numpy reads it as 64 bits, "
                               f"Triton and torch as 32): name {_AMBIGUOUS[key]}")
        raise client_error(f"dtype {_clip(x)} is not an element type a buffer holds; use one "
                           f"of {', '.join(_BY_NAME)} (or Triton's short names: fp32, bf16, "
                           "i32 ...)")
    if isinstance(x, type) and x in _PYTHON_TYPES:
        return _PYTHON_TYPES[x]
    module = type(x).__module__ or ""
    if module.startswith("torch"):  # torch.float32: its str is "torch.float32"
        return dtype(str(x))
    name = _numpy_name(x)
    if name is not None:
        found = _BY_NAME.get(name)
        if found is not None:
            return found
        raise client_error(f"numpy dtype {_clip(name)} is not an element type a buffer holds "
                           f"(complex, structured and object types are not); use one of "
                           f"{', '.join(_BY_NAME)}, or upload the array's bytes "
                           "(a.view(numpy.uint8))")
    raise client_error(f"dtype must be a gpuexec.DType, a name such as 'float32', or a numpy "
                       f"dtype; got a {_clip(type(x).__name__)}")


def _numpy_string(key: str) -> Optional[DType]:
    """The DType numpy reads the string ``key`` as, where numpy is installed."""
    if len(key) > _MAX_NAME:
        return None
    try:
        import numpy  # pylint: disable=import-outside-toplevel
        d = numpy.dtype(key)
        return _BY_NAME.get(str(d.name)) if d.isnative else None
    except Exception:  # pylint: disable=broad-except  (no numpy, or not a dtype)
        return None


def _numpy_name(x: Any) -> Optional[str]:
    """numpy's name of ``x`` when it is a numpy dtype or scalar type, else None."""
    module = getattr(x, "__module__", None) if isinstance(x, type) else type(x).__module__
    if not isinstance(module, str) or not (module.startswith("numpy")
                                           or module.startswith("ml_dtypes")):
        return None
    np = _numpy_module()
    try:
        d = np.dtype(x)
    except TypeError:
        return None
    return str(d.name) if d.isnative else f"{d.name} ({d.byteorder}, not native byte order)"


def numpy_dtype(x: Any) -> Any:
    """The numpy dtype of ``x``: a DType's, or any numpy takes (complex,
    structured) for reads of bytes as such."""
    try:
        return dtype(x).numpy
    except Error as e:
        np = _numpy_module()
        try:
            return np.dtype(x.numpy if type(x) is DType else x)
        except (TypeError, Error):
            raise e from None


def shape_of(shape: Any, what: str = "shape") -> Tuple[int, ...]:
    """``shape`` (an int or a sequence of ints) as a tuple of non-negative
    ints; raises the client's error naming ``what``."""
    if hasattr(shape, "__index__") and not isinstance(shape, bool):
        dims: Tuple[Any, ...] = (shape,)
    else:
        try:
            dims = tuple(shape)
        except TypeError:
            raise client_error(f"{what} must be an int or a sequence of ints, got a "
                               f"{_clip(type(shape).__name__)}") from None
    out = []
    for d in dims:
        if isinstance(d, bool) or not hasattr(d, "__index__") or d.__index__() < 0:
            raise client_error(f"{what} {_clip(str(dims))} must hold non-negative ints")
        out.append(d.__index__())
    if len(out) > 32:
        raise client_error(f"{what} has {len(out)} dimensions; at most 32")
    return tuple(out)


def like(x: Any, dtype_: Any, what: str) -> Tuple[Tuple[int, ...], DType]:
    """The shape of ``x`` (a Buffer or numpy array) and ``dtype_`` or its dtype."""
    shape, own = getattr(x, "shape", None), getattr(x, "dtype", None)
    if shape is None or own is None:
        raise client_error(f"{what} takes a Buffer or a numpy array, got a "
                           f"{_clip(type(x).__name__)}")
    return shape_of(shape), dtype(own if dtype_ is None else dtype_)


def count_of(shape: Tuple[int, ...]) -> int:
    """Elements of an array of ``shape``."""
    n = 1
    for d in shape:
        n *= d
    return n


class ArrayFacts:
    """What an array's ``shape`` and ``dtype`` tell, numpy's meanings:
    gpuexec.Buffer's and gpuexec.aio.AsyncBuffer's."""

    shape: Tuple[int, ...]
    dtype: DType

    @property
    def nbytes(self) -> int:
        """Bytes of its elements (size * itemsize)."""
        return count_of(self.shape) * self.dtype.itemsize

    @property
    def size(self) -> int:
        """Elements (numpy's meaning; ``nbytes`` is the bytes)."""
        return count_of(self.shape)

    @property
    def ndim(self) -> int:
        """Dimensions of its shape."""
        return len(self.shape)

    @property
    def itemsize(self) -> int:
        """Bytes of an element."""
        return self.dtype.itemsize


__all__ = ["DType", "bfloat16", "bool_", "dtype", "float16", "float32", "float64",
           "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "int8",
           "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]


def contiguous_strides(shape: Tuple[int, ...], itemsize: int) -> Tuple[int, ...]:
    """Byte strides of a row-major (C) array of ``shape``."""
    strides = []
    step = itemsize
    for d in reversed(shape):
        strides.append(step)
        step *= max(d, 1)
    return tuple(reversed(strides))


def is_contiguous(shape: Tuple[int, ...], strides: Tuple[int, ...], itemsize: int) -> bool:
    """Whether byte ``strides`` pack an array of ``shape`` in row-major order."""
    if 0 in shape:
        return True
    step = itemsize
    for d, s in zip(reversed(shape), reversed(strides)):
        if d != 1 and s != step:
            return False
        step *= d
    return True


def extent(shape: Tuple[int, ...], strides: Tuple[int, ...], itemsize: int) -> int:
    """Bytes from an array's first element to the end of its last."""
    if 0 in shape:
        return 0
    return sum((d - 1) * s for d, s in zip(shape, strides)) + itemsize


_STRUCT_CODES = {"bool": "?", "int8": "b", "int16": "h", "int32": "i", "int64": "q",
                 "uint8": "B", "uint16": "H", "uint32": "I", "uint64": "Q", "float16": "e",
                 "float32": "f", "float64": "d"}


def element_bytes(value: Any, d: DType) -> bytes:
    """The bytes of one element of ``d`` holding ``value`` (a number; for
    integer and bool types an integral one), as the device stores it
    (little-endian; bfloat16 rounded to nearest even). Raises the client's
    error for a value the type cannot hold. Needs no numpy."""
    import struct  # pylint: disable=import-outside-toplevel
    shown = repr(value)
    shown = shown if len(shown) <= _MAX_NAME else shown[:_MAX_NAME - 3] + "..."
    if d.is_floating_point:
        try:
            v = float(value)
        except (TypeError, ValueError):
            raise client_error(f"a {d} value must be a number, got {shown}") from None
        if d is bfloat16:
            if v != v:  # NaN: a quiet one
                return struct.pack("<H", 0x7FC0)
            try:
                bits = struct.unpack("<I", struct.pack("<f", v))[0]
            except OverflowError:
                raise client_error(f"{shown} is out of the range of {d}: give a value it "
                                   "holds, or another dtype") from None
            return struct.pack("<H", (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16)
        code = _STRUCT_CODES.get(d.name)
        if code is None:
            raise client_error(f"a {d} value cannot be made here (numpy has no {d}): upload "
                               "an array of it instead (ml_dtypes makes one)")
    else:
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if not hasattr(value, "__index__"):
            raise client_error(f"a {d} value must be an integer, got {shown} (or choose a "
                               "float dtype)")
        v = value.__index__()
        if d is bool_ and v not in (0, 1):
            raise client_error(f"a bool value must be True, False, 0 or 1, got {shown}")
        code = _STRUCT_CODES[d.name]
    try:
        return struct.pack("<" + code, v)
    except (OverflowError, struct.error):
        raise client_error(f"{shown} is out of the range of {d}: give a value it holds, "
                           "or another dtype") from None
