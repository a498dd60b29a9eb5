"""A pool of daemons (a GPU pool across nodes): the client places each
session itself, as the C++ client's gpuexec::Pool does.

    pool = gpuexec.connect("pool://gpuexec-pool.gpu.svc:50051")
    with pool.session(memory_limit=8 << 30, min_compute_capability=(9, 0)) as s:
        ...                                  # s.daemon: where it was placed

A pool target names the daemons: ``pool://NAME:PORT`` (every address NAME
resolves to: a headless Service) or ``pool://HOST:PORT,HOST:PORT,...``.
``session()`` asks ``choices`` daemons drawn at random for their devices
(each within ``probe_timeout``), opens the session on the healthy device of
the compute capability asked with the most memory free (``memory_limit``
must fit; then the fewest sessions, then the least work pending) and
returns an ordinary Session bound to that daemon. A daemon that does not
answer in time is passed over; one that dies fails its sessions with
UNAVAILABLE naming it, and the next session goes elsewhere.

Over TLS each daemon's certificate must carry the DNS name its address was
found under (a pod's certificate names the Service, not the pod's address).
"""

from __future__ import annotations

import concurrent.futures
import ipaddress
import random
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import grpc

from ._client import Client, Device, Session, open_client
from ._errors import Error, client_error

SCHEME = "pool://"
# A list or DNS answer larger than this is refused: a placement asks a few.
MAX_DAEMONS = 65536
# Daemons asked at once by a listing of the whole pool.
PROBE_THREADS = 64
# More device memory than any GPU has (16 TiB): a daemon that reports it (a
# broken or hostile one) is passed over, not preferred.
_MOST_DEVICE_BYTES = 1 << 44


def is_pool_target(target: object) -> bool:
    """Whether ``target`` names a pool ("pool://...")."""
    return isinstance(target, str) and target.startswith(SCHEME)


def parse_pool(target: str) -> list[tuple[str, int]]:
    """[(host, port), ...] of a pool target; Error (INVALID_ARGUMENT) when
    it is malformed."""
    if not is_pool_target(target):
        raise client_error("a pool target starts with pool://")
    out = []
    for part in target[len(SCHEME):].split(","):
        host, sep, port = part.rpartition(":")
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        if not sep or not host or not port.isdigit() or not 0 < int(port) <= 65535:
            raise client_error(f"pool target: {part[:128]!r} is not HOST:PORT (pool://HOST:PORT "
                               "for a name that resolves to the daemons, or "
                               "pool://HOST:PORT,HOST:PORT,...)")
        out.append((host, int(port)))
        if len(out) > MAX_DAEMONS:
            raise client_error(f"pool target: more than {MAX_DAEMONS} daemons")
    return out


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return False


def _resolve(host: str, port: int) -> list[str]:
    """Every address (host, port) resolves to, as targets."""
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as e:
        raise Error(grpc.StatusCode.UNAVAILABLE,
                    f"gpuexec client: cannot resolve {host[:253]!r}: {e}") from None
    out = []
    for family, _, _, _, address in found:
        if family == socket.AF_INET:
            out.append(f"{address[0]}:{port}")
        elif family == socket.AF_INET6:
            out.append(f"[{address[0]}]:{port}")
    return out


@dataclass(frozen=True)
class PoolDaemon:
    """One daemon's answer to Pool.devices()."""
    daemon: str                   # its address, as the pool reaches it
    devices: Tuple[Device, ...]   # its Devices (empty when it did not answer)
    error: Optional[Error] = None  # why it did not answer in time; None when it did


