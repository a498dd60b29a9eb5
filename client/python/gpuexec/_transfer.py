"""In, Out and InOut: host arrays copied around one launch, as PyCUDA's
``driver.In``/``Out``/``InOut`` and Numba's implicit transfers do.

    saxpy((blocks,), (256,), (np.float32(2.0), gpuexec.In(x), gpuexec.InOut(y), n))

For a launch through ``Function.launch`` or a call of the function
(``f(grid, block, args)``), each In and InOut array is uploaded to a
temporary buffer of the function's session before the launch; after it,
each Out and InOut buffer is read back into its array (the read is ordered
after the launch on the session's stream); the temporaries are then freed.
Such a launch waits for the daemon. The temporaries count against the
session's memory like any buffer; a failure on the way frees those made
so far. ``launch_async`` and ``Session.launch``/``launch_async`` refuse
them: they do not wait for the launch to copy around it.
"""

from __future__ import annotations

import reprlib
from typing import Any, List, Optional, Sequence, Tuple

from ._buffer import Buffer
from ._bytes import _is_numpy_array
from ._errors import Error, client_error

_REPR = reprlib.Repr()
_REPR.maxstring = 60
_REPR.maxother = 60


def clipped_repr(value: Any) -> str:
    """repr(value), bounded (nested items and long strings elided)."""
    text = _REPR.repr(value)
    return text if len(text) <= 120 else text[:120] + "..."


def _what(array: Any) -> str:
    """A short description of a host array (never its contents)."""
    if _is_numpy_array(array):
        return f"a {array.dtype} array of shape {tuple(array.shape)}"
    return f"a {type(array).__name__[:60]}"


class _Transfer:
    """A host array copied around one launch (see In, Out, InOut)."""

    __slots__ = ("array", "nbytes")
    _copies_in = True
    _copies_out = False

    def __init__(self, array: Any) -> None:
        name = f"gpuexec.{type(self).__name__}"
        if isinstance(array, (Buffer, _Transfer)):
            raise client_error(f"{name}() of a {type(array).__name__}: it takes host memory "
                               "(a numpy array); a Buffer is on the device already: pass it "
                               "to the launch as it is")
        if _is_numpy_array(array):
            if array.dtype.hasobject:
                raise client_error(f"{name}() of {_what(array)}: an array of Python objects "
                                   "has no bytes to copy; pass an array of numbers")
            if not array.flags.c_contiguous:
                raise client_error(f"{name}() of {_what(array)}: the array is not contiguous "
                                   "(a view with strides, or Fortran order); pass "
                                   "numpy.ascontiguousarray(x) and, for Out or InOut, copy "
                                   "the result back into x yourself")
            if self._copies_out and not array.flags.writeable:
                raise client_error(f"{name}() of {_what(array)}: the array is read-only and "
                                   "the launch writes it back; pass a writable array "
                                   "(x.copy())")
            nbytes = int(array.nbytes)
        else:
            try:
                view = memoryview(array)
            except TypeError:
                raise client_error(f"{name}() of {_what(array)}: it takes a numpy array or "
                                   "a bytes-like object") from None
            if not view.c_contiguous:
                raise client_error(f"{name}() of {_what(array)}: the data is not contiguous")
            if self._copies_out and view.readonly:
                raise client_error(f"{name}() of {_what(array)}: the data is read-only and "
                                   "the launch writes it back; pass a bytearray or a "
                                   "writable numpy array")
            nbytes = view.nbytes
        self.array = array
        self.nbytes = nbytes

    def __repr__(self) -> str:
        return f"gpuexec.{type(self).__name__}({_what(self.array)})"


class In(_Transfer):
    """``In(x)``: the kernel gets a device copy of host array ``x`` (a
    contiguous numpy array or bytes-like object), made before the launch;
    what the kernel writes there is dropped. See the module's text."""

    __slots__ = ()


class Out(_Transfer):
    """``Out(x)``: the kernel gets device memory of ``x``'s size (its
    contents undefined); after the launch it is read back into ``x`` (a
    contiguous, writable numpy array or bytearray)."""

    __slots__ = ()
    _copies_in = False
    _copies_out = True


class InOut(_Transfer):
    """``InOut(x)``: ``x`` is copied to the device before the launch and
    read back into ``x`` after it (a contiguous, writable numpy array or
    bytearray)."""

    __slots__ = ()
    _copies_out = True


class NotWaited(Error):
    """A launch that cannot copy an In/Out/InOut argument: raised by the
    launch paths that do not wait (launch_async, Session.launch*);
    Function.launch and Function.__call__ take it as the sign to copy."""

    def __init__(self, kernel: str, index: int, transfer: _Transfer) -> None:
        error = client_error(
            f"argument {index} of kernel {kernel}: {transfer!r} is copied around a launch "
            "that finishes, which launch_async and Session.launch do not wait for or copy; "
            "call the function, f(grid, block, args), or use function.launch(...); or upload "
            "the array yourself")
        super().__init__(error.code, error.message)


def count_error(kernel: str, expected: int, given: int) -> Error:
    """The client's error for a launch with the wrong number of arguments."""
    return client_error(f"kernel {kernel} takes {expected} argument{'s' if expected != 1 else ''}"
                        f", {given} given; pass one per parameter, in order")


def _free_all(made: Sequence[Tuple[_Transfer, Optional[Buffer]]]) -> Optional[Error]:
    """Frees the temporaries; returns the first failure (the rest are
    still tried)."""
    first = None
    for _, buffer in made:
        if buffer is None:
            continue
        try:
            buffer.free()
        except Error as e:
            if first is None:
                first = e
    return first


def launch(function: Any, grid: Any, block: Any, args: Sequence[Any], shared: int,
           cluster: Any, sync: bool, attributes: Tuple[bool, bool, bool, int]) -> Optional[float]:
    """Launches ``function`` with its In/Out/InOut arguments copied around
    the launch (see the module's text); waits for the daemon. Returns the
    GPU time in seconds with ``sync``, else None."""
    session = function.session
    params = function.params
    if len(args) != len(params):
        raise count_error(function._shown_name, len(params), len(args))
    # Everything is checked before any call: the launch as it will be sent,
    # with a null pointer where each temporary will go.
    function._launch_op(grid, block, [None if isinstance(a, _Transfer) else a for a in args],
                        shared, cluster, sync, attributes)
    made: List[Tuple[_Transfer, Optional[Buffer]]] = []
    try:
        real = []
        for value in args:
            if not isinstance(value, _Transfer):
                real.append(value)
                continue
            buffer = session.alloc(value.nbytes) if value.nbytes else None
            made.append((value, buffer))
            if buffer is not None and value._copies_in:
                buffer.write(value.array)
            real.append(buffer)
        op = function._launch_op(grid, block, real, shared, cluster, sync, attributes)
        try:
            result = session._commands.submit(op, wait=True)
        except Error as e:
            raise session._failed(e) from None
        for transfer, buffer in made:
            if buffer is not None and transfer._copies_out:
                buffer.read_into(transfer.array)
    except BaseException:
        _free_all(made)  # the failure that got here is the one to raise
        raise
    failed = _free_all(made)
    if failed is not None:
        raise failed
    return result.gpu_time_ns / 1e9 if sync else None


__all__ = ["In", "Out", "InOut"]
