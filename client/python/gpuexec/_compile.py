"""Kernels from source: CUDA C++ compiled by the daemon (CompileModule).

The daemon compiles the source with NVRTC for the session's device, in a
sandboxed process of its own, keeps the result in its cache (the same
source, headers, options and name expressions for the same architecture
are not compiled again, whichever session asks) and loads it into the
session as LoadModule would. ``Session.compile`` and ``await
AsyncSession.compile`` return the module with what the compile said
(CompiledModule, AsyncCompiledModule); ``RawKernel`` is CuPy's habit: the
source and a kernel's name, compiled on first use in each session.

Errors are gpuexec.Error with the daemon's code and message:
INVALID_ARGUMENT for source that does not compile (the message carries the
first 2 KiB of NVRTC's log) or for an option, header or name the daemon
refuses; FAILED_PRECONDITION where the daemon cannot compile (no NVRTC,
compiling turned off, no sandbox), saying why; RESOURCE_EXHAUSTED and
DEADLINE_EXCEEDED for a compile past the daemon's limits. The types of the
arguments are checked here, before any call.
"""

from __future__ import annotations

import threading
from typing import (TYPE_CHECKING, Any, Dict, Iterable, List, Mapping, Optional, Sequence,
                    Tuple, Union)

from ._errors import Error, client_error
from ._function import Dims, Function, Module
from ._transfer import clipped_repr
from .v1 import gpuexec_pb2 as pb

if TYPE_CHECKING:  # pragma: no cover
    from ._aio_objects import AsyncFunction, AsyncModule
    from ._session import Session

DEFAULT_SOURCE_NAME = "kernel.cu"
# The longest a compile call waits for its answer, in seconds: well past
# the daemon's own limits (a minute of compiling after a wait in its
# queue), so that a daemon that never answers cannot hold a caller for
# ever.
COMPILE_TIMEOUT_S = 600.0
# Source and header text: str, or bytes of UTF-8.
Text = Union[str, bytes]
Headers = Union[Mapping[str, Text], Iterable[Tuple[str, Text]], None]


def _text(value: Any, what: str) -> str:
    """``value`` (str, or bytes of UTF-8) as str; raises the client's error
    naming ``what`` for anything else."""
    if isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError as e:
            raise client_error(f"{what} is bytes that are not UTF-8 (at byte {e.start}); "
                               "CUDA C++ source is text: pass a str") from None
    hint = ""
    if hasattr(value, "__fspath__"):
        hint = "; to compile a file, pass its text (pathlib.Path(path).read_text())"
    raise client_error(f"{what} must be a str (CUDA C++ source text), got a "
                       f"{type(value).__name__[:60]}{hint}")


def _strings(value: Any, what: str) -> List[str]:
    """A str, or an iterable of str, as a list; one str is one item (as
    ``options="-std=c++17"`` means)."""
    if isinstance(value, str):
        return [value]
    if value is None or isinstance(value, (bytes, bytearray, Mapping)):
        raise client_error(f"{what} must be a str or a sequence of str, got "
                           f"{clipped_repr(value)}")
    try:
        items = list(value)
    except TypeError:
        raise client_error(f"{what} must be a str or a sequence of str, got a "
                           f"{type(value).__name__[:60]}") from None
    for i, item in enumerate(items):
        if not isinstance(item, str):
            raise client_error(f"{what}[{i}] must be a str, got {clipped_repr(item)}")
    return items


def _headers(headers: Headers) -> List[Any]:
    """``headers`` (a mapping or pairs of include name -> text) as
    CompileHeader messages."""
    if headers is None:
        return []
    if isinstance(headers, (str, bytes, bytearray)):
        raise client_error("headers must map each include name to its text "
                           "({'util.cuh': '...'}), got a "
                           f"{type(headers).__name__}")
    try:
        pairs = list(headers.items()) if isinstance(headers, Mapping) else list(headers)
    except TypeError:
        raise client_error("headers must map each include name to its text "
                           f"({{'util.cuh': '...'}}), got a {type(headers).__name__[:60]}"
                           ) from None
    out = []
    for pair in pairs:
        if not isinstance(pair, tuple) or len(pair) != 2:
            raise client_error("headers must map each include name to its text "
                               f"({{'util.cuh': '...'}}); an item is {clipped_repr(pair)}")
        name, content = pair
        if not isinstance(name, str):
            raise client_error(f"a header's name must be a str, got {clipped_repr(name)}")
        out.append(pb.CompileHeader(name=name, content=_text(content, f"header {name[:128]!r}")))
    return out


