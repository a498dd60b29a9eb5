"""Triton-compiled kernels: a cubin plus the metadata JSON Triton writes with it.

    from gpuexec import triton as gt
    kernel = gt.load(session, "add_kernel.cubin", "add_kernel.json")
    kernel[(n + 1023) // 1024,](x, y, out, n)       # or kernel.launch(grid, *args)

The launch follows Triton 3.x's own launcher: ``block`` is warp_size *
num_warps threads, the dynamic shared memory is the metadata's ``shared``,
the CUDA grid is the Triton grid with x multiplied by num_ctas (with a
(num_ctas, 1, 1) cluster when num_ctas > 1), and the kernel's trailing
parameters that Triton appends -- the global scratch and profile scratch
pointers -- are passed for you: a buffer of size * (CTAs in the grid) bytes
when the metadata's size is non-zero, else a null pointer. Constexpr
parameters are compiled in: pass only the others, in order.
"""

import json
import os

from ._errors import client_error

# Allocations the daemon makes are aligned at least this well.
_DEVICE_ALIGNMENT = 256


def _read_metadata(metadata):
    if isinstance(metadata, dict):
        return dict(metadata)
    if isinstance(metadata, (bytes, bytearray)):
        metadata = metadata.decode()
    if isinstance(metadata, str) and metadata.lstrip().startswith("{"):
        return json.loads(metadata)
    with open(os.fspath(metadata), encoding="utf-8") as f:
        return json.load(f)


def _warp_size(target):
    if isinstance(target, dict):
        return int(target.get("warp_size", 32))
    if isinstance(target, (list, tuple)) and len(target) >= 3:  # (backend, arch, warp_size)
        return int(target[2])
    return 32


def load(session, cubin, metadata=None, *, kind=None):
    """Loads a Triton kernel into ``session``.

    cubin: a path or the image bytes (``compiled.asm["cubin"]``). metadata: a
    dict (``compiled.metadata._asdict()``), a JSON path or JSON text; None
    reads the .json next to a cubin path (Triton's cache layout).
    """
    if metadata is None:
        if not isinstance(cubin, (str, os.PathLike)):
            raise client_error("Triton kernel: metadata is needed when the cubin is bytes")
        metadata = os.path.splitext(os.fspath(cubin))[0] + ".json"
    md = _read_metadata(metadata)
    if "name" not in md or "num_warps" not in md:
        raise client_error("Triton metadata needs at least 'name' and 'num_warps'")
    module = session.load_module(cubin, kind=kind if kind is not None else
                                 (None if isinstance(cubin, (str, os.PathLike)) else "cubin"))
    return Kernel(module.function(md["name"]), md)