class Pool:
    """Daemons a session may be placed on; thread-safe; ``with`` closes
    every connection. ``connect`` options (token, TLS files, timeouts) apply
    to each daemon; see the module's docstring for the rest."""

    def __init__(self, target: str, *, choices: int = 3, probe_timeout: float = 0.5,
                 resolve_every: float = 10.0, timeout: float = 10.0,
                 channel_options: Sequence[Tuple[str, Any]] = (),
                 **connect_options: Any) -> None:
        self._connect: Callable[..., Client] = open_client
        self._names = parse_pool(target)
        if not isinstance(choices, int) or choices < 1:
            raise client_error(f"choices is {choices!r}; at least 1")
        if not probe_timeout > 0:
            raise client_error("probe_timeout must be positive")
        self.target = target[:512]
        self.choices = choices
        self.probe_timeout = float(probe_timeout)
        self.resolve_every = float(resolve_every)
        self._timeout = timeout
        self._channel_options = tuple(channel_options)
        self._options = connect_options
        self._lock = threading.Lock()
        self._daemons: List[str] = []
        self._server_names: Dict[str, str] = {}  # address -> the DNS name it was found under
        self._resolved_at: Optional[float] = None
        self._probes: Dict[str, Client] = {}
        self._sessions: Dict[str, Client] = {}
        self._random = random.SystemRandom()
        self._refresh()

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<gpuexec.Pool {self.target} of {len(self.daemons)} daemon(s)>"

    @property
    def daemons(self) -> list[str]:
        """The daemons' addresses ("10.0.0.7:50051"), as last resolved."""
        with self._lock:
            return list(self._daemons)

    def close(self) -> None:
        """Closes every connection (sessions stay open until their lease
        lapses)."""
        with self._lock:
            clients = list(self._probes.values()) + list(self._sessions.values())
            self._probes.clear()
            self._sessions.clear()
        for c in clients:
            c.close()

    def _refresh(self) -> None:
        """Resolves the names again if the last answer is old; keeps the last
        good answer when none resolves now."""
        with self._lock:
            if (self._daemons and self._resolved_at is not None
                    and time.monotonic() - self._resolved_at < self.resolve_every):
                return
        found: set[str] = set()
        names: dict[str, str] = {}
        errors: list[str] = []
        for host, port in self._names:
            try:
                addresses = _resolve(host, port)
            except Error as e:
                if len(errors) < 3:
                    errors.append(e.message)
                continue
            found.update(addresses)
            if not _is_ip(host):
                for a in addresses:
                    names.setdefault(a, host)
            if len(found) > MAX_DAEMONS:
                raise client_error(f"pool {self.target}: more than {MAX_DAEMONS} daemons")
        with self._lock:
            if not found:
                if self._daemons:
                    return
                raise Error(grpc.StatusCode.UNAVAILABLE,
                            f"gpuexec client: pool {self.target}: no daemon found "
                            f"({'; '.join(errors)})")
            self._daemons = sorted(found)
            self._server_names = names
            self._resolved_at = time.monotonic()
            # Connections to daemons gone from the answer go (sessions that
            # hold one keep it until they end).
            for clients in (self._probes, self._sessions):
                for gone in [a for a in clients if a not in found]:
                    del clients[gone]

    def _client(self, daemon: str, probe: bool) -> Client:
        with self._lock:
            clients = self._probes if probe else self._sessions
            if daemon in clients:
                return clients[daemon]
            server_name = self._server_names.get(daemon)
        channel_options = list(self._channel_options)
        if server_name and not any(k == "grpc.ssl_target_name_override"
                                   for k, _ in channel_options):
            channel_options.append(("grpc.ssl_target_name_override", server_name))
        options = dict(self._options)
        if probe:
            options["control_timeout"] = self.probe_timeout
        client = self._connect(daemon, timeout=self.probe_timeout if probe else self._timeout,
                               channel_options=channel_options, **options)
        with self._lock:
            clients = self._probes if probe else self._sessions
            if daemon in clients:  # another thread connected first
                client.close()
                return clients[daemon]
            clients[daemon] = client
            return client

    def _probe(self, daemon: str) -> tuple[str, Sequence[Device], Error | None]:
        try:
            return daemon, self._client(daemon, probe=True).devices(), None
        except Error as e:
            # The channel reconnects by itself; sessions on the daemon keep
            # theirs (a slow answer is no reason to break them).
            return daemon, (), e

    def _probe_all(self, daemons: Sequence[str]
                   ) -> list[tuple[str, Sequence[Device], Error | None]]:
        with concurrent.futures.ThreadPoolExecutor(
                max_workers=max(1, min(PROBE_THREADS, len(daemons)))) as pool:
            return list(pool.map(self._probe, daemons))

    def devices(self) -> list[PoolDaemon]:
        """Every daemon's devices, all asked at once: a list of PoolDaemon in
        the order of ``daemons``."""
        self._refresh()
        return [PoolDaemon(daemon=d, devices=tuple(devices), error=error)
                for d, devices, error in self._probe_all(self.daemons)]

    def session(self, *, memory_limit: int = 0,
                min_compute_capability: tuple[int, int] | None = None,
                lease: float | None = None, kernel_time_limit: float | None = None,
                gpu_time: bool = True) -> Session:
        """Places and opens a session (see the module's docstring).

        ``memory_limit``: the device bytes it may hold, which must be free
        where it goes (0: the daemon's default, any device). Raises Error:
        RESOURCE_EXHAUSTED or FAILED_PRECONDITION when no device asked fits
        (saying why each was passed over), UNAVAILABLE when none of the
        daemons asked answered.
        """
        cc = tuple(min_compute_capability or (0, 0))
        if len(cc) != 2 or not all(isinstance(v, int) and v >= 0 for v in cc):
            raise client_error(f"min_compute_capability {min_compute_capability!r} is not "
                               "(major, minor)")
        if not isinstance(memory_limit, int) or memory_limit < 0:
            raise client_error("memory_limit must be a byte count, 0 or more")
        self._refresh()
        daemons = self.daemons
        asked = self._random.sample(daemons, min(self.choices, len(daemons)))
        answers = self._probe_all(asked)
        candidates: list[tuple[str, Device]] = []
        passed_over: list[str] = []
        unhealthy = too_old = too_full = seen = most_free = 0
        for daemon, devices, error in answers:
            if error is not None:
                passed_over.append(f"daemon {daemon}: {error.code.name}")
                continue
            if devices and devices[0].daemon_draining:
                # A draining daemon opens no session.
                passed_over.append(f"daemon {daemon}: draining")
                continue
            for d in devices:
                seen += 1
                if not d.healthy or d.not_answering_since:
                    unhealthy += 1
                elif d.compute_capability < cc:
                    too_old += 1
                elif (d.memory_free_bytes > d.memory_total_bytes
                      or d.memory_total_bytes > _MOST_DEVICE_BYTES):
                    unhealthy += 1  # an answer that cannot be true
                else:
                    most_free = max(most_free, d.memory_free_bytes)
                    if d.memory_free_bytes < memory_limit:
                        too_full += 1
                    else:
                        candidates.append((daemon, d))
        what = f"{len(asked)} daemon(s) asked of {self.target}"
        if passed_over:
            what += f" ({len(passed_over)} passed over: {', '.join(passed_over)})"
        if seen == 0 and passed_over:
            raise Error(grpc.StatusCode.UNAVAILABLE,
                        f"gpuexec client: pool: no daemon answered: {what}")
        if not candidates:
            among = f"{seen} device(s) of {what}"
            if too_full:
                raise Error(grpc.StatusCode.RESOURCE_EXHAUSTED,
                            f"gpuexec client: no device with {memory_limit} bytes free among "
                            f"{among} (the most free: {most_free} bytes; {unhealthy} not healthy, "
                            f"{too_old} below the compute capability asked)")
            raise Error(grpc.StatusCode.FAILED_PRECONDITION,
                        f"gpuexec client: no usable device among {among}: {unhealthy} not "
                        f"healthy, {too_old} below compute capability {cc[0]}.{cc[1]}")
        # The most memory free, then the fewest sessions, then the least
        # work pending.
        daemon, device = max(candidates, key=lambda c: (c[1].memory_free_bytes, -c[1].sessions,
                                                        -c[1].pending_requests))
        return self._client(daemon, probe=False).session(
            device.index, lease=lease, memory_limit=memory_limit,
            kernel_time_limit=kernel_time_limit, gpu_time=gpu_time)
