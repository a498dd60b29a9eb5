"""Triton's active driver made a gpuexec session: ``@triton.jit`` kernels
run unchanged on the daemon's GPU.

``gpuexec.triton.activate(session)`` (or ``with gpuexec.triton.use(session):``)
calls ``triton.runtime.driver.set_active`` with a driver of ours, a
subclass of Triton's ``DriverBase`` (not of its CUDA driver, whose
constructor builds a launcher against libcuda). It reports the session's
device as ``GPUTarget("cuda", <compute capability>, 32)``, so Triton's own
CUDA backend compiles on this machine, with its own ptxas and disk cache,
and needs no GPU, no libcuda and no torch here. Then:

- ``utils.load_binary`` loads the cubin into the session (by its SHA-256:
  the daemon keeps one copy per device, and this driver asks once per
  image) and returns the kernel's registers, spills (local bytes / 4, as
  Triton's driver counts them) and its limit of threads per block;
- ``launcher_cls`` is _triton_launcher.Launcher: each ``kernel[grid](...)``
  becomes one launch on the session's command stream, without a round trip;
- ``get_benchmarker()`` times with the daemon's GPU time (do_bench here),
  and ``get_device_interface()`` gives ``synchronize()`` and timing events
  so that ``triton.testing.do_bench`` works too (see _Event);
- ``get_current_device()`` is a number of this driver's own, one per
  session: Triton keeps its compiled kernels per device, and a kernel
  loaded in one session must never be launched in another.

Only Triton versions whose driver interface this was checked against are
accepted (SUPPORTED); GPUEXEC_TRITON_ANY_VERSION=1 lets another try.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import os
import statistics
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

from . import _wire
from ._errors import Error, client_error, short_token
from ._triton_launcher import Launcher

# Triton versions (MAJOR.MINOR) whose driver interface this driver follows.
SUPPORTED = ("3.6",)
_ANY_VERSION_ENV = "GPUEXEC_TRITON_ANY_VERSION"
# Shared memory a block may opt in to, by compute capability: the CUDA
# programming guide's table (the daemon refuses a launch beyond its device's
# own figure in any case).
_MAX_SHARED = {(7, 0): 98304, (7, 2): 98304, (7, 5): 65536, (8, 0): 166912, (8, 6): 101376,
               (8, 7): 166912, (8, 9): 101376, (9, 0): 232448, (10, 0): 232448,
               (10, 3): 232448, (12, 0): 101376}
# The buffer the benchmarker clears between runs, so that L2 holds none of
# the kernel's inputs (Triton's figure); halved until the session holds it.
_CACHE_BYTES = 256 << 20
_MIN_CACHE_BYTES = 16 << 20

_MAX_UNANSWERED = 4096
_MAX_MARKS = 100000  # kept for elapsed_time; older events are refused
_numbers = itertools.count(1 << 20)  # device numbers of ours (far from real ones)


def _import_triton() -> Any:
    try:
        import triton  # pylint: disable=import-outside-toplevel
    except ImportError as e:
        raise client_error(f"gpuexec.triton.activate needs Triton, which cannot be imported "
                           f"here ({str(e)[:200]}); install it (pip install triton: it "
                           "brings its own ptxas and needs no GPU or torch on this machine)",
                           _failed_precondition()) from None
    version = getattr(triton, "__version__", "?")
    if ".".join(version.split(".")[:2]) not in SUPPORTED and not os.environ.get(
            _ANY_VERSION_ENV):
        raise client_error(f"Triton {version[:40]} is not supported by gpuexec's Triton driver: "
                           f"supported are {', '.join(SUPPORTED)}; install one of those, or "
                           f"set {_ANY_VERSION_ENV}=1 to try this one anyway",
                           _failed_precondition())
    return triton


def _resource_exhausted() -> Any:
    import grpc  # pylint: disable=import-outside-toplevel
    return grpc.StatusCode.RESOURCE_EXHAUSTED


def _failed_precondition() -> Any:
    import grpc  # pylint: disable=import-outside-toplevel
    return grpc.StatusCode.FAILED_PRECONDITION


class _Mark:
    """A synchronize queued on the session's command stream, answered later
    with the GPU time of the work queued between it and the synchronize
    before it."""

    def __init__(self, driver: "_State") -> None:
        self.driver = driver
        self.pending = driver.session._commands.submit_later(_wire.SYNCHRONIZE_OP)
        self.seconds: Optional[float] = None

    def wait(self) -> float:
        if self.seconds is None:
            try:
                self.seconds = self.pending.result().gpu_time_ns / 1e9
            except Error as e:
                raise self.driver.session._failed(e) from None
        return self.seconds


class _Event:
    """torch.cuda.Event's part that triton.testing.do_bench uses, on the
    daemon's GPU time: ``record()`` queues a synchronize on the session's
    stream (the caller does not wait), and ``elapsed_time(end)`` is the GPU
    time of the work queued between the two records, in milliseconds. A
    synchronize made otherwise between them (Session.synchronize, a launch
    with sync) takes the time of the work before it out of the figure."""

    def __init__(self, state: "_State", enable_timing: bool = False, **_: Any) -> None:
        self._state = state
        self._index: Optional[int] = None

    def record(self, stream: Any = None) -> None:
        self._index = self._state.mark()

    def synchronize(self) -> None:
        if self._index is not None:
            self._state.marks_through(self._index)

    def elapsed_time(self, end: "_Event") -> float:
        if self._index is None or end._index is None:
            raise client_error("elapsed_time: both events must be recorded first")
        if end._index < self._index:
            raise client_error("elapsed_time: the end event was recorded before the start")
        return self._state.seconds_between(self._index, end._index) * 1e3


class _DeviceInterface:
    """The part of ``torch.cuda`` Triton's benchmarking calls."""

    def __init__(self, state: "_State") -> None:
        self._state = state
        self.Event = lambda enable_timing=False, **kw: _Event(state, enable_timing, **kw)

    def synchronize(self, device: Any = None) -> None:
        self._state.session.synchronize()

    def current_device(self) -> int:
        return self._state.number

    def current_stream(self, device: Any = None) -> int:
        return 0


