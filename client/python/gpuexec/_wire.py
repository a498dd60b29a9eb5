"""The command stream's messages written as bytes, without a protobuf object
per launch. A launch's fixed part (function, grid, block,
shared memory, cluster) is serialized once by protobuf and kept by its
Function, and so are its attributes (cooperative, programmatic dependent
launch, cluster options), which protobuf writes after the arguments; each
argument is written here (the tests compare every kind with protobuf's own
bytes), and a Command and an ExecuteRequest are their fields' bytes joined.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, Any, Callable, Dict, Optional, Sequence

from .v1 import gpuexec_pb2 as pb

if TYPE_CHECKING:
    from ._args import Arg

# Writes one kind of Arg.
Encoder = Callable[["Arg"], bytes]

_U64 = (1 << 64) - 1
# Small varints, looked up rather than computed.
_SMALL = [bytes((i,)) for i in range(128)]


def varint(value: int) -> bytes:
    """The protobuf varint of a non-negative int below 2**64."""
    if value < 128:
        return _SMALL[value]
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def field_bytes(key: bytes, data: bytes) -> bytes:
    """A length-delimited field: its key byte, the length and ``data``."""
    return b"".join((key, varint(len(data)), data))


def _signed(key: bytes) -> Encoder:
    return lambda arg: key + varint(arg.value & _U64)


def _unsigned(key: bytes) -> Encoder:
    return lambda arg: key + varint(arg.value)


def _fixed(key: bytes, fmt: str) -> Encoder:
    def encode(arg: Arg) -> bytes:
        try:
            return key + struct.pack(fmt, arg.value)
        except (OverflowError, struct.error):  # beyond the type's range: as protobuf stores it
            return arg.to_proto().SerializeToString()
    return encode


def _buffer(arg: Arg) -> bytes:
    inner = b"\x08" + varint(arg.value) if arg.value else b""
    if arg.offset:
        inner += b"\x10" + varint(arg.offset)
    return field_bytes(b"\x0a", inner)


def _packed(key: bytes, values: Sequence[int]) -> bytes:
    """A packed repeated varint field; nothing when empty (as protobuf)."""
    if not values:
        return b""
    return field_bytes(key, b"".join(varint(v) for v in values))


def _enum(key: bytes, value: int) -> bytes:
    return key + varint(value) if value else b""


def tensor_map_bytes(buffer: int, offset: int, data_type: int, global_dims: Sequence[int],
                     global_strides: Sequence[int], box_dims: Sequence[int],
                     element_strides: Sequence[int], interleave: int, swizzle: int,
                     l2_promotion: int, oob_fill: int) -> bytes:
    """A serialized gpuexec.v1.TensorMapArg (enums as their numbers)."""
    inner = b"\x08" + varint(buffer) if buffer else b""
    if offset:
        inner += b"\x10" + varint(offset)
    return b"".join((
        field_bytes(b"\x0a", inner),  # global: always present
        _enum(b"\x10", data_type),
        _packed(b"\x1a", global_dims), _packed(b"\x22", global_strides),
        _packed(b"\x2a", box_dims), _packed(b"\x32", element_strides),
        _enum(b"\x38", interleave), _enum(b"\x40", swizzle), _enum(b"\x48", l2_promotion),
        _enum(b"\x50", oob_fill)))


# gpuexec.v1.Arg: one field of its oneof, by kind (field number, wire type).
_ENCODE: Dict[str, Encoder] = {
    "buffer": _buffer,
    "i8": _signed(b"\x10"), "i16": _signed(b"\x18"), "i32": _signed(b"\x20"),
    "i64": _signed(b"\x28"),
    "u8": _unsigned(b"\x30"), "u16": _unsigned(b"\x38"), "u32": _unsigned(b"\x40"),
    "u64": _unsigned(b"\x48"),
    # f16 and bf16 values as doubles (f16_value = 16, bf16_value = 17), their
    # bits as varints (f16_bits = 18, bf16_bits = 19).
    "f16": _fixed(b"\x81\x01", "<d"), "bf16": _fixed(b"\x89\x01", "<d"),
    "f16_bits": _unsigned(b"\x90\x01"), "bf16_bits": _unsigned(b"\x98\x01"),
    "f32": _fixed(b"\x65", "<f"), "f64": _fixed(b"\x69", "<d"),
    "raw": lambda arg: field_bytes(b"\x72", arg.value),
    "null_pointer": lambda arg: b"\x78\x01",
    # tensor_map = 20: the map's own bytes (a TensorMap writes them).
    "tensor_map": lambda arg: field_bytes(b"\xa2\x01", arg.value._wire_bytes()),
}


def arg_bytes(arg: Arg) -> bytes:
    """The serialized gpuexec.v1.Arg of an ``Arg``."""
    return _ENCODE[arg.kind](arg)


def launch_arg_field(arg: Arg) -> bytes:
    """``arg`` as a LaunchRequest's ``args`` field (number 7)."""
    return field_bytes(b"\x3a", arg_bytes(arg))


