"""The launcher Triton's runtime calls for a kernel compiled for a gpuexec
session (``driver.launcher_cls``): it turns ``kernel[grid](...)``'s
arguments into one launch on the session's command stream, with no round
trip to the daemon.

Triton calls ``Launcher(src, metadata)`` once per compiled kernel and then
``launcher(gridX, gridY, gridZ, stream, function, packed_metadata,
launch_metadata, enter_hook, exit_hook, *args)`` per launch, ``args`` being
every parameter of the ``@triton.jit`` function in order (constexprs
included). The kernel's parameters follow Triton 3.6's own launcher
(backends/nvidia/driver.py, make_launcher): the signature flattened (tuples
opened), constexprs left out, each host tensor descriptor expanded, then the
global and profile scratch pointers. Each parameter's converter is chosen
once, from its type in the signature, so that a launch does no lookups.
"""

from __future__ import annotations

import re
from typing import Any, Callable, List, Optional, Sequence, Tuple

from . import _ring
from ._args import Arg, bf16, f16, f32, f64, i8, i16, i32, i64, null, u8, u16, u32, u64
from ._buffer import Buffer
from ._errors import Error, client_error, short_token
from ._function import _shown
from ._triton_metadata import Metadata, TensorDescriptor, read_metadata

# The scalar types of a Triton signature and the argument each becomes.
_SCALARS: dict = {
    "i1": i8, "i8": i8, "i16": i16, "i32": i32, "i64": i64,
    "u1": u8, "u8": u8, "u16": u16, "u32": u32, "u64": u64,
    "fp16": f16, "bf16": bf16, "fp32": f32, "f32": f32, "fp64": f64,
}
# Argument types whose values make a launch's bytes (see Launcher.__call__).
_KEYABLE = frozenset((Buffer, int, bool, type(None)))
_MAX_OPS = 64
_TENSORDESC = re.compile(r"tensordesc<([^[>]*)\[([^]]*)\]")


def _flatten(sig: Any, out: list) -> None:
    if isinstance(sig, tuple):
        for s in sig:
            _flatten(s, out)
    else:
        out.append(sig)


def _flatten_value(value: Any, sig: Any, out: list) -> None:
    """``value`` laid out as ``sig`` is: a tuple parameter's items in order."""
    if isinstance(sig, tuple):
        for v, s in zip(value, sig):
            _flatten_value(v, s, out)
    else:
        out.append(value)


def _describe(value: Any) -> str:
    text = type(value).__name__
    return text if len(text) <= 60 else text[:57] + "..."