def compile_request(token: str, source: Any, name: Any, headers: Headers, options: Any,
                    name_expressions: Any, return_image: bool = False) -> Any:
    """The CompileModuleRequest for these arguments, their types checked
    (the daemon checks the rest: sizes, option allow-list, names)."""
    if not isinstance(name, str):
        raise client_error(f"name (the source's file name in NVRTC's log) must be a str, got "
                           f"{clipped_repr(name)}")
    return pb.CompileModuleRequest(
        session=token, source=_text(source, "source"), source_name=name,
        headers=_headers(headers), options=_strings(options, "options"),
        name_expressions=_strings(name_expressions, "name_expressions"),
        return_image=bool(return_image))


class _Compiled:
    """What a compile answered, beside the module (both clients' compiled
    modules)."""

    def __init__(self, response: Any) -> None:
        # True when the daemon answered from its cache: no compile ran.
        self.cached: bool = bool(response.cached)
        # NVRTC's log of the compile (its warnings), at most 64 KiB;
        # log_bytes is the whole log's length.
        self.log: str = response.log
        self.log_bytes: int = int(response.log_bytes)
        # Each name expression asked for -> its lowered (mangled) name.
        self.lowered_names: Dict[str, str] = {
            lowered.name_expression: lowered.lowered_name for lowered in response.lowered_names}
        # The kernel names the module defines (lowered names for templates).
        self.kernels: List[str] = list(response.kernels)
        self.arch: str = response.arch  # "sm_90"
        self.nvrtc_version: str = response.nvrtc_version  # "13.0"
        # Seconds the compile that made the module took (for a cached
        # answer, the compile that filled the cache).
        self.compile_time: float = response.compile_time_us / 1e6
        # With return_image=True: the image (a cubin of the device's
        # architecture, or PTX when image_is_ptx), to keep or to load
        # elsewhere with load_module; else b"".
        self.image: bytes = bytes(response.image)
        self.image_is_ptx: bool = bool(response.image_is_ptx)

    def kernel_name(self, name: Any) -> str:
        """The name GetFunction takes for ``name``: a name expression's
        lowered name, else ``name`` itself (an extern "C" kernel's name or
        a lowered name). An expression of a template not compiled is
        refused here, saying how to ask for it."""
        if not isinstance(name, str):
            raise client_error(f"a kernel's name must be a str, got {clipped_repr(name)}")
        lowered = self.lowered_names.get(name)
        if lowered is not None:
            return lowered
        if "<" in name and name not in self.kernels:
            asked = ", ".join(repr(e[:128]) for e in list(self.lowered_names)[:8]) or "none"
            raise client_error(
                f"kernel {clipped_repr(name)}: a template instantiation is compiled only when "
                f"named in name_expressions (this compile's: {asked}); compile with "
                f"name_expressions=[{clipped_repr(name)}]")
        return name

    def _facts(self) -> str:
        return (f"{self.arch}, NVRTC {self.nvrtc_version}, {len(self.kernels)} kernels"
                f"{', cached' if self.cached else ''}")


class CompiledModule(_Compiled):
    """A module compiled from source by the daemon and loaded into a
    session (Session.compile).

    ``module``: the gpuexec.Module (dropped when the session closes);
    ``function(name)`` is its kernel, by extern "C" name or by a name
    expression given to the compile ("saxpy<float>"). ``cached``: answered
    from the daemon's cache. ``log`` / ``log_bytes``: NVRTC's warnings (at
    most 64 KiB) and the whole log's length. ``lowered_names``: each name
    expression -> its lowered name. ``kernels``: the names the module
    defines. ``arch`` ("sm_90"), ``nvrtc_version`` ("13.0"),
    ``compile_time`` (seconds).
    """

    def __init__(self, module: Module, response: Any) -> None:
        super().__init__(response)
        self.module = module

    def __repr__(self) -> str:
        return f"<gpuexec.CompiledModule {self.module.sha256[:12]} ({self._facts()})>"

    def function(self, name: str) -> Function:
        """The kernel ``name``: a name expression given to the compile
        (resolved through ``lowered_names``), an extern "C" kernel's name,
        or a lowered name."""
        return self.module.function(self.kernel_name(name))