def launch_head(function: int, grid: Any, block: Any, shared: int,
                cluster: Optional[Any]) -> bytes:
    """A LaunchRequest's fixed part, serialized by protobuf: ``grid``,
    ``block`` and ``cluster`` are pb.Dim3 (cluster may be None)."""
    request = pb.LaunchRequest(function=function, grid=grid, block=block,
                               shared_memory_bytes=shared)
    if cluster is not None:
        request.cluster.CopyFrom(cluster)
    return request.SerializeToString()


LAUNCH_SYNCHRONIZE = b"\x40\x01"  # LaunchRequest.synchronize = true


def launch_attributes(cooperative: bool, pdl: bool, non_portable_cluster: bool,
                      cluster_policy: int) -> bytes:
    """A LaunchRequest's fields 9 to 12 (cooperative,
    programmatic_dependent_launch, non_portable_cluster,
    cluster_scheduling_policy), which follow ``synchronize``."""
    return b"".join((b"\x48\x01" if cooperative else b"", b"\x50\x01" if pdl else b"",
                     b"\x58\x01" if non_portable_cluster else b"",
                     _enum(b"\x60", cluster_policy)))


def launch_op(launch_request_bytes: bytes) -> bytes:
    """A Command's ``launch`` field (number 3)."""
    return field_bytes(b"\x1a", launch_request_bytes)


def region_copy_op(region: int, region_offset: int, buffer: int, buffer_offset: int, size: int,
                   direction: int) -> bytes:
    """A Command's ``region_copy`` field (number 9): a copy between a host
    memory region and a buffer (``direction``: a RegionCopyRequest.Direction)."""
    request = pb.RegionCopyRequest(region=region, region_offset=region_offset, buffer=buffer,
                                   buffer_offset=buffer_offset, size=size, direction=direction)
    return field_bytes(b"\x4a", request.SerializeToString())


def release_region_op(region: int) -> bytes:
    """A Command's ``release_region`` field (number 10)."""
    return field_bytes(b"\x52", pb.ReleaseRegionRequest(region=region).SerializeToString())


def memset_op(buffer: int, offset: int, size: int, value: int) -> bytes:
    """A Command's ``memset`` field (number 7): ``size`` bytes of ``buffer``
    from ``offset`` set to the byte ``value``."""
    request = pb.MemsetRequest(buffer=buffer, offset=offset, size=size, value=value)
    return field_bytes(b"\x3a", request.SerializeToString())


SYNCHRONIZE_OP = b"\x22\x00"  # Command.synchronize, an empty SynchronizeRequest
BARRIER_OP = b""  # a Command with no operation


def command_field(command_id: int, reply: bool, op: bytes) -> bytes:
    """An ExecuteRequest's ``commands`` field (number 2): the Command with
    ``command_id``, ``reply`` and ``op`` (one of the fields above)."""
    command = b"".join((b"\x08", varint(command_id), b"\x10\x01" if reply else b"", op))
    return b"".join((b"\x12", varint(len(command)), command))


def session_field(token: str) -> bytes:
    """An ExecuteRequest's ``session`` field (number 1)."""
    return field_bytes(b"\x0a", token.encode())
