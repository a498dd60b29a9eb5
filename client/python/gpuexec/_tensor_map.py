"""TMA tensor maps as kernel arguments.

A kernel that takes a ``const __grid_constant__ CUtensorMap`` (a TMA
descriptor, 128 bytes by value) needs the device address of its tensor,
which clients never see: a ``TensorMap`` names a buffer and byte offset
instead, with the other fields of cuTensorMapEncodeTiled, and the daemon
encodes the map on the buffer's device at each launch. The client checks
types and counts; the daemon checks the values against the driver's rules
and checks that every element the map spans lies inside the buffer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Iterable, Optional, Tuple, Union

from . import _ring_records, _wire
from ._args import Arg
from ._errors import client_error
from .v1 import gpuexec_pb2 as pb

if TYPE_CHECKING:
    from ._buffer import Buffer

_TM = pb.TensorMapArg

# An option's value: a name ("128b", "SWIZZLE_128B"), a byte count, or None
# for the default.
Option = Union[str, int, None]

# Accepted spellings of each data type (lower case) -> TensorMapArg.DataType
# name. int8 and int16 travel as their unsigned types, as Triton passes
# them: a TMA copy moves bits.
_DATA_TYPES: Dict[str, str] = {}
for _name, _aliases in {
        "UINT8": ("uint8", "u8", "int8", "i8"),
        "UINT16": ("uint16", "u16", "int16", "i16"),
        "UINT32": ("uint32", "u32"),
        "INT32": ("int32", "i32"),
        "UINT64": ("uint64", "u64"),
        "INT64": ("int64", "i64"),
        "FLOAT16": ("float16", "fp16", "half", "f16"),
        "FLOAT32": ("float32", "fp32", "f32"),
        "FLOAT64": ("float64", "fp64", "f64"),
        "BFLOAT16": ("bfloat16", "bf16"),
        "FLOAT32_FTZ": ("float32_ftz",),
        "TFLOAT32": ("tfloat32", "tf32"),
        "TFLOAT32_FTZ": ("tfloat32_ftz", "tf32_ftz"),
}.items():
    _DATA_TYPES[_name.lower()] = _name
    for _alias in _aliases:
        _DATA_TYPES[_alias] = _name

# Bytes of an element of each data type.
ELEMENT_BYTES = {"UINT8": 1, "UINT16": 2, "UINT32": 4, "INT32": 4, "UINT64": 8, "INT64": 8,
                 "FLOAT16": 2, "FLOAT32": 4, "FLOAT64": 8, "BFLOAT16": 2, "FLOAT32_FTZ": 4,
                 "TFLOAT32": 4, "TFLOAT32_FTZ": 4}

# Each option's accepted values (lower case; None means the first) -> its
# enum value. Byte counts are accepted as ints too.
_OPTIONS: Dict[str, Dict[Union[str, int], int]] = {
    "interleave": {"none": _TM.INTERLEAVE_NONE, "16b": _TM.INTERLEAVE_16B,
                   "32b": _TM.INTERLEAVE_32B, 0: _TM.INTERLEAVE_NONE, 16: _TM.INTERLEAVE_16B,
                   32: _TM.INTERLEAVE_32B},
    "swizzle": {"none": _TM.SWIZZLE_NONE, "32b": _TM.SWIZZLE_32B, "64b": _TM.SWIZZLE_64B,
                "128b": _TM.SWIZZLE_128B, 0: _TM.SWIZZLE_NONE, 32: _TM.SWIZZLE_32B,
                64: _TM.SWIZZLE_64B, 128: _TM.SWIZZLE_128B},
    "l2_promotion": {"none": _TM.L2_PROMOTION_NONE, "64b": _TM.L2_PROMOTION_64B,
                     "128b": _TM.L2_PROMOTION_128B, "256b": _TM.L2_PROMOTION_256B,
                     0: _TM.L2_PROMOTION_NONE, 64: _TM.L2_PROMOTION_64B,
                     128: _TM.L2_PROMOTION_128B, 256: _TM.L2_PROMOTION_256B},
    "oob_fill": {"zero": _TM.OOB_FILL_ZERO, "nan": _TM.OOB_FILL_NAN_REQUEST_ZERO_FMA},
}
# The enum's own names are accepted as well ("SWIZZLE_128B", ...).
for _what, _enum in (("interleave", _TM.Interleave), ("swizzle", _TM.Swizzle),
                     ("l2_promotion", _TM.L2Promotion), ("oob_fill", _TM.OobFill)):
    for _name, _value in _enum.items():
        _OPTIONS[_what][_name.lower()] = _value
_OPTION_ENUMS = {"interleave": _TM.Interleave, "swizzle": _TM.Swizzle,
                 "l2_promotion": _TM.L2Promotion, "oob_fill": _TM.OobFill}

_U32 = (1 << 32) - 1
_U64 = (1 << 64) - 1
MAX_RANK = 5


def data_type_name(dtype: Any) -> str:
    """The TensorMapArg.DataType name for ``dtype``: a name such as
    "float16", "bfloat16", "tf32" or "FLOAT16" (the enum's), or a numpy
    dtype (or anything numpy.dtype() takes)."""
    if isinstance(dtype, str):
        name = _DATA_TYPES.get(dtype.strip().lower())
        if name is None:
            raise client_error(f"TensorMap: unknown dtype {dtype!r}; expected one of "
                               f"{', '.join(sorted(ELEMENT_BYTES))} (or numpy names such as "
                               "'float16', 'bfloat16', 'tf32')")
        return name
    name = getattr(dtype, "name", None)  # a numpy dtype (ml_dtypes' bfloat16 too)
    if not isinstance(name, str):
        try:
            import numpy
            name = numpy.dtype(dtype).name
        except Exception:  # pylint: disable=broad-except
            raise client_error(f"TensorMap: dtype {dtype!r} is not a data type name or "
                               "numpy dtype") from None
    if name not in _DATA_TYPES:
        raise client_error(f"TensorMap: no tensor map data type for {name}")
    return _DATA_TYPES[name]


def _option(what: str, value: Option) -> int:
    if value is None:
        value = 0 if what != "oob_fill" else "zero"
    key = value.strip().lower() if isinstance(value, str) else value
    if isinstance(key, bool) or not isinstance(key, (str, int)) or key not in _OPTIONS[what]:
        names = [k for k in _OPTIONS[what] if isinstance(k, str) and "_" not in k]
        raise client_error(f"TensorMap: {what} must be one of {', '.join(map(repr, names))} "
                           f"(or {_OPTION_ENUMS[what].DESCRIPTOR.name}'s names), got {value!r}")
    return _OPTIONS[what][key]


def _ints(what: str, values: Iterable[Any], limit: int, minimum: int = 0) -> Tuple[int, ...]:
    try:
        out = tuple(v.__index__() for v in values)
    except (TypeError, AttributeError):
        raise client_error(f"TensorMap: {what} must be a sequence of ints, got {values!r}") \
            from None
    for v in out:
        if not minimum <= v <= limit:
            raise client_error(f"TensorMap: {what} {list(out)}: {v} is out of range "
                               f"[{minimum}, {limit}]")
    return out


class TensorMap:
    """A tensor map (TMA descriptor) over a buffer, passed as a kernel's
    ``const __grid_constant__ CUtensorMap`` parameter (128 bytes by value).

    - ``buffer``: the Buffer holding the tensor; ``offset``: the byte offset
      of its first element from the buffer's (a view's) first byte (16-byte
      aligned in the allocation).
    - ``dtype``: "uint8", "uint16", "uint32", "int32", "uint64", "int64",
      "float16", "float32", "float64", "bfloat16", "float32_ftz", "tf32",
      "tf32_ftz" (or Triton's short names "fp16", "bf16" ..., the
      TensorMapArg.DataType names "FLOAT16" ..., or a numpy dtype; int8 and
      int16 are moved as uint8 and uint16).
    - ``global_dims``: elements along each dimension, innermost (contiguous)
      first as in the driver's API; the rank is their count (1 to 5).
    - ``global_strides``: bytes between consecutive elements of dimensions
      1 .. rank-1 (rank-1 entries; the innermost is contiguous). rank
      entries whose first is the element size are accepted too (numpy's
      ``array.strides[::-1]``).
    - ``box_dims``: the box (tile) a TMA operation moves, rank entries,
      innermost first.
    - ``element_strides``: rank entries; None: all 1.
    - ``interleave``: "none" (the default; the daemon refuses "16b" and
      "32b", interleaved layouts); ``swizzle``: "none"
      (default), "32b", "64b", "128b"; ``l2_promotion``: "none" (default),
      "64b", "128b", "256b" (byte counts as ints are accepted for these
      three, and the enum names such as "SWIZZLE_128B"); ``oob_fill``:
      "zero" (default) or "nan" (out-of-bounds elements read as NaN).

    Immutable; pass it where a kernel argument goes. The daemon checks the
    values against the driver's rules and the map's extent against the
    buffer, and encodes the map on the buffer's device at each launch.
    """

    __slots__ = ("buffer", "handle", "offset", "data_type", "global_dims", "global_strides",
                 "box_dims", "element_strides", "interleave", "swizzle", "l2_promotion",
                 "oob_fill", "_field", "_key")

    def __init__(self, buffer: Buffer, dtype: Any, global_dims: Iterable[int],
                 global_strides: Iterable[int], box_dims: Iterable[int],
                 element_strides: Optional[Iterable[int]] = None, *, offset: int = 0,
                 interleave: Option = "none", swizzle: Option = "none",
                 l2_promotion: Option = "none", oob_fill: Option = "zero") -> None:
        handle = getattr(buffer, "handle", None)
        if not isinstance(handle, int) or isinstance(handle, bool):
            raise client_error(f"TensorMap needs a gpuexec Buffer, got {type(buffer).__name__}")
        if isinstance(offset, bool) or not hasattr(offset, "__index__") or offset.__index__() < 0:
            raise client_error(f"TensorMap: offset must be a non-negative int, got {offset!r}")
        self.buffer = buffer
        self.handle = handle
        self.offset = offset.__index__() + getattr(buffer, "offset", 0)  # a view's start
        self.data_type = data_type_name(dtype)
        self.global_dims = _ints("global_dims", global_dims, _U64)
        rank = len(self.global_dims)
        if not 1 <= rank <= MAX_RANK:
            raise client_error(f"TensorMap: global_dims {list(self.global_dims)} has rank "
                               f"{rank}; a tensor map has rank 1 to {MAX_RANK}")
        strides = _ints("global_strides", global_strides, _U64)
        element_bytes = ELEMENT_BYTES[self.data_type]
        if len(strides) == rank and strides and strides[0] == element_bytes:
            strides = strides[1:]
        if len(strides) != rank - 1:
            raise client_error(
                f"TensorMap: global_strides {list(strides)} for rank {rank}: give the "
                f"{rank - 1} byte strides of dimensions 1 .. {rank - 1} (or {rank} whose "
                f"first is the element size, {element_bytes})")
        self.global_strides = strides
        self.box_dims = _ints("box_dims", box_dims, _U32)
        if len(self.box_dims) != rank:
            raise client_error(f"TensorMap: box_dims {list(self.box_dims)} has "
                               f"{len(self.box_dims)} entries; the rank is {rank}")
        self.element_strides: Tuple[int, ...]
        if element_strides is None:
            self.element_strides = ()
        else:
            self.element_strides = _ints("element_strides", element_strides, _U32)
            if len(self.element_strides) != rank:
                raise client_error(f"TensorMap: element_strides {list(self.element_strides)} "
                                   f"has {len(self.element_strides)} entries; the rank is {rank}")
        self.interleave = _option("interleave", interleave)
        self.swizzle = _option("swizzle", swizzle)
        self.l2_promotion = _option("l2_promotion", l2_promotion)
        self.oob_fill = _option("oob_fill", oob_fill)
        self._key = (self.handle, self.offset, self.data_type, self.global_dims,
                     self.global_strides, self.box_dims, self.element_strides, self.interleave,
                     self.swizzle, self.l2_promotion, self.oob_fill)
        self._field: Optional[bytes] = None

    def __setattr__(self, name: str, value: Any) -> None:
        if name != "_field" and hasattr(self, "_key"):
            raise AttributeError("a TensorMap is immutable; make another")
        object.__setattr__(self, name, value)

    def __repr__(self) -> str:
        options = []
        for what, enum in _OPTION_ENUMS.items():
            value = getattr(self, what)
            if value:
                options.append(f", {what}={enum.Name(value)}")
        strides = f", element_strides={list(self.element_strides)}" if self.element_strides else ""
        return (f"TensorMap(buffer 0x{self.handle:x} + {self.offset}, {self.data_type}, "
                f"global_dims={list(self.global_dims)}, "
                f"global_strides={list(self.global_strides)}, box_dims={list(self.box_dims)}"
                f"{strides}{''.join(options)})")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TensorMap) and self._key == other._key

    def __hash__(self) -> int:
        return hash(self._key)

    def to_proto(self) -> Any:
        """The wire form (gpuexec.v1.TensorMapArg)."""
        return _TM(**{"global": pb.BufferArg(buffer=self.handle, offset=self.offset)},
                   data_type=_TM.DataType.Value(self.data_type), global_dims=self.global_dims,
                   global_strides=self.global_strides, box_dims=self.box_dims,
                   element_strides=self.element_strides, interleave=self.interleave,
                   swizzle=self.swizzle, l2_promotion=self.l2_promotion, oob_fill=self.oob_fill)

    def _wire_bytes(self) -> bytes:
        """The serialized gpuexec.v1.TensorMapArg."""
        return _wire.tensor_map_bytes(
            self.handle, self.offset, _TM.DataType.Value(self.data_type), self.global_dims,
            self.global_strides, self.box_dims, self.element_strides, self.interleave,
            self.swizzle, self.l2_promotion, self.oob_fill)

    def _as_kernel_arg(self) -> Arg:
        return Arg("tensor_map", self)

    def _ring_body(self) -> Optional[bytes]:
        """This map as a command ring record's TensorMapBody, or None where
        the record's fixed form does not hold it."""
        return _ring_records.tensor_map_body(self, _TM.DataType.Value(self.data_type))

    @property
    def _launch_field(self) -> bytes:
        """This map as a LaunchRequest's argument field, made once."""
        field = self._field
        if field is None:
            field = self._field = _wire.launch_arg_field(self._as_kernel_arg())
        return field


__all__ = ["TensorMap"]
