"""connect(): one daemon's Client, or a Pool of daemons."""

from __future__ import annotations

import os
from typing import Any, Sequence, Tuple, Union

from ._client import DEFAULT_CHUNK_BYTES, DEFAULT_TARGET, Client, open_client
from ._pool import Pool, is_pool_target

# A credential: a file's path, or the PEM itself.
PathOrPem = Union[str, "os.PathLike[str]", bytes]


def connect(target: str | None = None, *, timeout: float = 10.0,
            chunk_bytes: int = DEFAULT_CHUNK_BYTES, control_timeout: float = 60.0,
            channel_options: Sequence[Tuple[str, Any]] = (), token: str | None = None,
            root_ca: PathOrPem | None = None, cert: PathOrPem | None = None,
            key: PathOrPem | None = None, tls: bool | None = None,
            allow_token_over_plain_tcp: bool = False,
            shm_socket: str | None = None, command_ring: bool | None = None) -> Client | Pool:
    """Connects to a daemon and waits up to ``timeout`` seconds for it.

    ``target`` is "host:port" or "unix:/path"; by default $GPUEXEC_TARGET,
    else 127.0.0.1:50051. Raises Error (UNAVAILABLE) if no connection is made
    in time: at once, with the cause and what to do, when a failed attempt
    is explained (nothing listening there, a TLS handshake refused: a CA
    that did not sign the daemon's certificate, TLS on one side only, a
    client certificate wanted); else once ``timeout`` has passed.

    A pool target, "pool://NAME:PORT" or "pool://HOST:PORT,HOST:PORT,...",
    gives a gpuexec.Pool instead (its ``session()`` places each session on
    one of the daemons; see Pool), with these options for every daemon.
    Both are context managers with ``session()``, ``devices()`` and
    ``close()``; code that needs one of them checks with isinstance.

    For a daemon with tenants:

    - ``token``: a bearer token, sent as ``authorization: Bearer <token>``
      with every call (streams included); by default $GPUEXEC_TOKEN. "" sends
      none.
    - ``root_ca``: the CA of the daemon's certificate, for TLS; by default
      $GPUEXEC_TLS_CA. ``cert`` and ``key``: this client's certificate chain
      and key, for mutual TLS; by default $GPUEXEC_TLS_CERT and
      $GPUEXEC_TLS_KEY. Each is a path (str or os.PathLike) or the PEM itself
      as bytes. The environment's files are not used for unix: targets (the
      daemon's socket is never TLS) or with ``tls=False``.
    - ``tls``: None: TLS when there is a root CA or a client certificate;
      True: TLS, with the system's roots when there is no root CA; False:
      plain.
    - A token goes over plain TCP only to this host (loopback, unix:); to
      another, connect raises Error (FAILED_PRECONDITION) unless
      ``allow_token_over_plain_tcp``.

    A file that cannot be read, or a certificate without its key, is an
    Error (INVALID_ARGUMENT) before any connection is tried.

    ``shm_socket``: the daemon's host memory socket (gpuexecd --shm_socket),
    a path on this host, for ``Session.host_array`` and
    ``Session.map_host_memory``. None: the path the daemon names when it
    opens a session, which it does only for callers on its Unix socket; a
    client over TCP on the daemon's host passes it here.

    ``command_ring``: where the daemon serves command rings on that socket
    (gpuexecd --shm_socket serves them there), each session posts its launches and
    synchronizes through shared memory instead of gRPC (a few microseconds
    each way instead of tens); anything the ring cannot carry, and every
    session where it is not served, goes on the session's Execute stream.
    None: on unless $GPUEXEC_COMMAND_RING is 0. Why a session does not use
    one is logged on the "gpuexec" logger at DEBUG.
    """
    target = target or os.environ.get("GPUEXEC_TARGET") or DEFAULT_TARGET
    if is_pool_target(target):
        return Pool(target, timeout=timeout, chunk_bytes=chunk_bytes,
                    control_timeout=control_timeout, channel_options=channel_options,
                    token=token, root_ca=root_ca, cert=cert, key=key, tls=tls,
                    allow_token_over_plain_tcp=allow_token_over_plain_tcp,
                    shm_socket=shm_socket)
    return open_client(target, timeout=timeout, chunk_bytes=chunk_bytes,
                       control_timeout=control_timeout, channel_options=channel_options,
                       token=token, root_ca=root_ca, cert=cert, key=key, tls=tls,
                       allow_token_over_plain_tcp=allow_token_over_plain_tcp,
                       shm_socket=shm_socket, command_ring=command_ring)
