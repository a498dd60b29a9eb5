"""Module and Function: a loaded image and its kernels, and how a launch
is put on the wire.

A Function's launch is checked here against the kernel's parameters and
serialized once per geometry (see Function._launch_op); the session's
command stream carries it.
"""

import os
from collections import namedtuple
from dataclasses import dataclass

from . import _wire
from ._args import to_arg
from ._buffer import Buffer
from ._errors import client_error
from ._tensor_map import TensorMap
from .v1 import gpuexec_pb2 as pb

_KINDS = {"cubin": pb.MODULE_KIND_CUBIN, "ptx": pb.MODULE_KIND_PTX, "fatbin": pb.MODULE_KIND_FATBIN}
_KIND_NAMES = {v: k for k, v in _KINDS.items()}
_FATBIN_MAGIC = bytes.fromhex("50ed55ba")

Param = namedtuple("Param", ["offset", "size"])
Param.__doc__ = "A kernel parameter as the driver lays it out (bytes)."


def _dim3(value, what):
    dims = (value,) if isinstance(value, int) else tuple(value)
    if not 1 <= len(dims) <= 3 or not all(isinstance(d, int) and d >= 0 for d in dims):
        raise client_error(f"{what} must be an int or 1 to 3 non-negative ints, got {value!r}")
    dims = dims + (1,) * (3 - len(dims))
    return pb.Dim3(x=dims[0], y=dims[1], z=dims[2])


# cluster_policy's accepted values (lower case) -> ClusterSchedulingPolicy.
_CLUSTER_POLICIES = {"default": pb.CLUSTER_SCHEDULING_POLICY_DEFAULT,
                     "spread": pb.CLUSTER_SCHEDULING_POLICY_SPREAD,
                     "load_balancing": pb.CLUSTER_SCHEDULING_POLICY_LOAD_BALANCING}
for _name, _value in pb.ClusterSchedulingPolicy.items():
    _CLUSTER_POLICIES[_name.lower()] = _value
# A launch's attributes when none is asked for: (cooperative, pdl,
# non_portable_cluster, cluster_policy) as the wire takes them.
_NO_ATTRIBUTES = (False, False, False, 0)


def _flag(value, what):
    if value is True or value is False:
        return value
    if type(value).__name__ in ("bool_", "bool") or (
            isinstance(value, int) and value in (0, 1)):  # numpy's bool, 0 and 1
        return bool(value)
    raise client_error(f"{what} must be True or False, got {value!r}")


def _launch_attributes(cooperative, pdl, non_portable_cluster, cluster_policy):
    """The launch attributes as the wire takes them, checked; raises the
    client's error naming the argument."""
    if (cooperative is False and pdl is False and non_portable_cluster is False
            and cluster_policy is None):
        return _NO_ATTRIBUTES
    if cluster_policy is None:
        policy = 0
    else:
        policy = (_CLUSTER_POLICIES.get(cluster_policy.strip().lower().replace("-", "_"))
                  if isinstance(cluster_policy, str) else None)
        if policy is None:
            raise client_error(f"cluster_policy must be None, 'default', 'spread' or "
                               f"'load_balancing', got {cluster_policy!r}")
    return (_flag(cooperative, "cooperative"), _flag(pdl, "pdl"),
            _flag(non_portable_cluster, "non_portable_cluster"), policy)



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



def _module_kind(image, path, kind):
    if kind is not None:
        if isinstance(kind, str):
            if kind.lower() not in _KINDS:
                raise client_error(f"unknown module kind {kind!r} (cubin, ptx or fatbin)")
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

    def __init__(self, session, handle, sha256, uploaded, kind):
        self.session = session
        self.handle = handle
        self.sha256 = sha256
        # True when this load carried the bytes; False when the daemon had them.
        self.uploaded = uploaded
        self.kind = _KIND_NAMES.get(kind, kind)
        self._functions = {}

    def __repr__(self):
        return f"<gpuexec.Module {self.sha256[:12]} ({self.kind})>"

    def function(self, name):
        """The kernel ``name`` of this module, with its parameter layout."""
        function = self._functions.get(name)
        if function is None:
            response = self.session._control(
                self.session.client.stub.GetFunction,
                pb.GetFunctionRequest(session=self.session.token, module=self.handle, name=name))
            function = Function(self, name, response)
            self._functions[name] = function
        return function


