"""Triton's metadata and host tensor descriptors, as a launch needs them.

The metadata is read as docs/triton.md specifies (the C++ loader reads it
the same way; both are tested on tests/data/triton/): a dict
(``compiled.metadata._asdict()``), a JSON path, or JSON text. Used by
gpuexec.triton's Kernel (a cubin and its JSON) and by the Triton driver's
launcher (kernels Triton compiles in this process).
"""

import dataclasses
import json
import os
import re

from ._args import i32, i64
from ._errors import client_error
from ._tensor_map import ELEMENT_BYTES, TensorMap, data_type_name
from .v1 import gpuexec_pb2 as pb

# Allocations the daemon makes are aligned at least this well.
_DEVICE_ALIGNMENT = 256
_ABSENT = object()
_U32 = (1 << 32) - 1
_I32 = ((-1 << 31), (1 << 31) - 1)
_I64 = ((-1 << 63), (1 << 63) - 1)
# Blocks in a cluster beyond which the launch opts in to a non-portable size.
_PORTABLE_CLUSTER = 8
# Triton's element types are the driver's (CUtensorMapDataType) but for
# these three.
_TRITON_TO_DRIVER_TYPE = {8: 10, 9: 8, 10: 9}
_MAX_ELEM_TYPE = 12
_SWIZZLES = ("none", "32b", "64b", "128b")
_PADDINGS = ("zero", "nan")


# ------------------------------------------------------------------ reading

def _python_literal_as_json(text):
    """``text`` with a Python literal's spellings made JSON's: single-quoted
    strings double-quoted, True/False/None as true/false/null, tuples as
    lists (a trailing comma dropped)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c in "'\"":
            quote, j = c, i + 1
            body = []
            while j < n and text[j] != quote:
                if text[j] == "\\" and j + 1 < n:
                    escaped = text[j + 1]
                    body.append("'" if escaped == "'" else "\\" + escaped)
                    j += 2
                    continue
                body.append('\\"' if text[j] == '"' else text[j])
                j += 1
            out.append('"' + "".join(body) + '"')
            i = j + 1
            continue
        if c.isalpha() or c == "_":
            j = i
            while j < n and (text[j].isalnum() or text[j] == "_"):
                j += 1
            word = text[i:j]
            out.append({"True": "true", "False": "false", "None": "null"}.get(word, word))
            i = j
            continue
        if c in ")]}":
            # A trailing comma, as Python writes a 1-tuple: dropped.
            while out and out[-1].isspace():
                out.pop()
            if out and out[-1] == ",":
                out.pop()
            out.append("]" if c == ")" else c)
        else:
            out.append("[" if c == "(" else c)
        i += 1
    return "".join(out)


def _decode(text):
    """A value written as a string: JSON, or a Python literal. Raises
    ValueError when it is neither."""
    try:
        return json.loads(text)
    except ValueError:
        return json.loads(_python_literal_as_json(text))


def _shown(value):
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _refuse(where, key, wanted, value):
    return client_error(f"Triton metadata: {where}'{key}' must be {wanted}, got "
                        f"{_shown(value)}")


def _get(md, key, wanted, where=""):
    """The value of ``key``: decoded when written as a string, _ABSENT when
    missing or null (or "None"); tuples as lists."""
    value = md.get(key)
    if isinstance(value, str):
        try:
            value = _decode(value)
        except ValueError:
            raise _refuse(where, key, wanted, md[key]) from None
    if value is None:
        return _ABSENT
    if isinstance(value, tuple):
        value = list(value)
    return value


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _int(md, key, lo, hi, default=_ABSENT, where=""):
    wanted = f"an integer {lo} to {hi}" if hi is not None else f"an integer >= {lo}"
    value = _get(md, key, wanted, where)
    if value is _ABSENT:
        if default is _ABSENT:
            raise client_error(f"Triton metadata: {where}'{key}' is required")
        return default
    if not _is_int(value) or value < lo or (hi is not None and value > hi):
        raise _refuse(where, key, wanted, md[key])
    return value


def _bool(md, key, where=""):
    value = _get(md, key, "a boolean", where)
    if value is _ABSENT:
        return False
    if not isinstance(value, bool):
        raise _refuse(where, key, "a boolean", md[key])
    return value


def _int_list(md, key, count, lo, hi, where=""):
    """A list of ``count`` (a range) integers lo to hi, or _ABSENT."""
    wanted = (f"a list of {count.start} to {count.stop - 1} integers {lo} to {hi}"
              if len(count) > 1 else f"a list of {count.start} integers {lo} to {hi}")
    value = _get(md, key, wanted, where)
    if value is _ABSENT:
        return value
    if (not isinstance(value, list) or len(value) not in count
            or not all(_is_int(v) and lo <= v <= hi for v in value)):
        raise _refuse(where, key, wanted, md[key])
    return tuple(value)


def _warp_size_of_target(md):
    """The warp size the metadata's ``target`` gives; 32 without one."""
    wanted = ('{"warp_size": n}, [backend, arch, n] or a string with warp_size=n, '
              'n 1 to 1024')
    raw = md.get("target")
    value = raw
    if isinstance(raw, str):
        try:
            value = _decode(raw)
        except ValueError:  # GPUTarget(backend='cuda', arch=90, warp_size=32), say
            m = re.search(r"\bwarp_size\s*=\s*(\d+)", raw)
            if not m or not 1 <= int(m.group(1)) <= 1024:
                raise _refuse("", "target", wanted, raw) from None
            return int(m.group(1))
    if value is None:
        return 32
    if isinstance(value, dict):
        n = value.get("warp_size")
    elif isinstance(value, (list, tuple)):
        n = value[2] if len(value) == 3 else None
    else:  # Triton's GPUTarget, in a dict from compiled.metadata._asdict()
        n = getattr(value, "warp_size", None)
    if not _is_int(n) or not 1 <= n <= 1024:
        raise _refuse("", "target", wanted, raw)
    return n