class AsyncCompiledModule(_Compiled):
    """CompiledModule of gpuexec.aio (AsyncSession.compile): the same
    facts; ``module`` is a gpuexec.aio.AsyncModule and ``function`` is
    awaited."""

    def __init__(self, module: "AsyncModule", response: Any) -> None:
        super().__init__(response)
        self.module = module

    def __repr__(self) -> str:
        return f"<gpuexec.aio.AsyncCompiledModule {self.module.sha256[:12]} ({self._facts()})>"

    async def function(self, name: str) -> "AsyncFunction":
        """The kernel ``name`` (see CompiledModule.function)."""
        return await self.module.function(self.kernel_name(name))


def compile_in(session: "Session", source: Any, name: Any, headers: Headers, options: Any,
               name_expressions: Any, return_image: bool = False) -> CompiledModule:
    """Session.compile: one CompileModule call, of COMPILE_TIMEOUT_S at
    most (the daemon stops a compile at its own limit well before)."""
    request = compile_request(session.token, source, name, headers, options, name_expressions,
                              return_image)
    try:
        response = session.client._call(session.client.stub.CompileModule, request,
                                         COMPILE_TIMEOUT_S)
    except Error as e:
        raise session._failed(e) from None
    # As the C++ client has it: "uploaded" when the compile made a new
    # image, not one from the cache.
    kind = pb.MODULE_KIND_PTX if response.image_is_ptx else pb.MODULE_KIND_CUBIN
    module = Module(session, response.module, response.sha256, not response.cached, kind)
    return CompiledModule(module, response)


