"""Module and Function: a loaded image and its kernels, and how a launch
is put on the wire.

A Function's launch is checked here against the kernel's parameters and
serialized once per geometry (see Function._launch_op); the session's
command stream carries it.
"""

from __future__ import annotations

import os
from collections import namedtuple
from dataclasses import dataclass
from typing import Any, Dict, NoReturn, Optional, Sequence, Tuple, Union

from . import _ring_records, _transfer, _wire
from ._args import Arg, to_arg
from ._buffer import Buffer
from ._errors import client_error, short_token
from ._graph import Placeholder
from ._tensor_map import TensorMap
from ._transfer import clipped_repr
from .v1 import gpuexec_pb2 as pb

# Arguments that are neither buffers nor host arrays: to_arg types them.
_PLAIN = frozenset((int, float, bool, bytes, type(None)))
# A grid, block or cluster: an int or 1 to 3 ints.
Dims = Union[int, Sequence[int]]

_KINDS = {"cubin": pb.MODULE_KIND_CUBIN, "ptx": pb.MODULE_KIND_PTX, "fatbin": pb.MODULE_KIND_FATBIN}
_KIND_NAMES = {v: k for k, v in _KINDS.items()}
_FATBIN_MAGIC = bytes.fromhex("50ed55ba")

Param = namedtuple("Param", ["offset", "size"])
Param.__doc__ = "A kernel parameter as the driver lays it out (bytes)."


def _dims(value: Any, what: str) -> Tuple[int, int, int]:
    dims = (value,) if isinstance(value, int) else tuple(value)
    if not 1 <= len(dims) <= 3 or not all(isinstance(d, int) and 0 <= d < 1 << 32
                                          for d in dims):
        raise client_error(f"{what} must be an int or 1 to 3 ints in [0, 2^32), got "
                           f"{clipped_repr(value)}")
    return dims + (1,) * (3 - len(dims))  # type: ignore[return-value]


def _dim3(value: Any, what: str) -> Any:
    x, y, z = _dims(value, what)
    return pb.Dim3(x=x, y=y, z=z)


# cluster_policy's accepted values (lower case) -> ClusterSchedulingPolicy.
_CLUSTER_POLICIES = {"default": pb.CLUSTER_SCHEDULING_POLICY_DEFAULT,
                     "spread": pb.CLUSTER_SCHEDULING_POLICY_SPREAD,
                     "load_balancing": pb.CLUSTER_SCHEDULING_POLICY_LOAD_BALANCING}
for _name, _value in pb.ClusterSchedulingPolicy.items():
    _CLUSTER_POLICIES[_name.lower()] = _value
# A launch's attributes when none is asked for: (cooperative, pdl,
# non_portable_cluster, cluster_policy) as the wire takes them.
_NO_ATTRIBUTES = (False, False, False, 0)


def _flag(value: Any, what: str) -> bool:
    if value is True or value is False:
        return value
    if type(value).__name__ in ("bool_", "bool") or (
            isinstance(value, int) and value in (0, 1)):  # numpy's bool, 0 and 1
        return bool(value)
    raise client_error(f"{what} must be True or False, got {clipped_repr(value)}")


def _launch_attributes(cooperative: Any, pdl: Any, non_portable_cluster: Any,
                       cluster_policy: Any) -> Tuple[bool, bool, bool, int]:
    """The launch attributes as the wire takes them, checked; raises the
    client's error naming the argument."""
    if (cooperative is False and pdl is False and non_portable_cluster is False
            and cluster_policy is None):
        return _NO_ATTRIBUTES
    policy: Optional[int] = 0
    if cluster_policy is not None:
        policy = (_CLUSTER_POLICIES.get(cluster_policy.strip().lower().replace("-", "_"))
                  if isinstance(cluster_policy, str) else None)
        if policy is None:
            raise client_error(f"cluster_policy must be None, 'default', 'spread' or "
                               f"'load_balancing', got {clipped_repr(cluster_policy)}")
    return (_flag(cooperative, "cooperative"), _flag(pdl, "pdl"),
            _flag(non_portable_cluster, "non_portable_cluster"), int(policy or 0))



@dataclass(frozen=True)
class FunctionAttributes:
    """What the driver reports about a kernel."""
    num_registers: int
    static_shared_bytes: int
    const_bytes: int
    local_bytes: int
    max_threads_per_block: int
    max_dynamic_shared_bytes: int
    ptx_version: int
    binary_version: int