@dataclasses.dataclass(frozen=True)
class Scratch:
    """A scratch buffer the kernel takes as a trailing pointer: ``size``
    bytes per CTA, aligned to ``align``."""
    size: int
    align: int

    def bytes_for(self, ctas):
        """Bytes for a grid of ``ctas`` CTAs; 0 (a null pointer) for size 0."""
        if self.size == 0:
            return 0
        total = self.size * ctas
        return (total + self.align - 1) // self.align * self.align


@dataclasses.dataclass(frozen=True)
class TensorDescMeta:
    """One entry of ``tensordesc_meta``: how the kernel's n-th host tensor
    descriptor is encoded."""
    swizzle: int       # 0 to 3: none, 32B, 64B, 128B
    elem_size: int     # bytes
    elem_type: int     # Triton's element type (0 to 12)
    block_size: tuple  # the box, outermost first

    @property
    def rank(self):
        return len(self.block_size)

    @property
    def driver_data_type(self):
        """The CUtensorMapDataType value."""
        return _TRITON_TO_DRIVER_TYPE.get(self.elem_type, self.elem_type)

    @property
    def data_type(self):
        """The TensorMapArg.DataType name."""
        return pb.TensorMapArg.DataType.Name(self.driver_data_type + 1)


def _tensordesc_entry(entry, index):
    where = f"tensordesc_meta[{index}] "
    if not isinstance(entry, dict):
        raise _refuse("", "tensordesc_meta", "a list of objects", entry)
    meta = TensorDescMeta(
        swizzle=_int(entry, "swizzle", 0, 3, where=where),
        elem_size=_int(entry, "elem_size", 1, 8, where=where),
        elem_type=_int(entry, "elem_type", 0, _MAX_ELEM_TYPE, where=where),
        block_size=_int_list(entry, "block_size", range(1, 6), 1, 256, where=where))
    if meta.elem_size not in (1, 2, 4, 8):
        raise _refuse(where, "elem_size", "1, 2, 4 or 8", entry["elem_size"])
    if meta.block_size is _ABSENT:
        raise client_error(f"Triton metadata: {where}'block_size' is required")
    if _bool(entry, "fp4_padded", where):
        raise client_error(f"Triton metadata: {where}'fp4_padded' is true: sub-byte (fp4) "
                           "tensor descriptors are not supported")
    if _bool(entry, "is_im2col", where):
        raise client_error(f"Triton metadata: {where}'is_im2col' is true: im2col tensor "
                           "descriptors are not supported")
    return meta


@dataclasses.dataclass(frozen=True)
class LaunchConfig:
    """How a Triton grid is launched (see Metadata.launch_config)."""
    grid: tuple          # the CUDA grid
    block: tuple
    cluster: object      # the cluster shape, None for none
    cluster_policy: object  # "spread" with a cluster, else None
    non_portable_cluster: bool
    shared: int
    cooperative: bool
    pdl: bool
    scratch: tuple       # (what, bytes) of each trailing pointer; 0 bytes: null

    @property
    def ctas(self):
        return self.grid[0] * self.grid[1] * self.grid[2]


