"""Triton on gpuexec: ``@triton.jit`` kernels run unchanged on a session's
device, or a cubin and its metadata JSON are loaded by hand.

Unchanged Triton code (Triton compiles here, with no GPU and no torch; each
``kernel[grid](...)`` is one launch on the session's command stream, with
no round trip):

    import gpuexec, gpuexec.triton, triton
    with gpuexec.connect() as client, client.session() as s:
        gpuexec.triton.activate(s)            # or: with gpuexec.triton.use(s):
        x, y = s.asarray(a), s.asarray(b)
        out = s.empty_like(x)
        add_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, y, out, n, BLOCK=1024)
        print(out.get())

Buffers (and views of them) are the pointers; ``@triton.autotune`` and
``triton.testing.do_bench`` time with the daemon's GPU time (see
_triton_driver). ``compile(fn, signature, constexprs)`` compiles ahead of
time into a cubin and metadata, which ``load`` takes.

A cubin and its metadata, loaded by hand:

    from gpuexec import triton as gt
    kernel = gt.load(session, "add_kernel.cubin", "add_kernel.json")
    kernel[(n + 1023) // 1024,](x, y, out, n)       # or kernel.launch(grid, *args)

The metadata is read as docs/triton.md specifies (the C++ loader reads it
the same way; both are tested on tests/data/triton/), and the launch
follows Triton 3.x's own launcher:

- ``block`` is warp_size * num_warps threads; the dynamic shared memory is
  the metadata's ``shared``.
- The CUDA grid is the Triton grid times the cluster shape (``cluster_dims``
  when its product is over 1, else ``(num_ctas, 1, 1)``); a cluster of more
  than one block is launched as one, with the SPREAD scheduling policy, and
  opted in to non-portable sizes above 8 blocks.
- ``launch_cooperative_grid`` and ``launch_pdl`` make the launch
  cooperative and a programmatic dependent launch.
- The kernel's trailing parameters that Triton appends -- the global scratch
  and profile scratch pointers -- are passed for you: a buffer of size *
  (CTAs in the grid) bytes, rounded up to its alignment, when the
  metadata's size is non-zero, else a null pointer.
- A kernel compiled with ``tensordesc_meta`` takes host tensor descriptors
  (``TensorDescriptor`` here, where Triton takes its own): each becomes a
  tensor map the daemon encodes, then its shape and strides.

Constexpr parameters are compiled in: pass only the others, in order.
Loading by hand imports neither Triton nor torch.
"""

import os
from typing import Any, Callable, Optional, Sequence, Tuple, Union

from ._errors import client_error
from ._triton_compile import Compiled, compile  # pylint: disable=redefined-builtin
from ._triton_driver import SUPPORTED, activate, do_bench, use
from ._triton_metadata import (LaunchConfig, Metadata, Scratch, TensorDescMeta, TensorDescriptor,
                               read_metadata)


# --------------------------------------------------------------- launching

def load(session: Any, cubin: Union[str, os.PathLike, bytes], metadata: Any = None, *,
         kind: Any = None) -> "Kernel":
    """Loads a Triton kernel into ``session``.

    cubin: a path or the image bytes (``compiled.asm["cubin"]``). metadata: a
    dict (``compiled.metadata._asdict()``), a JSON path or JSON text; None
    reads the .json next to a cubin path (Triton's cache layout). The
    metadata is read (and refused, naming the key) before anything is
    loaded.
    """
    if metadata is None:
        if not isinstance(cubin, (str, os.PathLike)):
            raise client_error("Triton kernel: metadata is needed when the cubin is bytes")
        metadata = os.path.splitext(os.fspath(cubin))[0] + ".json"
    md = read_metadata(metadata)
    module = session.load_module(cubin, kind=kind if kind is not None else
                                 (None if isinstance(cubin, (str, os.PathLike)) else "cubin"))
    return Kernel(module.function(md.name), md)


