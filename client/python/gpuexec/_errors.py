"""The one exception type of the package."""

from __future__ import annotations

import re
from typing import Any

import grpc


class Error(Exception):
    """A failed gpuexec call.

    ``code`` is a ``grpc.StatusCode``; ``message`` is the daemon's message
    unchanged (it names the session, buffer, module, function or device).
    Errors raised by this package without a call have messages that start
    with ``gpuexec client:``.
    """

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code: grpc.StatusCode = code
        self.message: str = message


def client_error(message: str, code: grpc.StatusCode = grpc.StatusCode.INVALID_ARGUMENT) -> Error:
    """An Error made here, not by the daemon."""
    return Error(code, "gpuexec client: " + message)


def naming_daemon(code: grpc.StatusCode, message: str, daemon: str | None) -> str:
    """``message``, led by the daemon's address when ``code`` is UNAVAILABLE
    (the daemon is gone or unreachable: which one matters in a pool)."""
    if code == grpc.StatusCode.UNAVAILABLE and daemon and not message.startswith("daemon "):
        return f"daemon {daemon}: {message}"
    return message


def from_rpc_error(e: Any, daemon: str | None = None) -> Error:
    """The Error for a grpc.RpcError (also a failed stream); an UNAVAILABLE
    one names ``daemon``, the address the call went to."""
    code = e.code() if callable(getattr(e, "code", None)) else grpc.StatusCode.UNKNOWN
    details = e.details() if callable(getattr(e, "details", None)) else str(e)
    code = code or grpc.StatusCode.UNKNOWN
    return Error(code, naming_daemon(code, details or "", daemon))


def short_token(token: str) -> str:
    """A session token as the daemon's messages quote it: its first 8
    characters, each not a hex digit shown as '?'."""
    return "".join(c if c in "0123456789abcdefABCDEF" else "?" for c in token[:8])


# The daemon's NOT_FOUND for a session its own kernel's fault (or hang)
# closed, which says what the kernel did: "session 85f4886a was closed: its
# kernel 'gx_fault' made an illegal memory access (CUDA_ERROR_ILLEGAL_ADDRESS)
# and reset device 0 at 17:00:23.882 UTC (strike 1 of 3 ...): open a new
# session".
_CLOSED_BY_RESET = re.compile(r"session ([0-9a-fA-F?]{1,8}) was closed: (.+ and reset device \d+ "
                              r"at (\d\d:\d\d:\d\d(?:\.\d+)? UTC).*)$", re.DOTALL)


def closed_by_reset(error: Error, short: str) -> tuple[str, str] | None:
    """(cause, when) when ``error`` is the daemon's NOT_FOUND for session
    ``short`` closed by a reset its kernel caused: the daemon's words after
    "was closed: " and the reset's time of day; else None."""
    if error.code != grpc.StatusCode.NOT_FOUND:
        return None
    m = _CLOSED_BY_RESET.match(error.message)
    if m is None or m.group(1) != short:
        return None
    return m.group(2), m.group(3)


class SessionFate:
    """What ended a session on the daemon, so that its errors say so.

    A fault or hang of the session's kernel resets the device and ends the
    session: the call that waited for the kernel raises ABORTED; every later
    call gets the daemon's NOT_FOUND, which names the kernel and what it did
    (the CUDA error, or the time limit it ran past). Where nobody waited for
    the faulting launch (it was queued), that NOT_FOUND is the first word of
    the fault and is raised as the daemon gave it; once the fault was told
    (that way or as the ABORTED), later ones read "session ... was closed by
    its earlier failure: <the daemon's cause>".
    """

    def __init__(self, token: str) -> None:
        self.short = short_token(token)
        self.aborted: Error | None = None  # the first ABORTED a call of the session raised
        self.told = False  # whether the reset that ended the session was raised

    def failed(self, e: Error) -> Error:
        """The error to raise for ``e``, a failure of one of the session's calls."""
        if e.code == grpc.StatusCode.ABORTED:
            if self.aborted is None:
                self.aborted = e
            return e
        reset = closed_by_reset(e, self.short)
        if reset is None:
            return e
        cause, when = reset
        if not self._learn(when):
            return e
        return Error(e.code, f"session {self.short} was closed by its earlier failure: {cause}")

    def untold(self, e: Error) -> str | None:
        """The daemon's cause in ``e`` (close()'s NOT_FOUND) when it is the
        first to show the reset that ended the session: nobody was told of it
        yet; else None."""
        reset = closed_by_reset(e, self.short)
        if reset is None or self._learn(reset[1]):
            return None
        return reset[0]

    def _learn(self, when: str) -> bool:
        """Whether the reset at ``when`` (its time of day) that ended the
        session was told already: an ABORTED of it was raised, or the
        daemon's NOT_FOUND was; from now on it has been."""
        told = self.told or (self.aborted is not None and when in self.aborted.message)
        self.told = True
        return told
