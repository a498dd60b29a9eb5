"""How connect() waits for its channel, and what it says when none comes.

grpcio reports a failed connection as a state and nothing more: the
channel goes to TRANSIENT_FAILURE and keeps trying. So once it has failed
(and only then: a working daemon never sees a probe), connect looks at the
target itself, with a socket of its own and, for TLS, Python's ``ssl``, and
turns what it sees into one line that names the target, the cause in words
and what to do:

- nothing listening (a TCP port refused, a Unix socket missing or refused):
  at once, without waiting out ``timeout``;
- the daemon's certificate not signed by the CA given, or not naming the
  host;
- a daemon that speaks TLS to a client without a CA, or plain TCP to one
  with TLS;
- a daemon that wants a client certificate (mutual TLS), or refuses the
  one given.

A failure the probe cannot explain keeps waiting until ``timeout``, as a
daemon may be starting; a target that never answers at all (no failure
seen) is reported as such once ``timeout`` has passed.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import ssl
import stat
import threading
import time
from typing import Any, Optional, Tuple, Union, cast

import grpc

from ._channel import ChannelOptions, Recipe
from ._errors import Error

# ("unix", path) or ("tcp", host, port).
Address = Union[Tuple[str, str], Tuple[str, str, int]]

# How long a probe may take (a TCP connect, a TLS handshake, an answer).
PROBE_S = 2.0
HINT_TARGET = "(set the target with connect(target) or $GPUEXEC_TARGET)"
HINT_CA = "give the CA that signed it: connect(..., root_ca=PATH) or $GPUEXEC_TLS_CA"
HINT_CERT = ("give this client's certificate and key: connect(..., cert=PATH, key=PATH) or "
             "$GPUEXEC_TLS_CERT and $GPUEXEC_TLS_KEY")
# The client's half of an HTTP/2 connection's start: the preface and an
# empty SETTINGS frame.
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
# OpenSSL's verify results that mean "not signed by a CA given".
_UNTRUSTED = {2, 7, 18, 19, 20, 21}
_HOSTNAME_MISMATCH = {62, 64}
_EXPIRED = {9, 10}


def unavailable(target: str, cause: str) -> Error:
    """The Error connect raises: one line, the target, the cause, what to do."""
    return Error(grpc.StatusCode.UNAVAILABLE, f"gpuexec: cannot connect to {target}: {cause}")


def wait_ready(channel: Any, recipe: Recipe, target: str, timeout: float,
               options: ChannelOptions = ()) -> None:
    """Returns once ``channel`` is ready; raises ``unavailable`` at once
    when a probe after a failed attempt explains the failure, else once
    ``timeout`` seconds have passed."""
    ready = grpc.channel_ready_future(channel)
    woken = threading.Event()
    failed = threading.Event()

    def watch(state: Any) -> None:
        if state == grpc.ChannelConnectivity.TRANSIENT_FAILURE:
            failed.set()
            woken.set()

    ready.add_done_callback(lambda _: woken.set())
    channel.subscribe(watch)
    deadline = time.monotonic() + timeout
    try:
        while not ready.done():
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not woken.wait(remaining):
                break
            if ready.done():
                break
            # The channel failed: see why, once; a failure the probe cannot
            # explain waits out the timeout, as a daemon may be starting.
            cause = diagnose(recipe, target, options, min(PROBE_S, max(remaining, 0.2)))
            if cause is not None:
                raise unavailable(target, cause)
            try:
                ready.result(timeout=max(deadline - time.monotonic(), 0))
            except grpc.FutureTimeoutError:
                pass
            break
        if ready.done():
            return
    finally:
        channel.unsubscribe(watch)
        ready.cancel()
    if not failed.is_set():
        raise unavailable(target, f"no answer within {timeout:g} s: is the host up, and "
                                  f"gpuexecd listening on that port? {HINT_TARGET}")
    hint = (" (TLS: is the daemon serving TLS there, signed by the root CA given, and does it "
            "take this client's certificate?)" if recipe.tls else "")
    raise unavailable(target, f"no connection within {timeout:g} s{hint}")


def diagnose(recipe: Recipe, target: str, options: ChannelOptions = (),
             budget: float = PROBE_S) -> Optional[str]:
    """Why ``target`` takes no connection, in words with what to do, or None
    when a probe finds nothing wrong (or cannot look)."""
    address = parse_target(target)
    if address is None:
        return None
    if address[0] == "unix":
        return _unix_cause(address[1])
    _, host, port = cast(Tuple[str, str, int], address)
    try:
        sock = socket.create_connection((host, port), timeout=budget)
    except OSError as e:
        return _connect_cause(e)
    with contextlib.closing(sock):
        if recipe.tls:
            return _tls_cause(sock, recipe, _server_name(host, options), budget)
        return _plain_cause(sock, host, budget)


def parse_target(target: str) -> Optional[Address]:
    """("unix", path) or ("tcp", host, port) for ``target``; None for a form
    this module does not probe (an abstract socket, a name without a port)."""
    t = target
    if t.startswith("unix://"):
        return ("unix", t[len("unix://"):])
    if t.startswith("unix:"):
        return ("unix", t[len("unix:"):])
    if t.startswith("unix-abstract:"):
        return None
    for prefix in ("dns:///", "ipv4:", "ipv6:"):
        if t.startswith(prefix):
            t = t[len(prefix):]
            break
    if "," in t:  # an ipv4: list: the first
        t = t.split(",", 1)[0]
    if t.startswith("["):
        end = t.find("]")
        if end < 0 or not t[end + 1:].startswith(":"):
            return None
        host, port = t[1:end], t[end + 2:]
    elif t.count(":") == 1:
        host, port = t.split(":")
    else:
        return None
    if not port.isdigit() or not host:
        return None
    return ("tcp", host, int(port))


def _server_name(host: str, options: ChannelOptions) -> str:
    for key, value in options:
        if key == "grpc.ssl_target_name_override":
            return value
    return host


def _unix_cause(path: str) -> Optional[str]:
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return f"no such socket: is gpuexecd running? {HINT_TARGET}"
    except OSError as e:
        return f"{_words(e)} {HINT_TARGET}"
    if not stat.S_ISSOCK(mode):
        return f"not a socket, but a file of another kind: {HINT_TARGET}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with contextlib.closing(sock):
        sock.settimeout(PROBE_S)
        try:
            sock.connect(path)
        except ConnectionRefusedError:
            return ("connection refused (the socket file is there, no daemon listens on it): "
                    f"is gpuexecd running? {HINT_TARGET}")
        except PermissionError:
            return ("permission denied: this user may not open the daemon's socket (ask for "
                    "its group, or use the daemon's TCP port)")
        except OSError as e:
            return f"{_words(e)} {HINT_TARGET}"
    return None


def _connect_cause(e: OSError) -> Optional[str]:
    if isinstance(e, ConnectionRefusedError):
        return f"connection refused: is gpuexecd running? {HINT_TARGET}"
    if isinstance(e, socket.timeout):
        return None  # a slow path, not a cause: the channel may still get through
    if isinstance(e, socket.gaierror):
        return f"the host name does not resolve ({e.strerror}) {HINT_TARGET}"
    return f"{_words(e)} {HINT_TARGET}"


def _words(e: OSError) -> str:
    return (e.strerror or errno.errorcode.get(e.errno, str(e))).lower()


def _plain_cause(sock: socket.socket, host: str, budget: float) -> Optional[str]:
    """A daemon that answers a plain TCP client's HTTP/2 start with TLS, or
    that completes a TLS handshake, speaks TLS."""
    sock.settimeout(budget)
    try:
        sock.sendall(_H2_PREFACE)
        head = sock.recv(5)
    except OSError:
        head = b""
    if len(head) >= 3 and head[0] in (0x15, 0x16) and head[1] == 0x03:
        return _speaks_tls()
    if len(head) >= 4 and head[3] == 0x04:  # an HTTP/2 SETTINGS frame: plain, as asked
        return None
    # Closed without a word: does it take a TLS handshake?
    try:
        probe = socket.create_connection(sock.getpeername()[:2], timeout=budget)
    except OSError:
        return None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols(["h2"])
    with contextlib.closing(probe):
        try:
            ctx.wrap_socket(probe, server_hostname=host).close()
        except (ssl.SSLError, OSError) as e:
            if isinstance(e, ssl.SSLError) and "ALERT" in (e.reason or ""):
                return _speaks_tls()  # it answered in TLS, if only to refuse
            return None
    return _speaks_tls()


def _speaks_tls() -> str:
    return f"the daemon speaks TLS, and this client plain TCP: {HINT_CA}"


def _tls_cause(sock: socket.socket, recipe: Recipe, server_name: str,
               budget: float) -> Optional[str]:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.set_alpn_protocols(["h2"])
    if recipe.root_ca_pem is not None:
        try:
            ctx.load_verify_locations(cadata=recipe.root_ca_pem.decode("ascii", "replace"))
        except (ssl.SSLError, ValueError):
            return None
        ca = "the CA given (root_ca or $GPUEXEC_TLS_CA)"
    else:
        ctx.load_default_certs()
        ca = "a CA this system trusts (no root_ca given)"
    with_cert = _load_client_cert(ctx, recipe)
    if with_cert is None:
        return None  # its certificate cannot be loaded here: no verdict on it
    sock.settimeout(budget)
    try:
        tls = ctx.wrap_socket(sock, server_hostname=server_name)
    except ssl.SSLCertVerificationError as e:
        if e.verify_code in _UNTRUSTED:
            return f"TLS: the daemon's certificate is not signed by {ca}: {HINT_CA}"
        if e.verify_code in _HOSTNAME_MISMATCH:
            return (f"TLS: the daemon's certificate does not name {server_name} "
                    f"({e.verify_message}): connect by a name it carries, or pass "
                    "channel_options=[(\"grpc.ssl_target_name_override\", NAME)]")
        if e.verify_code in _EXPIRED:
            return f"TLS: the daemon's certificate is {e.verify_message}: it needs a new one"
        return f"TLS: the daemon's certificate was refused: {e.verify_message}"
    except ssl.SSLError as e:
        return _alert_cause(e, with_cert) or _not_tls_cause(e)
    except OSError:
        return None
    # TLS 1.3: the daemon checks the client's certificate once the client's
    # side of the handshake is done. A daemon that takes the connection
    # answers the HTTP/2 start with its SETTINGS; gRPC's closes one whose
    # certificate it wants or refuses without a word (no TLS alert).
    with contextlib.closing(tls):
        try:
            tls.sendall(_H2_PREFACE)
            answer = tls.recv(9)
        except (ssl.SSLZeroReturnError, ssl.SSLEOFError, ConnectionResetError):
            answer = b""
        except ssl.SSLError as e:
            return _alert_cause(e, with_cert)
        except OSError:
            return None
    if answer:
        return None
    return _client_cert_cause(with_cert)


def _client_cert_cause(with_cert: bool) -> str:
    if not with_cert:
        return f"TLS: the daemon wants a client certificate (mutual TLS): {HINT_CERT}"
    return ("TLS: the daemon refused this client's certificate: give one signed by a CA the "
            "daemon trusts (its --tls_client_ca)")


def _alert_cause(e: ssl.SSLError, with_cert: bool) -> Optional[str]:
    """The cause a TLS alert gives, where a daemon sends one."""
    reason = (e.reason or "").upper()
    if ("CERTIFICATE_REQUIRED" in reason or "HANDSHAKE_FAILURE" in reason) and not with_cert:
        return _client_cert_cause(False)
    if with_cert and any(w in reason for w in ("UNKNOWN_CA", "BAD_CERTIFICATE",
                                               "CERTIFICATE_UNKNOWN", "DECRYPT_ERROR")):
        return _client_cert_cause(True)
    return None


def _not_tls_cause(e: ssl.SSLError) -> Optional[str]:
    reason = (e.reason or "").upper()
    if "WRONG_VERSION_NUMBER" in reason or "RECORD_LAYER" in reason or "PACKET_LENGTH" in reason:
        return ("TLS: the daemon speaks plain TCP, not TLS: connect without root_ca and "
                "cert (or with tls=False)")
    return None


def _load_client_cert(ctx: ssl.SSLContext, recipe: Recipe) -> Optional[bool]:
    """Loads the recipe's client certificate into ``ctx``: True, False (none
    given), or None when it cannot be loaded here. ``ssl`` reads files only:
    PEM bytes go through an anonymous memory file (Linux), never to disk."""
    if recipe.cert_pem is None:
        return False
    if recipe.key_pem is None:  # a Recipe has both or neither
        return None
    if not hasattr(os, "memfd_create") or not os.path.isdir("/proc/self/fd"):
        return None
    fds: list[int] = []
    try:
        for data in (recipe.cert_pem, recipe.key_pem):
            fd = os.memfd_create("gpuexec-probe", getattr(os, "MFD_CLOEXEC", 0))
            fds.append(fd)
            os.write(fd, data)
        ctx.load_cert_chain(f"/proc/self/fd/{fds[0]}", f"/proc/self/fd/{fds[1]}")
        return True
    except (OSError, ssl.SSLError):
        return None
    finally:
        for fd in fds:
            os.close(fd)
