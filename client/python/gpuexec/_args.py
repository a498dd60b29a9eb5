"""Typed kernel arguments.

The daemon packs each argument at its parameter's offset after checking its
size against the kernel's real layout. Besides the ``Arg`` values made by the
functions here, ``Function.launch`` accepts: a ``Buffer`` (its address), a
``TensorMap`` (a CUtensorMap the daemon encodes), None
(a null pointer), bytes-like objects (by-value bytes), numpy scalars (their
own type) and plain ``int``/``float`` (typed by the parameter's size: an int
becomes the signed or unsigned integer of that size, a float becomes f32 or
f64; a 2-byte float parameter needs an explicit ``f16``/``bf16``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, SupportsFloat, SupportsIndex, Tuple

from ._errors import client_error
from .v1 import gpuexec_pb2 as pb

if TYPE_CHECKING:
    from ._buffer import Buffer

_INT_RANGES = {
    "i8": (-(1 << 7), (1 << 7) - 1),
    "i16": (-(1 << 15), (1 << 15) - 1),
    "i32": (-(1 << 31), (1 << 31) - 1),
    "i64": (-(1 << 63), (1 << 63) - 1),
    "u8": (0, (1 << 8) - 1),
    "u16": (0, (1 << 16) - 1),
    "u32": (0, (1 << 32) - 1),
    "u64": (0, (1 << 64) - 1),
}
_FLOAT_KINDS = ("f16", "bf16", "f32", "f64")
_SIZES = {"i8": 1, "u8": 1, "i16": 2, "u16": 2, "f16": 2, "bf16": 2, "f16_bits": 2,
          "bf16_bits": 2, "i32": 4, "u32": 4, "f32": 4, "i64": 8, "u64": 8, "f64": 8,
          "buffer": 8, "null_pointer": 8, "tensor_map": 128}
# The gpuexec.v1.Arg field of each kind whose name differs: half and
# bfloat16 values travel as doubles, so that the daemon rounds them once.
_FIELDS = {"f16": "f16_value", "bf16": "bf16_value"}


class Arg:
    """One typed kernel argument; make it with i32(), f32(), ptr(), raw() ..."""

    __slots__ = ("kind", "value", "offset")
    kind: str  # "i32", "f32", "buffer", "raw", "tensor_map" ...
    value: Any  # the number, the buffer's handle, the bytes, the TensorMap
    offset: int  # bytes past a buffer's address

    def __init__(self, kind: str, value: Any = None, offset: int = 0) -> None:
        self.kind = kind
        self.value = value
        self.offset = offset

    @property
    def size(self) -> int:
        """Bytes the argument occupies in the kernel's parameter block."""
        return len(self.value) if self.kind == "raw" else _SIZES[self.kind]

    def to_proto(self) -> Any:
        """The wire form (gpuexec.v1.Arg)."""
        if self.kind == "buffer":
            return pb.Arg(buffer=pb.BufferArg(buffer=self.value, offset=self.offset))
        if self.kind == "null_pointer":
            return pb.Arg(null_pointer=True)
        if self.kind == "tensor_map":
            return pb.Arg(tensor_map=self.value.to_proto())
        return pb.Arg(**{_FIELDS.get(self.kind, self.kind): self.value})

    def __repr__(self) -> str:
        if self.kind == "buffer":
            return f"ptr(buffer 0x{self.value:x} + {self.offset})"
        if self.kind == "null_pointer":
            return "null()"
        if self.kind == "tensor_map":
            return repr(self.value)
        return f"{self.kind}({self.value!r})"

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Arg) and self.kind == other.kind and self.value == other.value
                and self.offset == other.offset)

    def __hash__(self) -> int:
        return hash((self.kind, self.value, self.offset))


def _int(kind: str, value: Any) -> Arg:
    if isinstance(value, float) or not hasattr(value, "__index__"):
        raise client_error(f"{kind} needs an integer, got {type(value).__name__} {value!r}")
    value = value.__index__()
    lo, hi = _INT_RANGES[kind]
    if not lo <= value <= hi:
        raise client_error(f"{kind} value {value} is out of range [{lo}, {hi}]")
    return Arg(kind, value)


def _float(kind: str, value: Any) -> Arg:
    try:
        return Arg(kind, float(value))
    except (TypeError, ValueError):
        raise client_error(f"{kind} needs a number, got {type(value).__name__} {value!r}") from None


def i8(value: SupportsIndex) -> Arg:
    """An 8-bit signed integer; a value out of its range is an Error."""
    return _int("i8", value)


def i16(value: SupportsIndex) -> Arg:
    """A 16-bit signed integer; a value out of its range is an Error."""
    return _int("i16", value)


def i32(value: SupportsIndex) -> Arg:
    """A 32-bit signed integer; a value out of its range is an Error."""
    return _int("i32", value)


def i64(value: SupportsIndex) -> Arg:
    """A 64-bit signed integer; a value out of its range is an Error."""
    return _int("i64", value)


def u8(value: SupportsIndex) -> Arg:
    """An 8-bit unsigned integer; a value out of its range is an Error."""
    return _int("u8", value)


def u16(value: SupportsIndex) -> Arg:
    """A 16-bit unsigned integer; a value out of its range is an Error."""
    return _int("u16", value)


def u32(value: SupportsIndex) -> Arg:
    """A 32-bit unsigned integer; a value out of its range is an Error."""
    return _int("u32", value)


def u64(value: SupportsIndex) -> Arg:
    """A 64-bit unsigned integer; a value out of its range is an Error."""
    return _int("u64", value)