class _State:
    """What the driver keeps for its session."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self.number = next(_numbers)
        devices = session.client.devices()
        device = next((d for d in devices if d.index == session.device), None)
        if device is None:
            raise client_error(f"session {short_token(session.token)}: its device "
                               f"{session.device} is not among the daemon's devices")
        self.device = device
        major, minor = device.compute_capability
        self.capability = major * 10 + minor
        self.max_shared = _MAX_SHARED.get((major, minor),
                                          _MAX_SHARED[(major, 0)] if (major, 0) in _MAX_SHARED
                                          else 49152)
        self.modules: Dict[str, Any] = {}
        self._lock = threading.Lock()
        self._marks: List[_Mark] = []
        self._first_mark = 0  # the index of _marks[0]

    # ----------------------------------------------------------- timing

    def mark(self) -> int:
        with self._lock:
            self._marks.append(_Mark(self))
            if len(self._marks) > _MAX_MARKS:
                drop = len(self._marks) - _MAX_MARKS
                del self._marks[:drop]  # each waited for already (see below)
                self._first_mark += drop
            index = self._first_mark + len(self._marks) - 1
            # At most _MAX_UNANSWERED marks wait for their answers.
            behind = self._marks[-_MAX_UNANSWERED - 1] if len(self._marks) > _MAX_UNANSWERED \
                else None
        if behind is not None:
            behind.wait()
        return index

    def marks_through(self, index: int) -> None:
        with self._lock:
            marks = self._marks[:index - self._first_mark + 1]
        for m in marks:
            m.wait()

    def seconds_between(self, start: int, end: int) -> float:
        with self._lock:
            base = self._first_mark
            marks = self._marks[max(start - base, 0):end - base + 1]
            if start < base:
                raise client_error("elapsed_time: the start event is too old (more than "
                                   "100000 events were recorded since)")
        total = sum(m.wait() for m in marks[1:])
        if marks:
            marks[0].wait()  # collected, so that the stream keeps no answer
        return total


class DriverMethods:
    """The driver's methods (Triton's DriverBase is mixed in by
    _driver_class, so that this part is usable without Triton)."""

    def __init__(self, session: Any, target: Any = None) -> None:
        state = self._state = _State(session)
        self.session = session
        self.target = target
        self.utils = _Utils(state)
        self.launcher_cls = lambda src, metadata: Launcher(session, src, metadata)
        self._interface = _DeviceInterface(state)
        self._cache: Any = None

    def __repr__(self) -> str:
        return (f"<gpuexec Triton driver: session {short_token(self.session.token)} on "
                f"device {self.session.device} (sm_{self._state.capability})>")

    @staticmethod
    def is_active() -> bool:
        return False  # chosen with set_active only, never by discovery

    def map_python_to_cpp_type(self, ty: str) -> str:
        if ty.startswith("*"):
            return "CUdeviceptr"
        if ty.startswith("tensordesc") or ty == "nvTmaDesc":
            return "CUtensorMap"
        return {"i1": "int8_t", "i8": "int8_t", "i16": "int16_t", "i32": "int32_t",
                "i64": "int64_t", "u1": "uint8_t", "u8": "uint8_t", "u16": "uint16_t",
                "u32": "uint32_t", "u64": "uint64_t", "fp16": "double", "bf16": "double",
                "fp32": "double", "f32": "double", "fp64": "double"}[ty]

    def get_current_target(self) -> Any:
        return self.target

    def get_current_device(self) -> int:
        return self._state.number

    def set_current_device(self, device: int) -> None:
        if device != self._state.number:
            raise client_error(f"the active Triton driver is gpuexec session "
                               f"{short_token(self.session.token)}; switch sessions with "
                               "gpuexec.triton.activate(session)")

    def get_current_stream(self, device: Any = None) -> int:
        return 0

    def get_active_torch_device(self) -> Any:
        raise client_error("the active Triton driver is a gpuexec session, which has no "
                           "torch device; allocate with session.empty(...)")

    def get_device_interface(self) -> _DeviceInterface:
        return self._interface

    def get_benchmarker(self) -> Callable[..., Any]:
        return lambda fn, **kw: do_bench(fn, driver=self, **kw)

    def get_empty_cache_for_benchmark(self) -> Any:
        if self._cache is None:
            nbytes = _CACHE_BYTES
            while True:
                try:
                    self._cache = self.session.alloc(nbytes)
                    break
                except Error as e:
                    if e.code != _resource_exhausted():
                        raise
                    nbytes //= 2
                    if nbytes < _MIN_CACHE_BYTES:
                        self._cache = False  # the session holds none: not cleared
                        break
        return self._cache

    def clear_cache(self, cache: Any) -> None:
        if cache:
            self.session._commands.submit(_wire.memset_op(cache.handle, 0, cache.nbytes, 0),
                                          wait=False)
            recording = self.session._recording
            if recording is not None:  # a node of the graph being recorded
                recording.recorded()

    @property
    def state(self) -> _State:
        return self._state


def _driver_class(triton: Any) -> type:
    from triton.backends.compiler import GPUTarget  # pylint: disable=import-outside-toplevel
    from triton.backends.driver import DriverBase  # pylint: disable=import-outside-toplevel

    class GpuexecDriver(DriverMethods, DriverBase):
        """Triton's driver for one gpuexec session (see gpuexec.triton)."""

        def __init__(self, session: Any) -> None:
            DriverBase.__init__(self)
            DriverMethods.__init__(self, session)
            self.target = GPUTarget("cuda", self._state.capability, 32)

    return GpuexecDriver


