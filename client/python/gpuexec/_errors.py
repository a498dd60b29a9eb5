"""The one exception type of the package."""

import re

import grpc


class Error(Exception):
    """A failed gpuexec call.

    ``code`` is a ``grpc.StatusCode``; ``message`` is the daemon's message
    unchanged (it names the session, buffer, module, function or device).
    Errors raised by this package without a call have messages that start
    with ``gpuexec client:``.
    """

    def __init__(self, code, message):
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message


def client_error(message, code=grpc.StatusCode.INVALID_ARGUMENT):
    """An Error made here, not by the daemon."""
    return Error(code, "gpuexec client: " + message)


def naming_daemon(code, message, daemon):
    """``message``, led by the daemon's address when ``code`` is UNAVAILABLE
    (the daemon is gone or unreachable: which one matters in a pool)."""
    if code == grpc.StatusCode.UNAVAILABLE and daemon and not message.startswith("daemon "):
        return f"daemon {daemon}: {message}"
    return message


def from_rpc_error(e, daemon=None):
    """The Error for a grpc.RpcError (also a failed stream); an UNAVAILABLE
    one names ``daemon``, the address the call went to."""
    code = e.code() if callable(getattr(e, "code", None)) else grpc.StatusCode.UNKNOWN
    details = e.details() if callable(getattr(e, "details", None)) else str(e)
    code = code or grpc.StatusCode.UNKNOWN
    return Error(code, naming_daemon(code, details or "", daemon))


def short_token(token):
    """A session token as the daemon's messages quote it: its first 8
    characters, each not a hex digit shown as '?'."""
    return "".join(c if c in "0123456789abcdefABCDEF" else "?" for c in token[:8])


# The daemon's NOT_FOUND for a session its own kernel's fault (or hang)
# closed: "session 85f4886a was closed: its kernel reset device 0 at
# 2026-12-03 17:00:23.882 UTC (strike 1 of 3 ...)".
_CLOSED_BY_RESET = re.compile(r"session ([0-9a-fA-F?]{1,8}) was closed: its kernel reset device "
                              r"(\d+) at (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? UTC)")


def closed_by_reset(error, short):
    """(device, when) when ``error`` is the daemon's NOT_FOUND for session
    ``short`` closed by a reset its kernel caused; else None."""
    if error.code != grpc.StatusCode.NOT_FOUND:
        return None
    m = _CLOSED_BY_RESET.match(error.message)
    if m is None or m.group(1) != short:
        return None
    return int(m.group(2)), m.group(3)


def reset_error(short, device, when, last_reset):
    """The ABORTED a launch that waited would have raised, rebuilt from a
    device's ``last_reset`` ("<when>: <why>", which names the kernel, its
    session and the CUDA error): for a session whose queued launches
    faulted with nobody waiting. None when ``last_reset`` is another
    reset's."""
    prefix = when + ": "
    if not last_reset.startswith(prefix) or f"session {short}" not in last_reset:
        return None
    return Error(grpc.StatusCode.ABORTED,
                 f"device {device} was reset at {when}: {last_reset[len(prefix):]}")


def after_fatal(short, first, later):
    """``later`` (the daemon's NOT_FOUND for a closed session) led by the
    session's first fatal failure, which closed it."""
    cause = first.message.rstrip(". ")
    todo = "" if "open a new" in cause else "; open a new session"
    return Error(later.code, f"session {short} was closed by its earlier failure, "
                             f"{first.code.name}: {cause}{todo} (the daemon: {later.message})")


class SessionFate:
    """What ended a session on the daemon, so that its errors say so.

    A fault or hang of the session's kernel (ABORTED) resets the device and
    ends the session; the daemon's later answers are a bare NOT_FOUND
    ("session ... was closed: its kernel reset device 0 at ..."): those are
    led by the ABORTED of that reset. Where nobody waited for the faulting
    launch (it was queued), the first such NOT_FOUND becomes the ABORTED
    itself, rebuilt from the device's last reset, which names the kernel and
    the CUDA error. ``devices`` (the client's) is asked only then.
    """

    def __init__(self, token):
        self.short = short_token(token)
        self.aborted = None  # the first ABORTED a call of the session raised
        self.fatal = None  # the failure known to have ended the session

    def failed(self, e, devices):
        """The error to raise for ``e``, a failure of one of the session's calls."""
        if e.code == grpc.StatusCode.ABORTED:
            if self.aborted is None:
                self.aborted = e
            return e
        if e.code != grpc.StatusCode.NOT_FOUND:
            return e
        told = self.fatal is not None or self._learn(e, devices)
        if self.fatal is None:
            return e
        if told:
            return after_fatal(self.short, self.fatal, e)
        return Error(self.fatal.code,
                     f"{self.fatal.message}; session {self.short} was closed by it")

    def untold(self, e, devices):
        """The failure that ended the session, when ``e`` (close()'s NOT_FOUND)
        is the first to show it: nobody was told of it yet; else None."""
        if self.fatal is not None or self._learn(e, devices):
            return None
        return self.fatal

    def _learn(self, e, devices):
        """Sets ``fatal`` when ``e`` says that the session's kernel reset its
        device: to the ABORTED already raised for that reset (returns True),
        else to one rebuilt from the device's last reset (returns False:
        nobody was told of it yet)."""
        reset = closed_by_reset(e, self.short)
        if reset is None:
            return False
        device, when = reset
        # The daemon's ABORTED gives the time of the reset, with or without
        # the date.
        if self.aborted is not None and when.split(" ", 1)[-1] in self.aborted.message:
            self.fatal = self.aborted
            return True
        try:
            found = [d for d in devices() if d.index == device]
        except Error:
            return False
        self.fatal = reset_error(self.short, device, when, found[0].last_reset) if found else None
        return False
