"""gpuexec.triton.compile: a @triton.jit function compiled ahead of time, on
this machine, for a gpuexec device -- the cubin and the metadata that
gpuexec.triton.load (and the C++ and Node clients) launch.

Triton's own compiler does the work (its ptxas, its disk cache); no GPU,
no libcuda and no torch are needed here.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Dict, Iterable, Mapping, Optional, Union

from ._errors import client_error


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    return str(value)


@dataclasses.dataclass(frozen=True)
class Compiled:
    """A compiled Triton kernel: ``cubin`` (bytes) and ``metadata`` (a dict,
    as Triton writes it as JSON)."""
    name: str
    cubin: bytes
    metadata: Dict[str, Any]

    def save(self, directory: Union[str, os.PathLike]) -> str:
        """Writes <name>.cubin and <name>.json (Triton's cache layout) into
        ``directory``; returns the cubin's path."""
        directory = os.fspath(directory)
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, self.name + ".cubin")
        with open(path, "wb") as f:
            f.write(self.cubin)
        with open(os.path.join(directory, self.name + ".json"), "w", encoding="utf-8") as f:
            json.dump(self.metadata, f, indent=1)
        return path

    def load(self, session: Any) -> Any:
        """The kernel loaded into ``session`` (a gpuexec.triton.Kernel)."""
        from .triton import load  # pylint: disable=import-outside-toplevel
        return load(session, self.cubin, self.metadata)


def _capability(target: Any) -> int:
    """sm_XY as XY: from an int (90), "sm_90", a (9, 0) pair, or a Session
    (its device's)."""
    if isinstance(target, int) and not isinstance(target, bool):
        return target
    if isinstance(target, str) and target.startswith("sm_") and target[3:].rstrip("a").isdigit():
        return int(target[3:].rstrip("a"))
    if isinstance(target, tuple) and len(target) == 2:
        return int(target[0]) * 10 + int(target[1])
    if hasattr(target, "client") and hasattr(target, "device"):
        for d in target.client.devices():
            if d.index == target.device:
                return d.compute_capability[0] * 10 + d.compute_capability[1]
    raise client_error(f"target must be a session, a compute capability such as 90 or "
                       f"'sm_90', or (9, 0); got {str(target)[:60]!r}")


def compile(fn: Any, signature: Mapping[str, str], constexprs: Optional[Mapping[str, Any]] = None,
            *, target: Any = 90, aligned: Iterable[str] = (),
            options: Optional[Mapping[str, Any]] = None) -> Compiled:
    """Compiles the @triton.jit function ``fn`` for ``target`` (a session,
    whose device's compute capability is used, or a capability: 90,
    "sm_90", (9, 0)).

    ``signature``: each parameter's Triton type by name ("*fp32", "i32",
    ..., "constexpr"); ``constexprs``: the constexpr parameters' values by
    name; ``aligned``: pointer or integer parameters known to be multiples
    of 16 (Triton's tt.divisibility, as its launcher finds by itself);
    ``options``: num_warps, num_stages, num_ctas and the like. Raises Error
    (FAILED_PRECONDITION) when Triton is missing or unsupported, and lets
    Triton's own compile errors through."""
    from ._triton_driver import _import_triton  # pylint: disable=import-outside-toplevel
    triton = _import_triton()
    from triton.backends.compiler import GPUTarget  # pylint: disable=import-outside-toplevel
    names = list(signature)
    constexprs = dict(constexprs or {})
    attrs = {}
    for name in aligned:
        if name not in names:
            raise client_error(f"aligned names {str(name)[:60]!r}, which is not a parameter "
                               f"of {getattr(fn, '__name__', 'the kernel')}")
        attrs[(names.index(name),)] = [["tt.divisibility", 16]]
    for name in constexprs:
        if name not in names:
            raise client_error(f"constexprs names {str(name)[:60]!r}, which is not a parameter "
                               f"of {getattr(fn, '__name__', 'the kernel')}")
    source = triton.compiler.ASTSource(
        fn=fn, signature=dict(signature),
        constexprs={(names.index(k),): v for k, v in constexprs.items()}, attrs=attrs)
    compiled = triton.compile(source, target=GPUTarget("cuda", _capability(target), 32),
                              options=dict(options or {}))
    metadata = json.loads(json.dumps(compiled.metadata._asdict(), default=_jsonable))
    return Compiled(name=metadata["name"], cubin=bytes(compiled.asm["cubin"]), metadata=metadata)