def _module_kind(image: bytes, path: Optional[str], kind: Any) -> int:
    if kind is not None:
        if isinstance(kind, str):
            if kind.lower() not in _KINDS:
                raise client_error(f"unknown module kind {clipped_repr(kind)} (cubin, ptx or "
                                   "fatbin)")
            return _KINDS[kind.lower()]
        return int(kind)
    if path is not None:
        ext = os.path.splitext(path)[1].lower().lstrip(".")
        if ext in _KINDS:
            return _KINDS[ext]
    if image[:4] == b"\x7fELF":
        return pb.MODULE_KIND_CUBIN
    if image[:4] == _FATBIN_MAGIC:
        return pb.MODULE_KIND_FATBIN
    head = image[:4096]
    if b".version" in head and b".target" in head:
        return pb.MODULE_KIND_PTX
    name = path if path is not None else "the image"
    raise client_error(f"cannot tell the module kind of {name}; pass kind='cubin', 'ptx' "
                       "or 'fatbin'")



class Module:
    """A module image loaded for a session (dropped when the session closes)."""

    def __init__(self, session: Any, handle: int, sha256: str, uploaded: bool,
                 kind: Any) -> None:
        self.session = session
        self.handle = handle
        self.sha256 = sha256
        # True when this load carried the bytes; False when the daemon had them.
        self.uploaded = uploaded
        self.kind = _KIND_NAMES.get(kind, kind)
        self._functions: Dict[str, Function] = {}

    def __repr__(self) -> str:
        return f"<gpuexec.Module {self.sha256[:12]} ({self.kind})>"

    def function(self, name: str) -> Function:
        """The kernel ``name`` of this module, with its parameter layout."""
        function = self._functions.get(name)
        if function is None:
            response = self.session._control(
                self.session.client.stub.GetFunction,
                pb.GetFunctionRequest(session=self.session.token, module=self.handle, name=name))
            function = Function(self, name, response)
            self._functions[name] = function
        return function


def _shown(name: str) -> str:
    """A kernel's name as messages show it: quoted, bounded, escaped."""
    if len(name) <= 128 and name.isprintable():
        return f"'{name}'"
    return clipped_repr(name)


