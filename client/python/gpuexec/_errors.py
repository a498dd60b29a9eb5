"""The one exception type of the package."""

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
