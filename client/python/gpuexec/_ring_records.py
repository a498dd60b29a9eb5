"""Command ring records' bodies (proto/gpuexec/command_ring.h), written
from the client's own objects without a protobuf message: a launch's fixed
part is packed once per geometry and kept by its Function, a buffer's
argument slot once per Buffer. None for a command the ring has no form for
(too many arguments, a parameter block past 32764 bytes, a tensor map of a
shape the record does not hold): it goes on the Execute stream, which names
what is wrong.
"""

from __future__ import annotations

import struct
from typing import Any, List, Optional, Sequence, Tuple

from . import _ring

# LaunchBody up to cluster_policy (56 bytes), then nargs, reserved, blob_bytes.
LAUNCH_FIXED = struct.Struct("<Q3I3I3IIII")
LAUNCH_COUNTS = struct.Struct("<HHI")
SLOT = struct.Struct("<HHIQQ")  # ArgSlot, 24 bytes
TENSOR_MAP = struct.Struct("<QQiI5Q4Q5I5IIIII")  # TensorMapBody, 152 bytes
MEMSET = struct.Struct("<QQQII")
COPY_BUFFER = struct.Struct("<QQQQQ")
REGION_COPY = struct.Struct("<QQQQQII")
ONE = struct.Struct("<Q")  # Allocate, Free, ReleaseRegion
LAUNCH_GRAPH = struct.Struct("<QIHHII")  # LaunchGraphBody, 24 bytes
PATCH_HEAD = struct.Struct("<II")  # a PatchSlot's node and argument; an ArgSlot follows
_DOUBLE = struct.Struct("<d")
_DOUBLE_BITS = struct.Struct("<Q")

# LaunchBody.flags
SYNCHRONIZE = 1
COOPERATIVE = 2
PROGRAMMATIC_DEPENDENT = 4
NON_PORTABLE_CLUSTER = 8

_U64 = (1 << 64) - 1
MAX_PARAM_BLOCK_BYTES = _ring.MAX_PARAM_BLOCK_BYTES
# The most argument slots a record holds, with no blob.
MAX_ARGS = (_ring.MAX_RECORD_BYTES - _ring.HEAD.size - 64) // SLOT.size

ARG_KINDS = {
    "buffer": 1, "null_pointer": 2, "i8": 3, "i16": 4, "i32": 5, "i64": 6, "u8": 7, "u16": 8,
    "u32": 9, "u64": 10, "f16": 11, "bf16": 12, "f32": 13, "f64": 14, "f16_bits": 15,
    "bf16_bits": 16, "raw": 17, "tensor_map": 18,
}
_FLOATS = frozenset(("f16", "bf16", "f32", "f64"))
_NULL_SLOT = SLOT.pack(2, 0, 0, 0, 0)


def launch_fixed(function: int, grid: Sequence[int], block: Sequence[int],
                 cluster: Optional[Sequence[int]], shared: int,
                 attributes: Tuple[bool, bool, bool, int], sync: bool) -> bytes:
    """A launch body's first 56 bytes (all but the counts); ``attributes``
    as _function._launch_attributes returns them (cooperative, pdl,
    non_portable_cluster, cluster_policy)."""
    cooperative, pdl, non_portable, policy = attributes
    flags = ((SYNCHRONIZE if sync else 0) | (COOPERATIVE if cooperative else 0)
             | (PROGRAMMATIC_DEPENDENT if pdl else 0)
             | (NON_PORTABLE_CLUSTER if non_portable else 0))
    c = cluster if cluster is not None else (0, 0, 0)
    return LAUNCH_FIXED.pack(function, *grid, *block, *c, shared, flags, policy)


_INT_CODES = {(8, True): 3, (16, True): 4, (32, True): 5, (64, True): 6, (8, False): 7,
              (16, False): 8, (32, False): 9, (64, False): 10}


def int_slot(bits: int, signed: bool, value: int) -> bytes:
    """The slot of an integer of ``bits`` already checked in range."""
    return SLOT.pack(_INT_CODES[(bits, signed)], 0, 0, value & _U64, 0)


def buffer_slot(handle: int, offset: int) -> bytes:
    return SLOT.pack(1, 0, 0, handle, offset)