class Kernel:
    """A Triton kernel loaded in a session; launch with ``launch`` or ``kernel[grid](...)``."""

    def __init__(self, function, metadata):
        self.function = function
        self.session = function.session
        self.metadata = metadata
        md = metadata
        self.name = md["name"]
        self.num_warps = int(md["num_warps"])
        self.warp_size = int(md.get("warp_size") or _warp_size(md.get("target")))
        if "num_ctas" in md:
            self.num_ctas = int(md["num_ctas"])
        else:
            self.num_ctas = 1
            for d in md.get("cluster_dims") or (1,):
                self.num_ctas *= int(d)
        self.shared = int(md.get("shared", 0))
        self.global_scratch_size = int(md.get("global_scratch_size", 0))
        self.global_scratch_align = int(md.get("global_scratch_align", 1) or 1)
        self.profile_scratch_size = int(md.get("profile_scratch_size", 0))
        self.profile_scratch_align = int(md.get("profile_scratch_align", 1) or 1)
        # Triton 3.3 and later append two pointers; 3.2 only the global one.
        self.hidden_params = ("global_scratch_size" in md) + ("profile_scratch_size" in md)
        if md.get("launch_cooperative_grid"):
            raise client_error(f"Triton kernel '{self.name}' needs a cooperative launch, "
                               "which gpuexec does not offer")
        if md.get("tensordesc_meta"):
            raise client_error(f"Triton kernel '{self.name}' takes TMA tensor descriptors, "
                               "which need device addresses on the host; not supported")
        for what, align in (("global", self.global_scratch_align),
                            ("profile", self.profile_scratch_align)):
            if align > _DEVICE_ALIGNMENT or align & (align - 1):
                raise client_error(f"Triton kernel '{self.name}': {what} scratch alignment "
                                   f"{align} is not a power of two up to {_DEVICE_ALIGNMENT}")
        n = len(function.params)
        if n < self.hidden_params:
            raise client_error(f"Triton kernel '{self.name}' has {n} parameters; a Triton 3.x "
                               f"kernel has at least the {self.hidden_params} scratch pointers")
        self.num_args = n - self.hidden_params
        self.block = (self.warp_size * self.num_warps, 1, 1)
        # The scratch buffers of the latest launch (None when not needed);
        # reused by later launches while large enough.
        self.global_scratch = None
        self.profile_scratch = None

    def __repr__(self):
        return (f"<gpuexec.triton.Kernel {self.name}: {self.num_args} args, "
                f"{self.num_warps} warps, {self.shared} B shared>")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        """Frees the scratch buffers (the session's close frees them too)."""
        for attr in ("global_scratch", "profile_scratch"):
            buf = getattr(self, attr)
            setattr(self, attr, None)
            if buf is not None and not self.session.closed:
                buf.free()

    def __getitem__(self, grid):
        """``kernel[grid](*args, sync=False)``, as in Triton."""
        return lambda *args, sync=False: self.launch(grid, *args, sync=sync)

    def _scratch(self, attr, size, align, ctas):
        if size == 0:
            return None
        total = size * ctas
        total = (total + align - 1) // align * align
        buf = getattr(self, attr)
        if buf is None or buf.size < total:
            if buf is not None:
                buf.free()  # stream-ordered: earlier launches still see it
                setattr(self, attr, None)
            buf = self.session.alloc(total)
            setattr(self, attr, buf)
        return buf

    def cuda_grid(self, grid):
        """The CUDA grid for a Triton grid (x times num_ctas)."""
        dims = (grid,) if isinstance(grid, int) else tuple(grid)
        if not 1 <= len(dims) <= 3 or not all(isinstance(d, int) and d >= 0 for d in dims):
            raise client_error(f"grid must be an int or 1 to 3 non-negative ints, got {grid!r}")
        dims = dims + (1,) * (3 - len(dims))
        return (dims[0] * self.num_ctas, dims[1], dims[2])

    def launch(self, grid, *args, sync=False):
        """Launches over the Triton ``grid`` (programs) with the kernel's
        non-constexpr arguments. Returns the GPU time in seconds with
        ``sync``, else None. An empty grid launches nothing (as in Triton)."""
        if len(args) != self.num_args:
            raise client_error(
                f"Triton kernel '{self.name}' takes {self.num_args} arguments (its "
                f"{len(self.function.params)} parameters less the {self.hidden_params} scratch "
                f"pointers Triton appends; constexprs are compiled in); got {len(args)}")
        cuda_grid = self.cuda_grid(grid)
        ctas = cuda_grid[0] * cuda_grid[1] * cuda_grid[2]
        if ctas == 0:
            return 0.0 if sync else None
        hidden = []
        if self.hidden_params >= 1:
            hidden.append(self._scratch("global_scratch", self.global_scratch_size,
                                        self.global_scratch_align, ctas))
        if self.hidden_params >= 2:
            hidden.append(self._scratch("profile_scratch", self.profile_scratch_size,
                                        self.profile_scratch_align, ctas))
        cluster = (self.num_ctas, 1, 1) if self.num_ctas > 1 else None
        return self.function.launch(cuda_grid, self.block, *args, *hidden, shared=self.shared,
                                    cluster=cluster, sync=sync)