class _Utils:
    """``driver.utils``: what Triton asks of the device."""

    def __init__(self, state: _State) -> None:
        self._state = state

    def load_binary(self, name: str, kernel: bytes, shared: int, device: int) -> tuple:
        state = self._state
        digest = hashlib.sha256(kernel).hexdigest()
        module = state.modules.get(digest)
        if module is None:
            module = state.session.load_module(bytes(kernel), kind="cubin")
            state.modules[digest] = module
        function = module.function(name)
        a = function.attributes
        return module, function, a.num_registers, a.local_bytes // 4, a.max_threads_per_block

    def get_device_properties(self, device: Any = None) -> dict:
        state = self._state
        return {"max_shared_mem": state.max_shared, "max_num_regs": 65536,
                "multiprocessor_count": state.device.multiprocessor_count, "warpSize": 32}


_classes: Dict[int, type] = {}


def make_driver(session: Any) -> Any:
    """The Triton driver of ``session``, made at its first use and kept on
    the session (Triton is imported and checked): activating a session
    again reuses its modules, launchers, scratch and benchmark buffers."""
    triton = _import_triton()
    driver = getattr(session, "_triton_driver", None)
    if driver is not None:
        return driver
    cls = _classes.get(id(triton))
    if cls is None:
        cls = _classes[id(triton)] = _driver_class(triton)
    driver = cls(session)
    session._triton_driver = driver
    return driver