@dataclasses.dataclass(frozen=True)
class Metadata:
    """Triton's metadata as a launch needs it (read_metadata makes one)."""
    name: str
    num_warps: int
    warp_size: int
    num_ctas: int
    cluster: tuple            # the cluster shape; (1, 1, 1) for none
    shared: int
    launch_cooperative_grid: bool
    launch_pdl: bool
    global_scratch: object    # a Scratch, or None when the kernel takes no pointer
    profile_scratch: object
    tensordesc_meta: tuple    # of TensorDescMeta

    @property
    def block(self):
        return (self.warp_size * self.num_warps, 1, 1)

    @property
    def scratches(self):
        """(what, Scratch) of each trailing pointer, in order."""
        return tuple((what, s) for what, s in (("global", self.global_scratch),
                                               ("profile", self.profile_scratch))
                     if s is not None)

    @property
    def descriptor_params(self):
        """Kernel parameters the host tensor descriptors take beyond one
        argument each: their shapes and strides."""
        return sum(2 * d.rank for d in self.tensordesc_meta)

    def launch_config(self, grid):
        """The launch of the Triton ``grid`` (an int or 1 to 3 ints)."""
        try:
            dims = (grid,) if hasattr(grid, "__index__") else tuple(grid)
            dims = tuple(d.__index__() for d in dims)
        except (TypeError, AttributeError):
            dims = ()
        if not 1 <= len(dims) <= 3 or min(dims) < 0:
            raise client_error(f"grid must be an int or 1 to 3 non-negative ints, got {grid!r}")
        dims = dims + (1,) * (3 - len(dims))
        c = self.cluster
        cuda_grid = (dims[0] * c[0], dims[1] * c[1], dims[2] * c[2])
        blocks = c[0] * c[1] * c[2]
        ctas = cuda_grid[0] * cuda_grid[1] * cuda_grid[2]
        return LaunchConfig(
            grid=cuda_grid, block=self.block, cluster=c if blocks > 1 else None,
            cluster_policy="spread" if blocks > 1 else None,
            non_portable_cluster=blocks > _PORTABLE_CLUSTER, shared=self.shared,
            cooperative=self.launch_cooperative_grid, pdl=self.launch_pdl,
            scratch=tuple((what, s.bytes_for(ctas)) for what, s in self.scratches))

    def kernel_args(self, args):
        """``args`` with each host tensor descriptor (the n-th with the n-th
        entry of tensordesc_meta) expanded into the kernel's parameters: a
        TensorMap, its shape as i32 and its strides as i64."""
        out = []
        n = 0
        for index, arg in enumerate(args):
            desc = _as_descriptor(arg)
            if desc is None:
                out.append(arg)
                continue
            if not self.tensordesc_meta:
                raise client_error(
                    f"Triton kernel '{self.name}': argument {index} is a tensor descriptor, "
                    "but the kernel takes no host tensor descriptors (its metadata has no "
                    "tensordesc_meta; a kernel compiled for a device without TMA takes "
                    "the descriptor's parts instead)")
            if n >= len(self.tensordesc_meta):
                raise client_error(
                    f"Triton kernel '{self.name}' takes {len(self.tensordesc_meta)} host "
                    f"tensor descriptors; argument {index} is one more")
            out.extend(desc.kernel_params(self.tensordesc_meta[n], n))
            n += 1
        if n != len(self.tensordesc_meta):
            raise client_error(
                f"Triton kernel '{self.name}' takes {len(self.tensordesc_meta)} host tensor "
                f"descriptors (gpuexec.triton.TensorDescriptor); got {n}")
        return out


def _read_json(metadata):
    if isinstance(metadata, Metadata):
        return metadata
    if isinstance(metadata, dict):
        return dict(metadata)
    if isinstance(metadata, (bytes, bytearray)):
        metadata = metadata.decode()
    if isinstance(metadata, str) and metadata.lstrip().startswith("{"):
        md = json.loads(metadata)
    else:
        with open(os.fspath(metadata), encoding="utf-8") as f:
            md = json.load(f)
    if not isinstance(md, dict):
        raise client_error("Triton metadata: not a JSON object")
    return md


