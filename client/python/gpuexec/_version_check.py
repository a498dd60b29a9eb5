"""The client's version against the daemon's: a warning, never a failure.

The daemon reports its version (MAJOR.MINOR.PATCH) in every ListDevices and
OpenSession answer. A Client compares it with its own at the first answer
that carries one and, when MAJOR.MINOR differ, warns once with a
VersionWarning: the wire API (gpuexec.v1) is the same and most calls work,
but a call or field that one side added since the other's release may be
refused or ignored. PATCH releases are not told; an empty version (a daemon
older than the field) says nothing.
"""

from __future__ import annotations

import re
import threading
import warnings

from ._version import __version__


class VersionWarning(UserWarning):
    """The daemon runs another MAJOR.MINOR release than this client."""


# MAJOR.MINOR, then nothing or '.', '-', '+' and anything ("0.1.0", "1.0.0-rc1").
_MAJOR_MINOR = re.compile(r"([0-9]{1,9})\.([0-9]{1,9})(?:[.+-]|\Z)")


def _major_minor(version: str) -> tuple[int, int] | None:
    m = _MAJOR_MINOR.match(version)
    return (int(m.group(1)), int(m.group(2))) if m else None


def _printable(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, its control characters escaped
    (the daemon is not trusted to send printable text)."""
    out = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" if ord(c) < 0x100
                  else f"\\u{ord(c):04x}" for c in text[:limit])
    return out + ("..." if len(text) > limit else "")


def version_warning(target: str | None, daemon_version: str,
                    client_version: str = __version__) -> str:
    """The warning for this client talking to the daemon at ``target`` that
    reports ``daemon_version``, or "" when there is none to give."""
    if not daemon_version:
        return ""
    daemon = _major_minor(daemon_version)
    if daemon is not None and daemon == _major_minor(client_version):
        return ""
    who = f"the daemon at {_printable(target, 256)}" if target else "the daemon"
    if daemon is not None:
        runs = f"runs gpuexecd {_printable(daemon_version, 64)}"
        advice = f"use a client of release {daemon[0]}.{daemon[1]}, or a daemon of this client's"
    else:
        runs = f'reports version "{_printable(daemon_version, 32)}" (not MAJOR.MINOR.PATCH)'
        advice = "use a client of the daemon's release"
    return (f"{who} {runs}, this client is {client_version}: a call or field that one of them "
            f"added since the other's release may be refused or ignored; {advice}")


class DaemonVersionCheck:
    """Once per Client: the first answer's daemon version against this
    client's, warned of with a VersionWarning when MAJOR.MINOR differ."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._checked = False

    def __call__(self, target: str | None, daemon_version: str) -> None:
        if not daemon_version:
            return
        with self._lock:
            if self._checked:
                return
            self._checked = True
        message = version_warning(target, daemon_version)
        if message:
            # stacklevel 3: the caller of Client.devices() or Client.session().
            warnings.warn(message, VersionWarning, stacklevel=3)