def activate(session: Any) -> Any:
    """Makes Triton's active driver one for ``session``: every
    ``kernel[grid](...)`` after it compiles for the session's device and
    runs there. Returns the driver. Raises Error (FAILED_PRECONDITION) when
    Triton is missing or of a version not supported."""
    if getattr(session, "closed", False):
        raise client_error(f"session {short_token(session.token)} is closed; activate an "
                           "open session")
    driver = make_driver(session)
    import triton.runtime  # pylint: disable=import-outside-toplevel
    triton.runtime.driver.set_active(driver)
    return driver


@contextlib.contextmanager
def use(session: Any) -> Iterator[Any]:
    """``with gpuexec.triton.use(session):`` -- the session is Triton's
    active driver inside the block; the one active before comes back after."""
    driver = make_driver(session)
    import triton.runtime  # pylint: disable=import-outside-toplevel
    config = triton.runtime.driver
    before = config._active  # pylint: disable=protected-access
    config.set_active(driver)
    try:
        yield driver
    finally:
        if before is None:
            config._active = None  # pylint: disable=protected-access
        else:
            config.set_active(before)


def _active_gpuexec_driver() -> Any:
    import triton.runtime  # pylint: disable=import-outside-toplevel
    driver = triton.runtime.driver._active  # pylint: disable=protected-access
    if driver is None or not hasattr(driver, "state") or not isinstance(
            getattr(driver, "state", None), _State):
        raise client_error("no gpuexec session is Triton's active driver: call "
                           "gpuexec.triton.activate(session) first", _failed_precondition())
    return driver


def _summarize(times: List[float], quantiles: Optional[Sequence[float]],
               return_mode: str) -> Any:
    if quantiles is not None:
        ordered = sorted(times)
        out = []
        for q in quantiles:
            # Linear interpolation between the closest ranks, as
            # torch.quantile (and Triton's do_bench) computes it.
            pos = (len(ordered) - 1) * q
            lo = int(pos)
            hi = min(lo + 1, len(ordered) - 1)
            out.append(ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo))
        return out[0] if len(out) == 1 else out
    if return_mode == "all":
        return times
    reduce: Dict[str, Callable[[List[float]], float]] = {
        "min": min, "max": max, "mean": statistics.mean, "median": statistics.median}
    return reduce[return_mode](times)


def do_bench(fn: Callable[[], Any], warmup: float = 25, rep: float = 100,
             grad_to_none: Any = None, quantiles: Optional[Sequence[float]] = None,
             return_mode: str = "mean", *, driver: Any = None) -> Any:
    """triton.testing.do_bench's contract on the daemon's GPU time: ``fn``'s
    GPU time in milliseconds (``return_mode`` or ``quantiles`` over the
    runs). Each run is timed alone, between two synchronizes queued on the
    session's stream, after the L2-clearing buffer is zeroed; the runs are
    sent back to back without waiting, then their times collected. Runs:
    enough for ``rep`` ms of GPU time, at most 1000; ``warmup`` ms first."""
    if return_mode not in ("min", "max", "mean", "median", "all"):
        raise client_error(f"return_mode must be min, max, mean, median or all, got "
                           f"{str(return_mode)[:20]!r}")
    driver = driver if driver is not None else _active_gpuexec_driver()
    state = driver.state
    session = state.session
    fn()
    session.synchronize()
    cache = driver.get_empty_cache_for_benchmark()
    start = state.mark()
    for _ in range(5):
        driver.clear_cache(cache)
        fn()
    end = state.mark()
    estimate_ms = max(state.seconds_between(start, end) * 1e3 / 5, 1e-4)
    n_warmup = max(1, min(int(warmup / estimate_ms), 1000))
    n_repeat = max(1, min(int(rep / estimate_ms), 1000))
    for _ in range(n_warmup):
        fn()
    pairs = []
    deadline = time.monotonic() + 60.0
    for _ in range(n_repeat):
        if grad_to_none is not None:
            for x in grad_to_none:
                x.grad = None
        driver.clear_cache(cache)
        first = state.mark()
        fn()
        pairs.append((first, state.mark()))
        if time.monotonic() > deadline:
            break
    times = [state.seconds_between(a, b) * 1e3 for a, b in pairs]
    return _summarize(times, quantiles, return_mode)
