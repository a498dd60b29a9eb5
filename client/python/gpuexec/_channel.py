"""How connect() makes its channel: plain or TLS (with a client certificate
for mutual TLS), and the bearer token added to every call.

The token goes as ``authorization: Bearer <token>`` metadata by an
interceptor, not as gRPC call credentials: gRPC sends those only over TLS,
and a daemon on loopback or a Unix socket reads the metadata there too.
"""

from __future__ import annotations

import collections
import ipaddress
import os
from typing import Any, Callable, Sequence, Tuple, Union

import grpc

from ._errors import client_error

ENV_TOKEN = "GPUEXEC_TOKEN"
ENV_ROOT_CA = "GPUEXEC_TLS_CA"
ENV_CERT = "GPUEXEC_TLS_CERT"
ENV_KEY = "GPUEXEC_TLS_KEY"

# A credential as connect() takes it: a file's path, or the PEM itself.
PemSource = Union[str, "os.PathLike[str]", bytes, bytearray, memoryview]
ChannelOptions = Sequence[Tuple[str, Any]]


def is_local_target(target: str) -> bool:
    """Whether ``target`` reaches only this host: a unix: target, or a
    loopback address (127.x, localhost, ::1)."""
    t = target
    if t.startswith(("unix:", "unix-abstract:")):
        return True
    for prefix in ("dns:///", "ipv4:", "ipv6:"):
        if t.startswith(prefix):
            t = t[len(prefix):]
            break
    if t.startswith("["):  # [v6]:port or [v6]
        host = t[1:t.find("]")] if "]" in t else t[1:]
    elif t.count(":") == 1:  # host:port
        host = t.rsplit(":", 1)[0]
    else:  # a bare host, or a bare IPv6 address
        host = t
    if host == "localhost":
        return True
    # An address, not a name: "127.example.com" may be anywhere.
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _pem(source: object, what: str) -> bytes:
    """The PEM bytes of ``source``: a path (str or os.PathLike) to read, or
    the PEM itself as bytes."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        data = bytes(source)
        if b"-----BEGIN " not in data:
            raise client_error(f"the {what} given as bytes is not PEM (a path is a str)")
        return data
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        try:
            with open(path, "rb") as f:
                return f.read()
        except OSError as e:
            raise client_error(f"cannot read the {what} {path}: {e.strerror}") from None
    raise client_error(f"the {what} must be a path or PEM bytes, not a {type(source).__name__}")


def _from_env(value: PemSource | None, name: str) -> PemSource | None:
    if value is not None:
        return value
    return os.environ.get(name) or None


class Recipe:
    """What a channel to ``target`` needs, read and checked before any call."""

    def __init__(self, target: str, *, token: str | None = None,
                 root_ca: PemSource | None = None, cert: PemSource | None = None,
                 key: PemSource | None = None, tls: bool | None = None,
                 allow_token_over_plain_tcp: bool = False) -> None:
        self.target = target
        if token is None:
            token = os.environ.get(ENV_TOKEN, "")
        if not isinstance(token, str):
            raise client_error(f"the token must be a str, not a {type(token).__name__}")
        # Read from a file, a token may end with a line break.
        self.token: str | None = token.strip() or None
        if self.token is not None and any(c in self.token for c in "\r\n\0"):
            raise client_error("the token holds a line break or NUL")
        # A daemon's Unix socket never serves TLS: the environment's TLS
        # files are for TCP targets.
        if tls is not False and not target.startswith(("unix:", "unix-abstract:")):
            root_ca = _from_env(root_ca, ENV_ROOT_CA)
            cert = _from_env(cert, ENV_CERT)
            key = _from_env(key, ENV_KEY)
        if (cert is None) != (key is None):
            raise client_error("a client certificate needs both cert and key")
        if tls is False and (root_ca is not None or cert is not None):
            raise client_error("tls=False with root_ca or cert: TLS is what they are for")
        self.tls = bool(tls) or root_ca is not None or cert is not None
        # The PEMs, kept for the probe that explains a failed handshake.
        self.root_ca_pem: bytes | None = None
        self.cert_pem: bytes | None = None
        self.key_pem: bytes | None = None
        self.credentials: Any = None
        if not self.tls:
            if (self.token is not None and not allow_token_over_plain_tcp
                    and not is_local_target(target)):
                raise client_error(
                    f"refusing to send the token over plain TCP to {target}, where anyone on "
                    "the path could read it: use TLS (root_ca=..., or tls=True for the "
                    "system's roots), or pass allow_token_over_plain_tcp=True",
                    grpc.StatusCode.FAILED_PRECONDITION)
            return
        if root_ca is not None:
            self.root_ca_pem = _pem(root_ca, "root CA")
        if cert is not None:
            self.cert_pem = _pem(cert, "client certificate")
            self.key_pem = _pem(key, "client key")
        self.credentials = grpc.ssl_channel_credentials(
            root_certificates=self.root_ca_pem, private_key=self.key_pem,
            certificate_chain=self.cert_pem)

    def channel(self, options: ChannelOptions) -> Any:
        """A new channel, plain or TLS (without the token: see intercept)."""
        if self.credentials is None:
            return grpc.insecure_channel(self.target, options=options)
        return grpc.secure_channel(self.target, self.credentials, options=options)

    def intercept(self, channel: Any) -> Any:
        """``channel`` with the token added to every call's metadata."""
        if self.token is None:
            return channel
        return grpc.intercept_channel(channel, _TokenInterceptor(self.token))

    def metadata(self) -> tuple[tuple[str, str], ...]:
        """What the interceptor adds to each call, for calls made on the
        channel beneath it (the command stream's)."""
        return () if self.token is None else (_token_entry(self.token),)


def _token_entry(token: str) -> tuple[str, str]:
    return ("authorization", "Bearer " + token)


class _CallDetails(collections.namedtuple(
        "_CallDetails", ("method", "timeout", "metadata", "credentials", "wait_for_ready",
                         "compression")), grpc.ClientCallDetails):
    pass


class _TokenInterceptor(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                        grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Adds ``authorization: Bearer <token>`` to every call."""

    def __init__(self, token: str) -> None:
        self._entry = _token_entry(token)

    def __repr__(self) -> str:
        return "<gpuexec token interceptor>"  # never the token

    def _details(self, d: Any) -> _CallDetails:
        metadata = list(d.metadata or ())
        metadata.append(self._entry)
        return _CallDetails(d.method, d.timeout, metadata, d.credentials,
                            getattr(d, "wait_for_ready", None), getattr(d, "compression", None))

    def intercept_unary_unary(self, continuation: Callable[..., Any], details: Any,
                              request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation: Callable[..., Any], details: Any,
                               request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation: Callable[..., Any], details: Any,
                               request_iterator: Any) -> Any:
        return continuation(self._details(details), request_iterator)

    def intercept_stream_stream(self, continuation: Callable[..., Any], details: Any,
                                request_iterator: Any) -> Any:
        return continuation(self._details(details), request_iterator)