def tensor_map_body(m: Any, data_type: int) -> Optional[bytes]:
    """A TensorMap's TensorMapBody, or None where the record's fixed form
    does not hold it (the daemon's refusal on the stream names why)."""
    rank = len(m.global_dims)
    element_strides = tuple(m.element_strides)
    if not 1 <= rank <= 5 or len(m.global_strides) != rank - 1 or len(m.box_dims) != rank:
        return None
    if element_strides and (len(element_strides) != rank or not any(element_strides)):
        return None

    def padded(values: Sequence[int], n: int) -> List[int]:
        return list(values) + [0] * (n - len(values))

    try:
        return TENSOR_MAP.pack(m.handle, m.offset, data_type, rank, *padded(m.global_dims, 5),
                               *padded(m.global_strides, 4), *padded(m.box_dims, 5),
                               *padded(element_strides, 5), m.interleave, m.swizzle,
                               m.l2_promotion, m.oob_fill)
    except struct.error:  # a value past its field: the stream names it
        return None


def arg_slot(arg: Any, blob: List[bytes], blob_at: List[int]) -> Optional[bytes]:
    """The slot of ``arg`` (an Arg); a raw argument's bytes or a tensor
    map's body go to ``blob`` at ``blob_at[0]`` (advanced, 8-aligned)."""
    kind = arg.kind
    code = ARG_KINDS.get(kind)
    if code is None:
        return None
    if kind == "buffer":
        return SLOT.pack(1, 0, 0, arg.value, arg.offset)
    if kind == "null_pointer":
        return _NULL_SLOT
    if kind in _FLOATS:
        return SLOT.pack(code, 0, 0, _DOUBLE_BITS.unpack(_DOUBLE.pack(arg.value))[0], 0)
    if kind == "raw":
        data = arg.value
        at = blob_at[0]
        blob.append(data)
        pad = -len(data) % 8
        if pad:
            blob.append(bytes(pad))
        blob_at[0] = at + len(data) + pad
        return SLOT.pack(code, 0, len(data), at, 0)
    if kind == "tensor_map":
        m = arg.value
        body = m._ring_body()
        if body is None:
            return None
        at = blob_at[0]
        blob.append(body)
        blob_at[0] = at + len(body)
        return SLOT.pack(code, 0, 0, at, 0)
    try:
        return SLOT.pack(code, 0, 0, arg.value & _U64, 0)
    except (TypeError, struct.error):
        return None


def launch_body(fixed: bytes, slots: List[bytes], blob: List[bytes],
                blob_bytes: int) -> Optional[bytes]:
    """A launch's body from its fixed part, argument slots and blob; None
    where a record cannot hold it (its blob, 8-aligned, counts against a
    kernel's parameter block: a launch near that bound goes on the stream,
    which knows the kernel's own)."""
    nargs = len(slots)
    if nargs > MAX_ARGS or blob_bytes > MAX_PARAM_BLOCK_BYTES:
        return None
    if _ring.HEAD.size + 64 + nargs * SLOT.size + blob_bytes > _ring.MAX_RECORD_BYTES:
        return None
    return b"".join((fixed, LAUNCH_COUNTS.pack(nargs, 0, blob_bytes), *slots, *blob))



def launch_graph_body(graph: int, patches: Sequence[Tuple[int, int, Any]],
                      sync: bool) -> Optional[bytes]:
    """A replay's body: ``patches`` as (node, argument, Arg) triples; None
    where a record cannot hold them (the stream carries the replay)."""
    blob: List[bytes] = []
    blob_at = [0]
    slots: List[bytes] = []
    for node, argument, arg in patches:
        slot = arg_slot(arg, blob, blob_at)
        if slot is None:
            return None
        try:
            slots.append(PATCH_HEAD.pack(node, argument) + slot)
        except struct.error:
            return None
    n = len(slots)
    if (_ring.HEAD.size + LAUNCH_GRAPH.size + n * (PATCH_HEAD.size + SLOT.size) + blob_at[0]
            > _ring.MAX_RECORD_BYTES):
        return None
    fixed = LAUNCH_GRAPH.pack(graph, SYNCHRONIZE if sync else 0, n, 0, blob_at[0], 0)
    return b"".join((fixed, *slots, *blob))


def memset(buffer: int, offset: int, size: int, value: int) -> bytes:
    return MEMSET.pack(buffer, offset, size, value, 0)


def copy_buffer(dst: int, dst_offset: int, src: int, src_offset: int, size: int) -> bytes:
    return COPY_BUFFER.pack(dst, dst_offset, src, src_offset, size)


def region_copy(region: int, region_offset: int, buffer: int, buffer_offset: int, size: int,
                direction: int) -> bytes:
    """``direction``: 1 region -> buffer, 2 buffer -> region (the proto's
    RegionCopyRequest.Direction numbers, which the record shares)."""
    return REGION_COPY.pack(region, region_offset, buffer, buffer_offset, size, direction, 0)


def one(value: int) -> bytes:
    return ONE.pack(value)