def f16(value: SupportsFloat) -> Arg:
    """IEEE half; the daemon rounds the value (as a double) once, to nearest
    even. A numpy float16 passes its own bits."""
    if _numpy_half_bits(value) is not None:
        return Arg("f16_bits", _numpy_half_bits(value))
    return _float("f16", value)


def bf16(value: SupportsFloat) -> Arg:
    """bfloat16; the daemon rounds the value (as a double) once, to nearest
    even. An ml_dtypes bfloat16 passes its own bits."""
    bits = _numpy_half_bits(value, "bfloat16")
    if bits is not None:
        return Arg("bf16_bits", bits)
    return _float("bf16", value)


def _numpy_half_bits(value: Any, name: str = "float16") -> Optional[int]:
    """The 16 bits of a numpy scalar of dtype ``name``, else None."""
    dtype = getattr(value, "dtype", None)
    if dtype is None or getattr(dtype, "name", "") != name or dtype.itemsize != 2:
        return None
    return int.from_bytes(value.tobytes(), "little")


def f32(value: SupportsFloat) -> Arg:
    """An IEEE single (float)."""
    return _float("f32", value)


def f64(value: SupportsFloat) -> Arg:
    """An IEEE double."""
    return _float("f64", value)


def raw(data: bytes | bytearray | memoryview) -> Arg:
    """By-value bytes: a struct, a 128-byte CUtensorMap ..."""
    return Arg("raw", bytes(data))


def null() -> Arg:
    """A null device pointer (8 bytes of zero)."""
    return Arg("null_pointer", True)


def ptr(buffer: Buffer, offset: int = 0) -> Arg:
    """The device address of ``buffer`` plus ``offset`` bytes."""
    return buffer.ptr(offset)


def _from_numpy(value: Any) -> Arg:
    dt = value.dtype
    # Halves pass their bits: no rounding at all.
    if dt.name == "float16" and dt.itemsize == 2:
        return Arg("f16_bits", _numpy_half_bits(value))
    if dt.name == "bfloat16" and dt.itemsize == 2:  # ml_dtypes, where installed
        return Arg("bf16_bits", _numpy_half_bits(value, "bfloat16"))
    if dt.kind == "f" and dt.itemsize in (4, 8):
        return Arg({4: "f32", 8: "f64"}[dt.itemsize], float(value))
    if dt.kind in "iu" and dt.itemsize in (1, 2, 4, 8):
        return _int(f"{dt.kind}{dt.itemsize * 8}", int(value))
    if dt.kind == "b":
        return Arg("u8", int(bool(value)))
    if dt.kind == "V":  # a structured scalar: its bytes
        return Arg("raw", value.tobytes())
    raise client_error(f"no kernel argument type for numpy {dt}")


def _describe(index: int, param: Optional[Tuple[int, int]],
              kernel: Optional[str] = None) -> str:
    where = f"argument {index}" if kernel is None else f"argument {index} of kernel {kernel}"
    if param is not None:
        where += f" (parameter of {param[1]} bytes at offset {param[0]})"
    return where


def to_arg(value: Any, index: int, param: Optional[Tuple[int, int]],
           kernel: Optional[str] = None) -> Arg:
    """The Arg for launch argument ``index``; ``param`` is (offset, size) or
    None; ``kernel``, the kernel's name as messages show it, or None."""
    if isinstance(value, Arg):
        return value
    as_arg = getattr(value, "_as_kernel_arg", None)
    if as_arg is not None:
        return as_arg()
    if value is None:
        return null()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return Arg("raw", bytes(value))
    if type(value).__module__ == "numpy":
        if getattr(value, "ndim", 0) == 0 and hasattr(value, "dtype"):
            return _from_numpy(value)
        where = f"argument {index}" if kernel is None else f"argument {index} of kernel {kernel}"
        shape = tuple(getattr(value, "shape", ()))
        raise client_error(f"{where}: a numpy array ({getattr(value, 'dtype', '?')}, shape "
                           f"{shape if len(shape) <= 8 else '...'}) is host memory; wrap it "
                           "as gpuexec.In(x), Out(x) or InOut(x) to copy it around the "
                           "launch, or upload it with session.asarray(x) and pass the buffer")
    size = None if param is None else param[1]
    if isinstance(value, bool):
        value = int(value)
    if isinstance(value, int):
        if size not in (1, 2, 4, 8):
            raise client_error(f"{_describe(index, param, kernel)}: cannot pass the int {value} "
                               "without a type; use i32(), u64() ...")
        bits = size * 8
        kind = f"i{bits}" if -(1 << (bits - 1)) <= value < (1 << (bits - 1)) else f"u{bits}"
        try:
            return _int(kind, value)
        except Exception:
            raise client_error(f"{_describe(index, param, kernel)}: {value} does not fit in "
                               f"{size} bytes") from None
    if isinstance(value, float):
        if size == 4:
            return Arg("f32", value)
        if size == 8:
            return Arg("f64", value)
        hint = "; use f16() or bf16()" if size == 2 else ""
        raise client_error(f"{_describe(index, param, kernel)}: cannot pass the float {value} "
                           f"without a type{hint}")
    raise client_error(f"{_describe(index, param, kernel)}: {type(value).__name__[:60]} is not "
                       "a kernel argument (use a Buffer, TensorMap, None, bytes, or i32(), "
                       "f32() ...)")


__all__ = ["Arg", "i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64", "f16", "bf16", "f32",
           "f64", "raw", "null", "ptr", "to_arg"]