def read_metadata(metadata):
    """Reads Triton's metadata as docs/triton.md says: a dict
    (``compiled.metadata._asdict()``), a JSON path, or JSON text (str or
    bytes). Returns a Metadata; a value of the wrong type or out of range
    raises Error (INVALID_ARGUMENT) naming the key."""
    md = _read_json(metadata)
    if isinstance(md, Metadata):
        return md
    name = md.get("name")
    if name is None or name == "None":
        raise client_error("Triton metadata: 'name' is required")
    if not isinstance(name, str) or not name:
        raise _refuse("", "name", "a non-empty string", name)
    num_warps = _int(md, "num_warps", 1, 32)
    warp_size = _int(md, "warp_size", 1, 1024, default=None)
    if warp_size is None:
        warp_size = _warp_size_of_target(md)
    num_ctas = _int(md, "num_ctas", 1, 16, default=1)
    cluster_dims = _int_list(md, "cluster_dims", range(3, 4), 1, 16)
    if cluster_dims is not _ABSENT and cluster_dims[0] * cluster_dims[1] * cluster_dims[2] > 1:
        cluster = cluster_dims
    else:
        cluster = (num_ctas, 1, 1)
    scratch = {}
    for what in ("global", "profile"):
        size = _int(md, f"{what}_scratch_size", 0, None, default=None)
        align = _int(md, f"{what}_scratch_align", 1, _DEVICE_ALIGNMENT, default=1)
        if align & (align - 1):
            raise _refuse("", f"{what}_scratch_align",
                          f"a power of two 1 to {_DEVICE_ALIGNMENT}", md[f"{what}_scratch_align"])
        scratch[what] = None if size is None else Scratch(size, align)
    entries = _get(md, "tensordesc_meta", "a list of objects")
    if entries is _ABSENT:
        entries = []
    if not isinstance(entries, list):
        raise _refuse("", "tensordesc_meta", "a list of objects", md["tensordesc_meta"])
    return Metadata(
        name=name, num_warps=num_warps, warp_size=warp_size, num_ctas=num_ctas,
        cluster=tuple(cluster), shared=_int(md, "shared", 0, _U32, default=0),
        launch_cooperative_grid=_bool(md, "launch_cooperative_grid"),
        launch_pdl=_bool(md, "launch_pdl"), global_scratch=scratch["global"],
        profile_scratch=scratch["profile"],
        tensordesc_meta=tuple(_tensordesc_entry(e, i) for i, e in enumerate(entries)))


# ------------------------------------------------------- tensor descriptors

def _element_size(dtype):
    """Bytes of an element of ``dtype`` (a name or numpy dtype), or None."""
    if dtype is None:
        return None
    itemsize = getattr(dtype, "itemsize", None)
    if _is_int(itemsize):
        return itemsize
    return ELEMENT_BYTES[data_type_name(dtype)]


def _sequence(value, what):
    try:
        out = tuple(v.__index__() for v in value)
    except (TypeError, AttributeError):
        raise client_error(f"TensorDescriptor: {what} must be a sequence of ints, got "
                           f"{value!r}") from None
    return out