class Launcher:
    """One compiled kernel's launches in one session (see the module)."""

    def __init__(self, session: Any, src: Any, metadata: Any) -> None:
        self.session = session
        meta = metadata._asdict() if hasattr(metadata, "_asdict") else dict(metadata)
        self.metadata: Metadata = read_metadata(meta)
        self.name = self.metadata.name
        self._shown = _shown(self.name)  # quoted, bounded and escaped for messages
        names = list(getattr(getattr(src, "fn", None), "arg_names", None) or [])
        signature = list(src.signature.items())
        self._names = [n for n, _ in signature] or names
        self._types = [t for _, t in signature]
        self._has_tuples = any(isinstance(t, tuple) for t in self._types)
        flat: List[Any] = []
        for t in self._types:
            _flatten(t, flat)
        # (converter, parameter name) of each flattened argument; None for a
        # constexpr, which the kernel does not take.
        self._convert: List[Optional[Callable[[Any, int], Any]]] = []
        descriptors = 0
        for index, ty in enumerate(flat):
            if ty == "constexpr":
                self._convert.append(None)
            elif isinstance(ty, str) and ty.startswith("*"):
                self._convert.append(self._pointer)
            elif isinstance(ty, str) and ty.startswith("tensordesc"):
                self._convert.append(self._descriptor(descriptors, ty))
                descriptors += 1
            elif ty in _SCALARS:
                self._convert.append(self._scalar(_SCALARS[ty], ty))
            else:
                raise client_error(f"Triton kernel {self._shown}: parameter {index} has type "
                                   f"{str(ty)[:40]!r}, which gpuexec cannot pass")
        self._flat_types = flat
        if self.metadata.tensordesc_meta and descriptors != len(self.metadata.tensordesc_meta):
            raise client_error(f"Triton kernel {self._shown}: {descriptors} tensor descriptor "
                               f"parameters, {len(self.metadata.tensordesc_meta)} in its metadata")
        md = self.metadata
        c = md.cluster
        blocks = c[0] * c[1] * c[2]
        self._cluster = c if blocks > 1 else None
        from ._function import _launch_attributes  # pylint: disable=import-outside-toplevel
        self._attributes = _launch_attributes(md.launch_cooperative_grid, md.launch_pdl,
                                              blocks > 8, "spread" if blocks > 1 else None)
        self._block = md.block
        self._shared = md.shared
        self._scratch_specs = md.scratches
        self._scratch: dict = {}
        # Launches made, by (grid, function, arguments, whether on a ring):
        # ("ring", a ring record's body) or ("stream", the stream's bytes).
        self._ops: dict = {}
        self._frees = getattr(session, "_frees", 0)  # the session's count when _ops was right

    def __repr__(self) -> str:
        return (f"<gpuexec Triton launcher {self._shown} in session "
                f"{short_token(self.session.token)}>")

    # ------------------------------------------------------- converters

    def _pointer(self, value: Any, index: int) -> Any:
        if isinstance(value, Buffer):
            if value.session is not self.session:
                self._other_session(value, index)
            return value
        if value is None:
            return null()
        base = getattr(value, "base", None)  # triton.reinterpret's TensorWrapper
        if isinstance(base, Buffer) and hasattr(value, "data_ptr"):
            return self._pointer(base, index)
        what = self._arg_name(index)
        if type(value).__module__ == "numpy":
            raise client_error(
                f"{what} of Triton kernel {self._shown} is a numpy array: host memory, which "
                "the GPU cannot read; upload it with session.asarray(x) and pass the buffer")
        if isinstance(value, int):
            raise client_error(
                f"{what} of Triton kernel {self._shown} is an int where the kernel takes a "
                "pointer; pass the gpuexec buffer itself (a buffer's data_ptr() names it for "
                "Triton's specialization only, it is not a device address)")
        if hasattr(value, "data_ptr"):
            raise client_error(
                f"{what} of Triton kernel {self._shown} is a {_describe(value)}, not gpuexec "
                "memory (a torch tensor lives on this process's GPU, not the daemon's); "
                "use a buffer of the session: session.asarray(...) or session.empty(...)")
        raise client_error(f"{what} of Triton kernel {self._shown} is a {_describe(value)}; "
                           "the kernel takes a pointer: pass a gpuexec buffer or None")

    def _other_session(self, value: Buffer, index: int) -> None:
        raise client_error(
            f"{self._arg_name(index)} of Triton kernel {self._shown} is a buffer of session "
            f"{short_token(value.session.token)}; the kernel runs in session "
            f"{short_token(self.session.token)} (the active one): a session's buffers are "
            "its own")

    def _scalar(self, make: Callable[[Any], Arg], ty: str) -> Callable[[Any, int], Any]:
        def convert(value: Any, index: int) -> Any:
            try:
                return make(value)
            except (Error, TypeError, ValueError, OverflowError) as e:
                why = str(getattr(e, "message", e))
                raise client_error(f"{self._arg_name(index)} of Triton kernel {self._shown} "
                                   f"(type {ty}): {why[:200]}") from None
        return convert

    def _descriptor(self, n: int, ty: str) -> Callable[[Any, int], Any]:
        match = _TENSORDESC.match(ty)
        rank = match.group(2).count(",") + 1 if match else 0

        def convert(value: Any, index: int) -> Any:
            desc = value if isinstance(value, TensorDescriptor) else None
            if desc is None and all(hasattr(value, a) for a in ("base", "shape", "strides")):
                base = value.base
                if not isinstance(base, Buffer):
                    raise client_error(
                        f"{self._arg_name(index)} of Triton kernel {self._shown} is a tensor "
                        f"descriptor over a {_describe(base)}; its base must be a gpuexec "
                        "buffer of the session")
                if base.session is not self.session:
                    self._other_session(base, index)
                desc = TensorDescriptor.from_triton(value)
            if desc is None:
                raise client_error(f"{self._arg_name(index)} of Triton kernel {self._shown} "
                                   f"is a {_describe(value)}; the kernel takes a tensor "
                                   "descriptor (triton.tools.tensor_descriptor."
                                   "TensorDescriptor over a gpuexec buffer)")
            entries = self.metadata.tensordesc_meta
            if entries:
                return desc.kernel_params(entries[n], n)
            # Lowered without TMA: the base pointer, shape and strides (i64),
            # the padding flag, then shape (i32) and strides (i64) again.
            if len(desc.shape) != rank:
                raise client_error(f"{self._arg_name(index)} of Triton kernel {self._shown}: "
                                   f"a descriptor of rank {len(desc.shape)}; the kernel's has "
                                   f"rank {rank}")
            parts: list = [self._pointer(desc.base, index)]
            parts += [i64(v) for v in desc.shape] + [i64(v) for v in desc.strides]
            parts.append(i8(1 if desc.padding == "nan" else 0))
            parts += [i32(v) for v in desc.shape] + [i64(v) for v in desc.strides]
            return parts
        convert.expands = True  # type: ignore[attr-defined]
        return convert

    def _arg_name(self, index: int) -> str:
        if not self._has_tuples and index < len(self._names):
            return f"argument '{self._names[index]}'"
        return f"argument {index}"

    # ---------------------------------------------------------- launching

    def _scratch_buffer(self, what: str, nbytes: int) -> Any:
        if nbytes == 0:
            return null()
        buf = self._scratch.get(what)
        if buf is None or buf.nbytes < nbytes:
            if buf is not None:
                buf.free()  # stream-ordered: launches queued before still see it
                self._scratch.pop(what, None)
                self._ops.clear()  # they name the buffer freed
            buf = self.session.alloc(nbytes)
            self._scratch[what] = buf
        return buf

    def kernel_args(self, args: Sequence[Any]) -> list:
        """The kernel's parameters for ``args`` (every parameter of the
        @triton.jit function, constexprs included)."""
        if len(args) != len(self._types):
            raise client_error(f"Triton kernel {self._shown} takes {len(self._types)} "
                               f"arguments (constexprs included), got {len(args)}")
        if self._has_tuples:
            flat: list = []
            for value, ty in zip(args, self._types):
                _flatten_value(value, ty, flat)
            args = flat
        out = []
        for index, (convert, value) in enumerate(zip(self._convert, args)):
            if convert is None:
                continue
            made = convert(value, index)
            if type(made) is list:  # pylint: disable=unidiomatic-typecheck
                out.extend(made)
            else:
                out.append(made)
        return out

    def _op(self, grid: Tuple[int, int, int], function: Any, args: Sequence[Any],
            sync: bool, ring: bool = False) -> Optional[Tuple[str, bytes]]:
        """The launch as ("ring", a record's body) where ``ring`` and a
        record holds it, else ("stream", the command stream's bytes); None
        for an empty grid."""
        if function.session is not self.session:
            raise client_error(
                f"Triton kernel {self._shown} was loaded in session "
                f"{short_token(function.session.token)}, its launcher belongs to session "
                f"{short_token(self.session.token)}: activate the session the kernel runs in")
        params = self.kernel_args(args)
        c = self.metadata.cluster
        cuda_grid = (grid[0] * c[0], grid[1] * c[1], grid[2] * c[2])
        ctas = cuda_grid[0] * cuda_grid[1] * cuda_grid[2]
        if ctas == 0:
            return None
        for what, spec in self._scratch_specs:
            params.append(self._scratch_buffer(what, spec.bytes_for(ctas)))
        if ring:
            body = function._ring_launch(cuda_grid, self._block, params, self._shared,
                                         self._cluster, sync, self._attributes)
            if body is not None:
                return ("ring", body)
        return ("stream", function._launch_op(cuda_grid, self._block, params, self._shared,
                                              self._cluster, sync, self._attributes))

    def _submit(self, op: Tuple[str, bytes], sync: bool, ring: Any) -> Any:
        """Sends ``op`` (from _op) on ``ring`` (the session's, for a
        ring's record) or the command stream."""
        session = self.session
        try:
            if op[0] == "ring":
                answer = session._commands.post(ring, _ring.LAUNCH, op[1], sync)
            else:
                answer = session._commands.submit(op[1], wait=sync)
        except Error as e:
            raise session._failed(e) from None
        recording = session._recording
        if recording is not None:  # a node of the graph being recorded
            recording.recorded()
        return answer

    def launch(self, grid: Tuple[int, int, int], function: Any, args: Sequence[Any],
               sync: bool = False) -> Optional[float]:
        """Queues the launch of the Triton ``grid`` (3 ints); with ``sync``
        waits and returns the GPU seconds."""
        ring = self.session._commands.ring()
        op = self._op(grid, function, args, sync, ring is not None)
        if op is None:
            return 0.0 if sync else None
        result = self._submit(op, sync, ring)
        return result.gpu_time_ns / 1e9 if sync else None

    def __call__(self, gridX: int, gridY: int, gridZ: int, stream: Any, function: Any,
                 *rest: Any) -> None:
        # packed_metadata, launch_metadata, enter_hook, exit_hook, *args
        launch_metadata, enter_hook, exit_hook = rest[1], rest[2], rest[3]
        if enter_hook is not None:
            enter_hook(launch_metadata)
        args = rest[4:]
        # A program launches a kernel again and again with the same buffers
        # and sizes: the launch's bytes are kept by its arguments when every
        # one is a buffer, an int or None (their identity or value gives the
        # same bytes; a float's would not: -0.0 == 0.0).
        key: Any = None
        op = None
        frees = getattr(self.session, "_frees", 0)
        if frees != self._frees:  # a buffer was freed: a kept launch may name it
            self._ops.clear()
            self._frees = frees
        ring = self.session._commands.ring()
        for a in args:
            if type(a) not in _KEYABLE:
                break
        else:
            key = (gridX, gridY, gridZ, function, args, ring is not None)
            op = self._ops.get(key)
        if op is None:
            op = self._op((gridX, gridY, gridZ), function, args, False, ring is not None)
            if op is None:
                op = ("", b"")  # an empty grid: nothing is launched
            if key is not None:
                if len(self._ops) >= _MAX_OPS:
                    self._ops.clear()
                self._ops[key] = op
        if op[0]:
            self._submit(op, False, ring)
        if exit_hook is not None:
            exit_hook(launch_metadata)