class RawKernel:
    """One kernel of CUDA C++ source, compiled by the daemon on first use in
    each session (as CuPy's RawKernel is compiled on first use per device)::

        saxpy = gpuexec.RawKernel(SOURCE, "saxpy")
        saxpy(session, grid, block, (gpuexec.f32(2.0), x, y, gpuexec.u64(n)))
        saxpy[grid, block](session, gpuexec.f32(2.0), x, y, gpuexec.u64(n))

    ``name``: the kernel, an extern "C" name or a template's name
    expression ("axpy<float>", which is then added to
    ``name_expressions``). ``options``, ``headers``, ``name_expressions``
    and ``source_name`` are Session.compile's (``source_name`` is its
    ``name``).

    Calling it launches as gpuexec.Function is called, with the session
    first: ``k(session, grid, block, args, shared_mem=0, sync=False, ...)``
    (queued without a round trip unless ``sync`` or an In/Out/InOut
    argument), or ``k[grid, block](session, *args)``. ``function(session)``
    is the gpuexec.Function itself (for ``launch`` and ``launch_async``);
    ``compile(session)`` the CompiledModule (its log, lowered names).

    Each session compiles once, at its first use (the daemon's cache makes
    the compile of a source seen before cheap); the session object keeps
    the compiled module (a RawKernel keeps no session alive). Thread-safe.
    For gpuexec.aio, use ``await session.compile(...)``.
    """

    def __init__(self, code: Text, name: str, options: Union[str, Sequence[str]] = (), *,
                 name_expressions: Union[str, Sequence[str]] = (), headers: Headers = None,
                 source_name: str = DEFAULT_SOURCE_NAME) -> None:
        if not isinstance(name, str) or not name:
            raise client_error(f"RawKernel's name must be a kernel's name (a non-empty str), "
                               f"got {clipped_repr(name)}")
        expressions = _strings(name_expressions, "name_expressions")
        if "<" in name and name not in expressions:
            expressions.append(name)
        # Checked now, as the compile will send them.
        request = compile_request("", code, source_name, headers, options, expressions)
        self.code: str = request.source
        self.name = name
        self.options: Tuple[str, ...] = tuple(request.options)
        self.name_expressions: Tuple[str, ...] = tuple(expressions)
        self.headers: Dict[str, str] = {h.name: h.content for h in request.headers}
        self.source_name = source_name
        self._header_pairs = [(h.name, h.content) for h in request.headers]
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<gpuexec.RawKernel {clipped_repr(self.name)} of {self.source_name!r}>"

    def _entry(self, session: "Session") -> List[Any]:
        """[CompiledModule, Function or None] of this kernel in ``session``,
        compiled at the first call for that session. The session keeps
        them (Session._raw_kernels, weakly keyed by the RawKernel)."""
        cache = getattr(session, "_raw_kernels", None)
        entry = None if cache is None else cache.get(self)
        if entry is not None:
            return entry
        from ._session import Session  # pylint: disable=import-outside-toplevel  (a cycle)
        if not isinstance(session, Session):
            aio = type(session).__name__ == "AsyncSession"
            raise client_error(
                f"RawKernel {clipped_repr(self.name)}: the first argument must be a "
                f"gpuexec.Session, got {clipped_repr(session)}"
                + ("; in gpuexec.aio, compile with await session.compile(...) and launch the "
                   "function it gives" if aio else ""))
        # One compile per session, whichever threads ask at once.
        with self._lock:
            entry = session._raw_kernels.get(self)
            if entry is None:
                compiled = session.compile(self.code, name=self.source_name,
                                           headers=self._header_pairs, options=self.options,
                                           name_expressions=self.name_expressions)
                entry = [compiled, None]
                session._raw_kernels[self] = entry
        return entry

    def compile(self, session: "Session") -> CompiledModule:
        """The kernel's source compiled and loaded in ``session``: at the
        first call for that session; later calls return the same
        CompiledModule."""
        compiled: CompiledModule = self._entry(session)[0]
        return compiled

    def function(self, session: "Session") -> Function:
        """The kernel as a gpuexec.Function of ``session`` (compiled at its
        first use there)."""
        entry = self._entry(session)
        function = entry[1]
        if function is None:
            function = entry[1] = entry[0].function(self.name)
        return function

    def __call__(self, session: "Session", grid: Dims, block: Dims,
                 args: Union[Tuple[Any, ...], Sequence[Any]], *, shared_mem: int = 0,
                 cluster: Optional[Dims] = None, sync: bool = False, cooperative: bool = False,
                 pdl: bool = False, non_portable_cluster: bool = False,
                 cluster_policy: Optional[str] = None) -> Optional[float]:
        """Launches the kernel in ``session``: ``k(session, grid, block,
        (a, x, y, n))``; the rest is gpuexec.Function.__call__'s (queued
        unless ``sync`` or an In/Out/InOut argument; with ``sync`` returns
        the GPU seconds)."""
        return self.function(session)(grid, block, args, shared_mem=shared_mem, cluster=cluster,
                                      sync=sync, cooperative=cooperative, pdl=pdl,
                                      non_portable_cluster=non_portable_cluster,
                                      cluster_policy=cluster_policy)

    def __getitem__(self, config: Tuple[Any, ...]) -> "ConfiguredRawKernel":
        """Numba's launch configuration, the session at the call:
        ``k[grid, block](session, *args)``, or ``k[grid, block, stream,
        shared_mem]`` (see gpuexec.Function.__getitem__)."""
        if not isinstance(config, tuple) or not 2 <= len(config) <= 4:
            raise client_error(
                f"RawKernel {clipped_repr(self.name)}: a launch configuration is k[grid, block] "
                f"or k[grid, block, stream, shared_mem], got k[{clipped_repr(config)}]")
        return ConfiguredRawKernel(self, config)


class ConfiguredRawKernel:
    """A RawKernel with its launch configuration (``k[grid, block]``);
    calling it with a session and the arguments launches the kernel."""

    __slots__ = ("kernel", "config")

    def __init__(self, kernel: RawKernel, config: Tuple[Any, ...]) -> None:
        self.kernel = kernel
        self.config = config

    def __repr__(self) -> str:
        return f"<gpuexec.RawKernel {clipped_repr(self.kernel.name)}[{clipped_repr(self.config)}]>"

    def __call__(self, session: "Session", *args: Any) -> None:
        """Launches the kernel in ``session`` with ``args`` (see
        gpuexec.Function.__call__)."""
        self.kernel.function(session)[self.config](*args)