class Function:
    """A kernel of a loaded module.

    Launch it with ``launch`` (waits for the daemon), ``launch_async``
    (queued, no round trip), by calling it as CuPy's RawKernel is called,
    ``f(grid, block, args)``, or as Numba's kernels are, ``f[grid,
    block](*args)``. Host arrays go in as gpuexec.In/Out/InOut (copied
    around the launch).
    """

    def __init__(self, module: Module, name: str, response: Any) -> None:
        self.module = module
        self.session = module.session
        self.name = name
        self._shown_name = _shown(name)
        self.handle = response.function
        self.params = [Param(p.offset, p.size) for p in response.params]
        self._heads: Dict[Any, Tuple[bytes, bytes]] = {}
        self._ring_heads: Dict[Any, bytes] = {}
        a = response.attributes
        self.attributes = FunctionAttributes(
            num_registers=a.num_registers, static_shared_bytes=a.static_shared_bytes,
            const_bytes=a.const_bytes, local_bytes=a.local_bytes,
            max_threads_per_block=a.max_threads_per_block,
            max_dynamic_shared_bytes=a.max_dynamic_shared_bytes, ptx_version=a.ptx_version,
            binary_version=a.binary_version)

    def __repr__(self) -> str:
        return f"<gpuexec.Function {self.name}, {len(self.params)} params>"

    # A launch's fixed parts serialized -- the fields before the arguments
    # and the attributes after them -- by (grid, block, shared, cluster,
    # attributes) as given: most programs launch a kernel with few
    # geometries.
    _MAX_HEADS = 64

    def _launch_op(self, grid: Any, block: Any, args: Sequence[Any], shared: int, cluster: Any,
                   sync: bool,
                   attributes: Tuple[bool, bool, bool, int] = _NO_ATTRIBUTES) -> bytes:
        """The launch as a Command's operation field (see _wire);
        ``attributes`` as _launch_attributes returns them. Raises
        _transfer.NotWaited for an In/Out/InOut argument."""
        key: Any = (grid, block, shared, cluster, attributes)
        try:
            fixed = self._heads.get(key)
        except TypeError:  # a list, say: not kept
            key, fixed = None, None
        if fixed is None:
            fixed = (_wire.launch_head(self.handle, _dim3(grid, "grid"), _dim3(block, "block"),
                                       int(shared),
                                       None if cluster is None else _dim3(cluster, "cluster")),
                     _wire.launch_attributes(*attributes))
            if key is not None:
                if len(self._heads) >= self._MAX_HEADS:
                    self._heads.clear()
                self._heads[key] = fixed
        head, tail = fixed
        if not args and not sync:
            return _wire.launch_op(head + tail if tail else head)
        parts = [head]
        session = self.session
        for i, value in enumerate(args):
            kind = type(value)
            # The hot path: a buffer or tensor map of this session, an Arg.
            if ((kind is Buffer and value.session is session)
                    or (kind is TensorMap and value.buffer.session is session)):
                parts.append(value._launch_field)
            elif kind is Arg:
                parts.append(_wire.launch_arg_field(value))
            else:
                parts.append(self._arg_field(value, i))
        if sync:
            parts.append(_wire.LAUNCH_SYNCHRONIZE)
        if tail:
            parts.append(tail)
        return _wire.launch_op(b"".join(parts))

    def _ring_launch(self, grid: Any, block: Any, args: Sequence[Any], shared: int,
                     cluster: Any, sync: bool,
                     attributes: Tuple[bool, bool, bool, int] = _NO_ATTRIBUTES
                     ) -> Optional[bytes]:
        """The launch as a command ring record's body (see _ring_records),
        or None where a record cannot hold it; raises as _launch_op does."""
        key: Any = (grid, block, shared, cluster, attributes, sync)
        try:
            fixed = self._ring_heads.get(key)
        except TypeError:  # a list, say: not kept
            key, fixed = None, None
        if fixed is None:
            fixed = _ring_records.launch_fixed(
                self.handle, _dims(grid, "grid"), _dims(block, "block"),
                None if cluster is None else _dims(cluster, "cluster"), int(shared), attributes,
                sync)
            if key is not None:
                if len(self._ring_heads) >= self._MAX_HEADS:
                    self._ring_heads.clear()
                self._ring_heads[key] = fixed
        slots = []
        blob: list = []
        blob_at = [0]
        session = self.session
        for i, value in enumerate(args):
            kind = type(value)
            if kind is Buffer and value.session is session:
                slots.append(value._ring_slot)
                continue
            if kind is int:
                slot = self._ring_int(i, value)
                if slot is not None:
                    slots.append(slot)
                    continue
                arg = self._arg(value, i)
            elif kind is Arg:
                arg = value
            elif kind is TensorMap and value.buffer.session is session:
                arg = value._as_kernel_arg()
            else:
                arg = self._arg(value, i)
            slot = _ring_records.arg_slot(arg, blob, blob_at)
            if slot is None:
                return None
            slots.append(slot)
        return _ring_records.launch_body(fixed, slots, blob, blob_at[0])

    def _ring_int(self, i: int, value: int) -> Optional[bytes]:
        """A plain int for parameter ``i`` as its slot, typed by the
        parameter's size as to_arg types it; None where to_arg is to say
        what is wrong."""
        params = self.params
        if i >= len(params):
            return None
        bits = params[i].size * 8
        if bits not in (8, 16, 32, 64):
            return None
        if -(1 << (bits - 1)) <= value < (1 << (bits - 1)):
            return _ring_records.int_slot(bits, True, value)
        if 0 <= value < (1 << bits):
            return _ring_records.int_slot(bits, False, value)
        return None

    def _arg_field(self, value: Any, i: int) -> bytes:
        """Launch argument ``i`` (not a buffer or tensor map of this
        session) as a LaunchRequest's argument field; raises the client's
        error for one that is refused."""
        if type(value) in (Buffer, TensorMap):
            owner = value if type(value) is Buffer else value.buffer
            if owner.session is None:
                return value._launch_field  # made by hand, of no session: the daemon checks it
        return _wire.launch_arg_field(self._arg(value, i))

    def _arg(self, value: Any, i: int) -> Arg:
        """Launch argument ``i`` (not a buffer or tensor map of this
        session) as an Arg; raises the client's error for one that is
        refused."""
        params = self.params
        if type(value) in _PLAIN:
            return to_arg(value, i, params[i] if i < len(params) else None, self._shown_name)
        if type(value) is Placeholder:
            return value.resolve(self, i)
        if isinstance(value, _transfer._Transfer):
            raise _transfer.NotWaited(self._shown_name, i, value)
        owner = value if isinstance(value, Buffer) else (
            value.buffer if isinstance(value, TensorMap) else None)
        if owner is not None and owner.session is not self.session and \
                owner.session is not None:
            self._refuse_session(owner, value, i)
        return to_arg(value, i, params[i] if i < len(params) else None, self._shown_name)

    def _refuse_session(self, owner: Any, value: Any, i: int) -> NoReturn:
        """Raises the client's error for argument ``i``, ``value``, whose
        buffer ``owner`` is of another session."""
        what = "Buffer" if owner is value else "TensorMap's buffer"
        theirs, ours = short_token(owner.session.token), short_token(self.session.token)
        raise client_error(
            f"argument {i} of kernel {self._shown_name}: the {what} belongs to session "
            f"{theirs}, the kernel to session {ours}; a launch takes buffers of its own "
            f"session: copy the data through the host into session {ours} "
            f"(session.asarray(buffer.get())), or load the module in session {theirs} too")

    def __call__(self, grid: Dims, block: Dims, args: Union[Tuple[Any, ...], Sequence[Any]], *,
                 shared_mem: int = 0, cluster: Optional[Dims] = None, sync: bool = False,
                 cooperative: bool = False, pdl: bool = False, non_portable_cluster: bool = False,
                 cluster_policy: Optional[str] = None) -> Optional[float]:
        """Launches the kernel as CuPy's RawKernel does:
        ``f(grid, block, (a, x, y, n), shared_mem=0)``.

        ``args``: a tuple or list, one value per parameter, of what
        ``launch`` takes, and ``gpuexec.In(x)``/``Out(x)``/``InOut(x)`` of
        numpy arrays (copied around the launch, see gpuexec.In). Their
        count is checked before any is looked at. The launch is queued
        like ``launch_async`` (no round trip; a failure is raised by the
        session's next call that waits) unless an argument is
        In/Out/InOut or ``sync`` is True: it then waits for the daemon
        (an Out or InOut array holds the result on return). With ``sync``
        returns the session's GPU time in seconds (see ``launch``), else
        None. ``shared_mem`` is ``launch``'s ``shared``; the other keywords
        are ``launch``'s.
        """
        if not isinstance(args, (tuple, list)):
            raise client_error(
                f"kernel {self._shown_name}: args must be a tuple or list of the kernel's "
                f"arguments, got {type(args).__name__[:60]}; call it as "
                "f(grid, block, (a, x, y, n)), with (x,) for one argument")
        if len(args) != len(self.params):
            raise _transfer.count_error(self._shown_name, len(self.params), len(args))
        session = self.session
        try:
            if sync:
                return session.launch(self, grid, block, *args, shared=shared_mem,
                                      cluster=cluster, sync=True, cooperative=cooperative,
                                      pdl=pdl, non_portable_cluster=non_portable_cluster,
                                      cluster_policy=cluster_policy)
            session.launch_async(self, grid, block, *args, shared=shared_mem, cluster=cluster,
                                 cooperative=cooperative, pdl=pdl,
                                 non_portable_cluster=non_portable_cluster,
                                 cluster_policy=cluster_policy)
            return None
        except _transfer.NotWaited:  # raised before any call
            return _transfer.launch(self, grid, block, args, shared_mem, cluster, sync,
                                    _launch_attributes(cooperative, pdl, non_portable_cluster,
                                                       cluster_policy))

    def __getitem__(self, config: Tuple[Any, ...]) -> Configured:
        """Numba's launch configuration: ``f[grid, block](a, x, y, n)``, or
        ``f[grid, block, stream, shared_mem]``, where stream is 0 or None
        (a session has one stream). The call is ``f(grid, block, args,
        shared_mem=...)``."""
        if not isinstance(config, tuple) or not 2 <= len(config) <= 4:
            raise client_error(
                f"kernel {self._shown_name}: a launch configuration is f[grid, block] or "
                f"f[grid, block, stream, shared_mem], got f[{clipped_repr(config)}]")
        stream = config[2] if len(config) > 2 else None
        if stream is not None and not (isinstance(stream, int) and stream == 0):
            raise client_error(
                f"kernel {self._shown_name}: stream {clipped_repr(stream)} in f[grid, block, "
                "stream, ...]: a session has one stream, its launches run in order; pass 0 "
                "or None, and a second session for work that may overlap")
        return Configured(self, config[0], config[1], config[3] if len(config) > 3 else 0)

    def launch(self, grid: Dims, block: Dims, *args: Any, shared: int = 0,
               cluster: Optional[Dims] = None, sync: bool = False, cooperative: bool = False,
               pdl: bool = False, non_portable_cluster: bool = False,
               cluster_policy: Optional[str] = None) -> Optional[float]:
        """Enqueues the kernel on its session's stream and waits for the
        daemon to take it.

        grid, block, cluster: an int or up to 3 ints. args: one per parameter
        (Buffer, TensorMap, None, Arg from i32()/f32()/..., numpy scalar,
        bytes, int or float, or gpuexec.In(x)/Out(x)/InOut(x) of a numpy
        array: copied to a temporary buffer before the launch and/or back
        after it; see gpuexec.In). A bare numpy array is refused: it is host
        memory. A Buffer of another session is refused. shared: dynamic
        shared memory bytes (above 48 KiB is opted in by the daemon). With
        ``sync`` waits for the session's work and returns its GPU time in
        seconds; else returns None once enqueued.

        Launch attributes: ``cooperative``: every block resident at once, so
        that the kernel may synchronize the whole grid (a grid larger than
        the device holds at once is refused). ``pdl``: a programmatic
        dependent launch (compute capability 9.0 and later): the kernel may
        start before the session's previous kernel ends, once that one
        triggers it; it must wait (griddepcontrol.wait) before reading what
        that one wrote. ``non_portable_cluster``: allows clusters of more
        than 8 blocks (up to 16, where the device and kernel allow).
        ``cluster_policy``: how a cluster's blocks are placed, None or
        "default", "spread", "load_balancing" (with a cluster only). A
        value of the wrong kind raises Error (INVALID_ARGUMENT) naming the
        argument, before any call.
        """
        try:
            return self.session.launch(self, grid, block, *args, shared=shared, cluster=cluster,
                                       sync=sync, cooperative=cooperative, pdl=pdl,
                                       non_portable_cluster=non_portable_cluster,
                                       cluster_policy=cluster_policy)
        except _transfer.NotWaited:  # raised before any call
            return _transfer.launch(self, grid, block, args, shared, cluster, sync,
                                    _launch_attributes(cooperative, pdl, non_portable_cluster,
                                                       cluster_policy))

    def launch_async(self, grid: Dims, block: Dims, *args: Any, shared: int = 0,
                     cluster: Optional[Dims] = None, cooperative: bool = False,
                     pdl: bool = False, non_portable_cluster: bool = False,
                     cluster_policy: Optional[str] = None) -> None:
        """Queues the kernel on its session's stream and returns at once,
        without a round trip to the daemon (the arguments are checked here
        against the kernel's parameters). A failure the daemon finds is
        raised by the session's next call that waits for the daemon: a
        launch, ``synchronize()``, or a buffer's read, write, memset, copy or
        free (each waits for the launches queued before it), as CUDA
        reports asynchronous errors. The launch attributes are
        Function.launch's. gpuexec.In/Out/InOut arguments are refused: their
        copies need a launch that waits (use ``launch`` or call the
        function)."""
        self.session.launch_async(self, grid, block, *args, shared=shared, cluster=cluster,
                                  cooperative=cooperative, pdl=pdl,
                                  non_portable_cluster=non_portable_cluster,
                                  cluster_policy=cluster_policy)


class Configured:
    """A Function with its grid, block and shared memory (``f[grid,
    block]``); calling it launches as ``f(grid, block, args)`` does."""

    __slots__ = ("function", "grid", "block", "shared_mem")

    def __init__(self, function: Function, grid: Dims, block: Dims, shared_mem: int) -> None:
        self.function = function
        self.grid = grid
        self.block = block
        self.shared_mem = shared_mem

    def __repr__(self) -> str:
        return (f"<gpuexec.Function {self.function._shown_name}[{clipped_repr(self.grid)}, "
                f"{clipped_repr(self.block)}]>")

    def __call__(self, *args: Any) -> None:
        """Launches the kernel with ``args`` (see Function.__call__)."""
        self.function(self.grid, self.block, args, shared_mem=self.shared_mem)