class Kernel:
    """A Triton kernel loaded in a session; launch with ``launch`` or ``kernel[grid](...)``."""

    def __init__(self, function: Any, metadata: Any) -> None:
        self.function = function
        self.session = function.session
        md = self.metadata = read_metadata(metadata)
        self.name = md.name
        self.num_warps = md.num_warps
        self.warp_size = md.warp_size
        self.num_ctas = md.num_ctas
        self.cluster = md.cluster
        self.block = md.block
        self.shared = md.shared
        self.cooperative = md.launch_cooperative_grid
        self.pdl = md.launch_pdl
        g, p = md.global_scratch, md.profile_scratch
        self.global_scratch_size = g.size if g else 0
        self.global_scratch_align = g.align if g else 1
        self.profile_scratch_size = p.size if p else 0
        self.profile_scratch_align = p.align if p else 1
        # Triton 3.3 and later append two pointers; 3.2 only the global one.
        self.hidden_params = len(md.scratches)
        n = len(function.params)
        if n < self.hidden_params:
            raise client_error(f"Triton kernel '{self.name}' has {n} parameters; a Triton 3.x "
                               f"kernel has at least the {self.hidden_params} scratch pointers")
        descriptors = len(md.tensordesc_meta)
        self.num_args = n - self.hidden_params - md.descriptor_params
        if self.num_args < descriptors:
            raise client_error(
                f"Triton kernel '{self.name}' has {n} parameters: too few for the "
                f"{self.hidden_params} scratch pointers and the {descriptors} tensor "
                f"descriptors of its metadata (each a tensor map, its shape and strides)")
        # The scratch buffers of the latest launch (None when not needed);
        # reused by later launches while large enough.
        self.global_scratch = None
        self.profile_scratch = None

    def __repr__(self) -> str:
        return (f"<gpuexec.triton.Kernel {self.name}: {self.num_args} args, "
                f"{self.num_warps} warps, {self.shared} B shared>")

    def __enter__(self) -> "Kernel":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Frees the scratch buffers (the session's close frees them too)."""
        for attr in ("global_scratch", "profile_scratch"):
            buf = getattr(self, attr)
            setattr(self, attr, None)
            if buf is not None and not self.session.closed:
                buf.free()

    def __getitem__(self, grid: Any) -> Callable[..., Optional[float]]:
        """``kernel[grid](*args, sync=False)``, as in Triton."""
        return lambda *args, sync=False: self.launch(grid, *args, sync=sync)

    def _scratch(self, what: str, nbytes: int) -> Any:
        attr = what + "_scratch"
        if nbytes == 0:
            return None
        buf = getattr(self, attr)
        if buf is None or buf.nbytes < nbytes:
            if buf is not None:
                buf.free()  # stream-ordered: earlier launches still see it
                setattr(self, attr, None)
            buf = self.session.alloc(nbytes)
            setattr(self, attr, buf)
        return buf

    def cuda_grid(self, grid: Any) -> Tuple[int, int, int]:
        """The CUDA grid for a Triton grid (times the cluster shape)."""
        return self.metadata.launch_config(grid).grid

    def _prepare(self, grid: Any, args: Sequence[Any]) -> Tuple[Any, Any, Any]:
        if len(args) != self.num_args:
            descriptors = len(self.metadata.tensordesc_meta)
            counted = (f", each of its {descriptors} tensor descriptors counted once"
                       if descriptors else "")
            raise client_error(
                f"Triton kernel '{self.name}' takes {self.num_args} arguments (its "
                f"{len(self.function.params)} parameters less the {self.hidden_params} scratch "
                f"pointers Triton appends{counted}; constexprs are compiled in); "
                f"got {len(args)}")
        kernel_args = self.metadata.kernel_args(args)
        config = self.metadata.launch_config(grid)
        if config.ctas == 0:
            return None, None, None
        hidden = [self._scratch(what, nbytes) for what, nbytes in config.scratch]
        return config, kernel_args, hidden

    def launch(self, grid: Any, *args: Any, sync: bool = False) -> Optional[float]:
        """Launches over the Triton ``grid`` (programs) with the kernel's
        non-constexpr arguments (a TensorDescriptor where the kernel takes a
        host tensor descriptor). Returns the GPU time in seconds with
        ``sync``, else None. An empty grid launches nothing (as in Triton)."""
        config, kernel_args, hidden = self._prepare(grid, args)
        if config is None:
            return 0.0 if sync else None
        return self.function.launch(
            config.grid, config.block, *kernel_args, *hidden, shared=config.shared,
            cluster=config.cluster, sync=sync, cooperative=config.cooperative, pdl=config.pdl,
            non_portable_cluster=config.non_portable_cluster,
            cluster_policy=config.cluster_policy)

    def launch_async(self, grid: Any, *args: Any) -> None:
        """Queues the launch and returns at once (see Function.launch_async)."""
        config, kernel_args, hidden = self._prepare(grid, args)
        if config is None:
            return
        self.function.launch_async(
            config.grid, config.block, *kernel_args, *hidden, shared=config.shared,
            cluster=config.cluster, cooperative=config.cooperative, pdl=config.pdl,
            non_portable_cluster=config.non_portable_cluster,
            cluster_policy=config.cluster_policy)


__all__ = ["SUPPORTED", "Compiled", "Kernel", "LaunchConfig", "Metadata", "Scratch", "TensorDescMeta",
           "TensorDescriptor", "activate", "compile", "do_bench", "load", "read_metadata", "use"]