class Function:
    """A kernel of a loaded module."""

    def __init__(self, module, name, response):
        self.module = module
        self.session = module.session
        self.name = name
        self.handle = response.function
        self.params = [Param(p.offset, p.size) for p in response.params]
        self._heads = {}
        a = response.attributes
        self.attributes = FunctionAttributes(
            num_registers=a.num_registers, static_shared_bytes=a.static_shared_bytes,
            const_bytes=a.const_bytes, local_bytes=a.local_bytes,
            max_threads_per_block=a.max_threads_per_block,
            max_dynamic_shared_bytes=a.max_dynamic_shared_bytes, ptx_version=a.ptx_version,
            binary_version=a.binary_version)

    def __repr__(self):
        return f"<gpuexec.Function {self.name}, {len(self.params)} params>"

    # A launch's fixed parts serialized -- the fields before the arguments
    # and the attributes after them -- by (grid, block, shared, cluster,
    # attributes) as given: most programs launch a kernel with few
    # geometries.
    _MAX_HEADS = 64

    def _launch_op(self, grid, block, args, shared, cluster, sync, attributes=_NO_ATTRIBUTES):
        """The launch as a Command's operation field (see _wire);
        ``attributes`` as _launch_attributes returns them."""
        key = (grid, block, shared, cluster, attributes)
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
        params = self.params
        for i, value in enumerate(args):
            kind = type(value)
            if kind is Buffer or kind is TensorMap:
                parts.append(value._launch_field)
            else:
                parts.append(_wire.launch_arg_field(
                    to_arg(value, i, params[i] if i < len(params) else None)))
        if sync:
            parts.append(_wire.LAUNCH_SYNCHRONIZE)
        if tail:
            parts.append(tail)
        return _wire.launch_op(b"".join(parts))

    def launch(self, grid, block, *args, shared=0, cluster=None, sync=False, cooperative=False,
               pdl=False, non_portable_cluster=False, cluster_policy=None):
        """Enqueues the kernel on its session's stream.

        grid, block, cluster: an int or up to 3 ints. args: one per parameter
        (Buffer, TensorMap, None, Arg from i32()/f32()/..., numpy scalar,
        bytes, int or float). shared: dynamic shared memory bytes (above 48
        KiB is opted in by the daemon). With ``sync`` waits for the session's
        work and returns its GPU time in seconds; else returns None once
        enqueued.

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
        return self.session.launch(self, grid, block, *args, shared=shared, cluster=cluster,
                                   sync=sync, cooperative=cooperative, pdl=pdl,
                                   non_portable_cluster=non_portable_cluster,
                                   cluster_policy=cluster_policy)

    def launch_async(self, grid, block, *args, shared=0, cluster=None, cooperative=False,
                     pdl=False, non_portable_cluster=False, cluster_policy=None):
        """Queues the kernel on its session's stream and returns at once,
        without a round trip to the daemon (the arguments are checked here
        against the kernel's parameters). A failure the daemon finds is
        raised by the session's next call that waits for the daemon: a
        launch, ``synchronize()``, or a buffer's read, write, memset, copy or
        free (each waits for the launches queued before it), as CUDA
        reports asynchronous errors. The launch attributes are
        Function.launch's."""
        self.session.launch_async(self, grid, block, *args, shared=shared, cluster=cluster,
                                  cooperative=cooperative, pdl=pdl,
                                  non_portable_cluster=non_portable_cluster,
                                  cluster_policy=cluster_policy)
