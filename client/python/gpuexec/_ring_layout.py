"""The command ring's layout (proto/gpuexec/command_ring.h), for _ring.py
and _ring_records.py: positions, kinds and record structs. Kept apart from
the ring's machinery so that each file holds one thing."""

from __future__ import annotations

import struct
from typing import Dict, Tuple

# ---- gpuexec/command_ring.h. test_command_ring.py checks LAYOUT against the
# header's own `// LAYOUT name offset size` lines, and the structs below
# against LAYOUT.
MAGIC = 0x0031474E49525847  # "GXRING1\0" as a little-endian u64
VERSION = 1
# The registration's layout version that asks an answer area.
ANSWER_AREA_VERSION = 2
ANSWER_AREA = 1  # header.flags
HEADER_BYTES = 4096
SLOT = 64
MAX_RECORD_BYTES = 40960
MAX_MESSAGE_BYTES = 1024
MAX_PARAM_BLOCK_BYTES = 32764  # a kernel's parameters, CUDA 12.1 and later

LAYOUT: Dict[str, Tuple[int, int]] = {
    "header.magic": (0, 8), "header.version": (8, 4), "header.header_bytes": (12, 4),
    "header.sq_offset": (16, 8), "header.sq_bytes": (24, 8), "header.cq_offset": (32, 8),
    "header.cq_bytes": (40, 8), "header.slot_bytes": (48, 4), "header.flags": (52, 4),
    "header.sq_tail": (64, 8), "header.sq_head": (128, 8), "header.daemon_wait": (192, 4),
    "header.cq_tail": (256, 8), "header.cq_head": (320, 8), "header.client_wait": (384, 4),
    "header.state": (448, 4), "header.close_code": (452, 4),
    "header.close_message_bytes": (456, 4), "header.close_message": (512, 1024),
    "header.aq_offset": (1536, 8), "header.aq_bytes": (1544, 8), "header.aq_tail": (1600, 8),
    "header.aq_head": (1664, 8),
    "submit.kind": (0, 2), "submit.slots": (2, 2), "submit.flags": (4, 4), "submit.id": (8, 8),
    "submit.seq": (16, 8), "submit.body_bytes": (24, 4), "submit.reserved": (28, 4),
    "launch.function": (0, 8), "launch.grid": (8, 12), "launch.block": (20, 12),
    "launch.cluster": (32, 12), "launch.shared_bytes": (44, 4), "launch.flags": (48, 4),
    "launch.cluster_policy": (52, 4), "launch.nargs": (56, 2), "launch.reserved": (58, 2),
    "launch.blob_bytes": (60, 4),
    "arg.kind": (0, 2), "arg.reserved": (2, 2), "arg.aux": (4, 4), "arg.a": (8, 8),
    "arg.b": (16, 8),
    "launch_graph.graph": (0, 8), "launch_graph.flags": (8, 4), "launch_graph.npatches": (12, 2),
    "launch_graph.reserved": (14, 2), "launch_graph.blob_bytes": (16, 4),
    "launch_graph.reserved2": (20, 4),
    "patch.node": (0, 4), "patch.argument": (4, 4), "patch.value": (8, 24),
    "tensor_map.buffer": (0, 8), "tensor_map.offset": (8, 8), "tensor_map.data_type": (16, 4),
    "tensor_map.rank": (20, 4), "tensor_map.dims": (24, 40), "tensor_map.strides": (64, 32),
    "tensor_map.box": (96, 20), "tensor_map.element_strides": (116, 20),
    "tensor_map.interleave": (136, 4), "tensor_map.swizzle": (140, 4),
    "tensor_map.l2_promotion": (144, 4), "tensor_map.oob_fill": (148, 4),
    "allocate.size": (0, 8), "free.buffer": (0, 8), "release_region.region": (0, 8),
    "memset.buffer": (0, 8), "memset.offset": (8, 8), "memset.size": (16, 8),
    "memset.value": (24, 4), "memset.reserved": (28, 4),
    "copy_buffer.dst": (0, 8), "copy_buffer.dst_offset": (8, 8), "copy_buffer.src": (16, 8),
    "copy_buffer.src_offset": (24, 8), "copy_buffer.size": (32, 8),
    "region_copy.region": (0, 8), "region_copy.region_offset": (8, 8),
    "region_copy.buffer": (16, 8), "region_copy.buffer_offset": (24, 8),
    "region_copy.size": (32, 8), "region_copy.direction": (40, 4),
    "region_copy.reserved": (44, 4),
    "complete.kind": (0, 2), "complete.slots": (2, 2), "complete.code": (4, 4),
    "complete.id": (8, 8), "complete.seq": (16, 8), "complete.gpu_time_ns": (24, 8),
    "complete.value0": (32, 8), "complete.value1": (40, 8), "complete.message_bytes": (48, 4),
    "complete.flags": (52, 4), "complete.reserved": (56, 8),
}

# Record kinds and flags.
PAD, BARRIER, LAUNCH, SYNCHRONIZE = 1, 2, 3, 4
ALLOCATE, FREE, MEMSET, COPY_BUFFER, REGION_COPY, RELEASE_REGION = 5, 6, 7, 8, 9, 10
LAUNCH_GRAPH, BEGIN_GRAPH, END_GRAPH = 11, 12, 13
REPLY = 1
OPEN = 0

# Records: every multi-byte field little-endian.
HEAD = struct.Struct("<HHIQQII")  # SubmitHead, 32 bytes
COMPLETE = struct.Struct("<HHiQQQQQII8x")  # CompleteHead, 64 bytes