class TensorDescriptor:
    """A host tensor descriptor, as Triton's ``TensorDescriptor`` but over a
    gpuexec Buffer: pass it where the Triton kernel takes one.

    - ``buffer``: the Buffer holding the tensor.
    - ``shape``: elements along each dimension, outermost first (1 to 5).
    - ``strides``: in elements, outermost first; the last is 1. None: the
      contiguous (row-major) strides of ``shape``.
    - ``block_shape``: optional; when given, its rank is checked (the box
      itself is the kernel's, from its metadata).
    - ``offset``: the tensor's first element, in bytes from the buffer's
      start; or ``element_offset``, in elements of the kernel's type.
    - ``padding``: "zero" or "nan": what a load outside ``shape`` reads.
    - ``dtype``: optional (default: the buffer's, when it was uploaded from
      numpy or made with one); when known, its size is checked against the
      kernel's element size.

    At a launch it becomes a tensor map (dimensions, box and strides
    reversed to innermost first, strides in bytes), then its shape as i32
    and its strides as i64, as Triton's launcher passes it.
    """

    def __init__(self, buffer, shape, strides=None, block_shape=None, *, offset=0,
                 element_offset=None, padding="zero", dtype=None):
        handle = getattr(buffer, "handle", None)
        if not _is_int(handle):
            raise client_error("TensorDescriptor needs a gpuexec Buffer as its base, got "
                               f"{type(buffer).__name__} (a torch tensor is no gpuexec "
                               "buffer: upload the data with session.upload)")
        self.base = buffer
        self.shape = _sequence(shape, "shape")
        rank = len(self.shape)
        if not 1 <= rank <= 5:
            raise client_error(f"TensorDescriptor: shape {list(self.shape)} has rank {rank}; "
                               "1 to 5 are allowed")
        if strides is None:
            strides, step = [], 1
            for d in reversed(self.shape):
                strides.append(step)
                step *= d
            strides.reverse()
        self.strides = _sequence(strides, "strides")
        if len(self.strides) != rank:
            raise client_error(f"TensorDescriptor: strides {list(self.strides)} do not have "
                               f"the rank of shape {list(self.shape)}")
        if self.strides[-1] != 1:
            raise client_error(f"TensorDescriptor: the last stride must be 1 (the innermost "
                               f"dimension is contiguous), got strides {list(self.strides)}")
        self.block_shape = None if block_shape is None else _sequence(block_shape,
                                                                       "block_shape")
        if self.block_shape is not None and len(self.block_shape) != rank:
            raise client_error(f"TensorDescriptor: block_shape {list(self.block_shape)} does "
                               f"not have the rank of shape {list(self.shape)}")
        if padding not in _PADDINGS:
            raise client_error(f"TensorDescriptor: padding must be 'zero' or 'nan', got "
                               f"{padding!r}")
        self.padding = padding
        for what, value in (("offset", offset), ("element_offset", element_offset)):
            if value is not None and (not _is_int(value) or value < 0):
                raise client_error(f"TensorDescriptor: {what} must be a non-negative int, "
                                   f"got {value!r}")
        if element_offset is not None and offset:
            raise client_error("TensorDescriptor: give offset (bytes) or element_offset, "
                               "not both")
        self.offset = offset
        self.element_offset = element_offset
        self.dtype = dtype if dtype is not None else getattr(buffer, "dtype", None)
        self.element_size = _element_size(self.dtype)

    def __repr__(self):
        where = (f"element {self.element_offset}" if self.element_offset is not None
                 else f"byte {self.offset}")
        return (f"TensorDescriptor(buffer 0x{self.base.handle:x} at {where}, "
                f"shape={list(self.shape)}, strides={list(self.strides)}, "
                f"padding={self.padding!r})")

    @classmethod
    def from_triton(cls, desc):
        """One of Triton's descriptors (or an object with its attributes:
        ``base``, ``shape``, ``strides``, ``block_shape``, ``padding``)
        whose base is a gpuexec Buffer."""
        if getattr(desc, "round_f32_to_tf32", False):
            raise client_error("TensorDescriptor: round_f32_to_tf32 is not supported")
        return cls(desc.base, desc.shape, desc.strides, getattr(desc, "block_shape", None),
                   padding=getattr(desc, "padding", "zero") or "zero")

    def kernel_params(self, entry, index=0):
        """The kernel parameters this descriptor becomes with ``entry`` (a
        TensorDescMeta; ``index``: its place, for messages): a TensorMap,
        the shape as i32 and the strides as i64."""
        where = f"tensor descriptor {index}"
        rank = entry.rank
        if len(self.shape) != rank:
            raise client_error(
                f"{where}: shape {list(self.shape)} has rank {len(self.shape)}; the kernel's "
                f"descriptor {index} has rank {rank} (block {list(entry.block_size)})")
        if self.block_shape is not None and len(self.block_shape) != rank:
            raise client_error(
                f"{where}: block_shape {list(self.block_shape)} has rank "
                f"{len(self.block_shape)}; the kernel's descriptor {index} has rank {rank}")
        if self.strides[-1] != 1:
            raise client_error(f"{where}: the last stride must be 1, got strides "
                               f"{list(self.strides)}")
        if self.element_size is not None and self.element_size != entry.elem_size:
            raise client_error(
                f"{where}: elements of {self.element_size} bytes ({self.dtype}); the "
                f"kernel's descriptor {index} has elements of {entry.elem_size} bytes "
                f"({entry.data_type})")
        size = entry.elem_size
        offset = self.offset if self.element_offset is None else self.element_offset * size
        tensor_map = TensorMap(
            self.base, entry.data_type, self.shape[::-1],
            [s * size for s in self.strides[-2::-1]], entry.block_size[::-1], [1] * rank,
            offset=offset, swizzle=_SWIZZLES[entry.swizzle], l2_promotion="128b",
            oob_fill="nan" if self.padding == "nan" else "zero")
        params = [tensor_map]
        for what, values, make, (lo, hi) in (("shape", self.shape, i32, _I32),
                                             ("strides", self.strides, i64, _I64)):
            for v in values:
                if not lo <= v <= hi:
                    raise client_error(f"{where}: {what} {list(values)}: {v} does not fit "
                                       f"in {'32' if make is i32 else '64'} bits")
                params.append(make(v))
        return params


def _as_descriptor(arg):
    """``arg`` as a TensorDescriptor, or None when it is not one."""
    if isinstance(arg, TensorDescriptor):
        return arg
    if all(hasattr(arg, a) for a in ("base", "shape", "strides", "block_shape")):
        return TensorDescriptor.from_triton(arg)  # Triton's, over a gpuexec Buffer
    return None
