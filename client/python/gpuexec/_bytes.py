"""Bytes and numpy at the client's edges: byte views of what a caller
passes, and a ReadResponse parsed from the wire's bytes without a copy.

numpy is optional: _numpy() raises the client's error when it is missing.
"""

from typing import Any, Tuple

import grpc

from . import _wire
from ._errors import client_error


def _numpy() -> Any:
    try:
        import numpy
    except ImportError:
        raise client_error("numpy is not installed; use bytes instead",
                           grpc.StatusCode.FAILED_PRECONDITION) from None
    return numpy


def _is_numpy_array(obj: Any) -> bool:
    return type(obj).__module__ == "numpy" and hasattr(obj, "dtype") and hasattr(obj, "shape")


varint = _wire.varint


def _read_varint(view: memoryview, at: int) -> Tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(view) or shift > 63:
            raise ValueError("truncated varint")
        byte = view[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7


def _parse_read_response(raw: Any) -> Tuple[int, memoryview]:
    """The offset and data (a view into ``raw``) of a ReadResponse's bytes."""
    view = memoryview(raw)
    at, offset, data = 0, 0, view[0:0]
    while at < len(view):
        key, at = _read_varint(view, at)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, at = _read_varint(view, at)
            if number == 1:
                offset = value
        elif wire == 2:
            n, at = _read_varint(view, at)
            if at + n > len(view):
                raise ValueError("truncated field")
            if number == 2:
                data = view[at:at + n]
            at += n
        elif wire in (1, 5):
            at += 8 if wire == 1 else 4
            if at > len(view):
                raise ValueError("truncated field")
        else:
            raise ValueError(f"wire type {wire}")
    return offset, data


def _writable_byte_view(out: Any) -> memoryview:
    """A flat, writable memoryview of unsigned bytes over all of ``out``."""
    unfit = client_error(f"cannot read into a {type(out).__name__}: expected a contiguous, "
                         "writable bytes-like object or numpy array")
    try:
        if _is_numpy_array(out) and out.dtype.hasobject:
            raise unfit
        view = memoryview(out)
    except TypeError:
        raise unfit from None
    if view.readonly or not view.c_contiguous:
        raise unfit
    try:
        return view.cast("B") if view.format != "B" or view.ndim != 1 else view
    except (TypeError, ValueError):
        raise unfit from None


def _byte_view(data: Any) -> memoryview:
    """A flat, contiguous memoryview of unsigned bytes over ``data``."""
    if _is_numpy_array(data):
        np = _numpy()
        arr = np.ascontiguousarray(data)
        return memoryview(arr.reshape(-1).view(np.uint8))
    try:
        view = memoryview(data)
    except TypeError:
        raise client_error(f"cannot write a {type(data).__name__}: expected bytes-like data "
                           "or a numpy array") from None
    if not view.c_contiguous:
        raise client_error("data is not contiguous")
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view

