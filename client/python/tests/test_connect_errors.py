"""What connect() says when it gets no connection: one line naming the
target, the cause in words and what to do; at once where nothing listens,
and for each kind of TLS handshake it can tell apart. The TLS daemons and
certificates are test_auth.py's."""

import os
import socket
import subprocess
import sys
import time

import grpc
import pytest

import gpuexec
from gpuexec._connect import parse_target
# The fixtures of test_auth.py: a CA and certificates, daemons on TLS,
# mutual TLS and plain TCP.
from test_auth import mtls_daemon, pki, plain_daemon, tls_daemon  # noqa: F401
from test_auth import _issue, _tenant_daemon
from conftest import stop_daemon

HINT = "(set the target with connect(target) or $GPUEXEC_TARGET)"
EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")


def _free_port():
    """A loopback port nothing listens on (bound, then let go)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _refused(target, within, **kwargs):
    """connect()'s error for ``target``, checked to come within ``within`` s."""
    start = time.monotonic()
    with pytest.raises(gpuexec.Error) as e:
        gpuexec.connect(target, **kwargs)
    took = time.monotonic() - start
    assert took < within, (took, e.value)
    assert e.value.code == grpc.StatusCode.UNAVAILABLE, e.value
    return e.value


def test_nothing_listening_on_loopback_fails_at_once_with_the_hint():
    port = _free_port()
    for target in (f"127.0.0.1:{port}", f"localhost:{port}"):
        error = _refused(target, 2.0, timeout=30)
        assert error.message == (f"gpuexec: cannot connect to {target}: connection refused: is "
                                 f"gpuexecd running? {HINT}")
        assert str(error) == f"UNAVAILABLE: {error.message}"
        assert "\n" not in str(error)


def test_the_default_target_comes_from_the_environment(monkeypatch):
    target = f"127.0.0.1:{_free_port()}"
    monkeypatch.setenv("GPUEXEC_TARGET", target)
    error = _refused(None, 2.0, timeout=30)
    assert error.message.startswith(f"gpuexec: cannot connect to {target}: connection refused")


def test_a_unix_socket_missing_or_dead_fails_at_once(tmp_path):
    missing = f"unix:{tmp_path}/none.sock"
    error = _refused(missing, 2.0, timeout=30)
    assert error.message == (f"gpuexec: cannot connect to {missing}: no such socket: is gpuexecd "
                             f"running? {HINT}")
    # A socket file left behind, with nobody accepting on it.
    path = str(tmp_path / "stale.sock")
    s = socket.socket(socket.AF_UNIX)
    s.bind(path)
    s.close()
    error = _refused(f"unix:{path}", 2.0, timeout=30)
    assert error.message.startswith(f"gpuexec: cannot connect to unix:{path}: connection "
                                    "refused (the socket file is there, no daemon listens on "
                                    "it): is gpuexecd running?"), error
    plain = tmp_path / "file"
    plain.write_text("")
    error = _refused(f"unix:{plain}", 2.0, timeout=30)
    assert "not a socket" in error.message, error


def test_a_port_that_takes_connections_and_never_answers():
    """Something listens, nothing speaks: no failure to explain, so the
    error comes once ``timeout`` has passed, and says what to check."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        target = f"127.0.0.1:{silent.getsockname()[1]}"
        start = time.monotonic()
        error = _refused(target, 5.0, timeout=0.5)
        assert time.monotonic() - start >= 0.5
    assert error.message == (f"gpuexec: cannot connect to {target}: no answer within 0.5 s: is "
                             f"the host up, and gpuexecd listening on that port? {HINT}")


def test_a_daemon_signed_by_another_ca(tls_daemon, pki):
    error = _refused(tls_daemon.target, 5.0, root_ca=pki.rogue_ca, token=pki.token_a,
                     timeout=30)
    assert error.message == (
        f"gpuexec: cannot connect to {tls_daemon.target}: TLS: the daemon's certificate is not "
        "signed by the CA given (root_ca or $GPUEXEC_TLS_CA): give the CA that signed it: "
        "connect(..., root_ca=PATH) or $GPUEXEC_TLS_CA")
    # The system's roots did not sign it either.
    error = _refused(tls_daemon.target, 5.0, tls=True, token=pki.token_a, timeout=30)
    assert "TLS: the daemon's certificate is not signed by a CA this system trusts" in \
        error.message, error


def test_a_certificate_that_does_not_name_the_host(daemon, pki, tmp_path_factory):
    named = _issue(pki.dir, "ca", "localhost-only", ["subjectAltName = DNS:localhost",
                                                     "keyUsage = critical, digitalSignature",
                                                     "extendedKeyUsage = serverAuth"], 6)
    process, tls = _tenant_daemon(daemon, pki, tmp_path_factory, "named-tls",
                                  f"--tls_cert={named[0]}", f"--tls_key={named[1]}")
    try:
        error = _refused(tls.target, 5.0, root_ca=pki.ca, token=pki.token_a, timeout=30)
        port = tls.target.rsplit(":", 1)[1]
        with gpuexec.connect(f"localhost:{port}", root_ca=pki.ca, token=pki.token_a) as c:
            assert c.devices()
    finally:
        stop_daemon(process)
    assert error.message.startswith(
        f"gpuexec: cannot connect to {tls.target}: TLS: the daemon's certificate does not name "
        "127.0.0.1 ("), error
    assert error.message.endswith("): connect by a name it carries, or pass channel_options=[("
                                  "\"grpc.ssl_target_name_override\", NAME)]"), error


def test_plain_tcp_to_a_daemon_that_speaks_tls(tls_daemon):
    error = _refused(tls_daemon.target, 5.0, timeout=30)
    assert error.message == (
        f"gpuexec: cannot connect to {tls_daemon.target}: the daemon speaks TLS, and this client "
        "plain TCP: give the CA that signed it: connect(..., root_ca=PATH) or $GPUEXEC_TLS_CA")


def test_mutual_tls_without_a_client_certificate(mtls_daemon, pki):
    error = _refused(mtls_daemon.target, 5.0, root_ca=pki.ca, token=pki.token_a, timeout=30)
    assert error.message == (
        f"gpuexec: cannot connect to {mtls_daemon.target}: TLS: the daemon wants a client "
        "certificate (mutual TLS): give this client's certificate and key: connect(..., "
        "cert=PATH, key=PATH) or $GPUEXEC_TLS_CERT and $GPUEXEC_TLS_KEY")


def test_a_client_certificate_the_daemon_does_not_trust(mtls_daemon, pki):
    # The rogue CA's own certificate and key: a certificate no CA of the
    # daemon's signed.
    error = _refused(mtls_daemon.target, 5.0, root_ca=pki.ca, cert=pki.rogue_ca,
                     key=pki.rogue_ca.with_suffix(".key"), timeout=30)
    assert error.message.startswith(
        f"gpuexec: cannot connect to {mtls_daemon.target}: TLS: the daemon refused this "
        "client's certificate"), error


def test_tls_to_a_daemon_on_plain_tcp(plain_daemon, pki):
    error = _refused(plain_daemon.target, 5.0, root_ca=pki.ca, timeout=30)
    assert error.message == (
        f"gpuexec: cannot connect to {plain_daemon.target}: TLS: the daemon speaks plain TCP, "
        "not TLS: connect without root_ca and cert (or with tls=False)")


def test_grpc_logs_nothing_of_a_failed_handshake(tls_daemon, pki):
    """gRPC's C core logs each failed handshake to stderr; the error says it
    all, so the package keeps those lines off (unless GRPC_VERBOSITY is
    set)."""
    script = (
        "import gpuexec, sys\n"
        "try:\n"
        f"    gpuexec.connect({tls_daemon.target!r}, root_ca={str(pki.rogue_ca)!r}, timeout=5)\n"
        "except gpuexec.Error as e:\n"
        "    print(e)\n")
    env = {k: v for k, v in os.environ.items() if k != "GRPC_VERBOSITY"}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=60, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("UNAVAILABLE: gpuexec: cannot connect to"), result.stdout
    assert result.stderr == ""
    # The program's own setting wins.
    env["GRPC_VERBOSITY"] = "DEBUG"
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=60, env=env)
    assert result.returncode == 0 and result.stderr != ""


@pytest.mark.parametrize("target, parsed", [
    ("127.0.0.1:50051", ("tcp", "127.0.0.1", 50051)),
    ("dns:///gpu-host:1", ("tcp", "gpu-host", 1)),
    ("ipv4:127.0.0.1:2,127.0.0.2:2", ("tcp", "127.0.0.1", 2)),
    ("[::1]:3", ("tcp", "::1", 3)),
    ("ipv6:[::1]:4", ("tcp", "::1", 4)),
    ("unix:/run/gx.sock", ("unix", "/run/gx.sock")),
    ("unix:///run/gx.sock", ("unix", "/run/gx.sock")),
    ("unix-abstract:gx", None),
    ("gpu-host", None),
    ("::1", None),
    ("host:port", None),
])
def test_targets_the_probe_understands(target, parsed):
    assert parse_target(target) == parsed


def test_the_example_takes_its_target_from_the_environment(daemon, tmp_path):
    """examples/saxpy.py: --target defaults to $GPUEXEC_TARGET."""
    example = os.path.join(EXAMPLES, "saxpy.py")
    env = dict(os.environ, GPUEXEC_TARGET=daemon.target)
    result = subprocess.run([sys.executable, example, "--cubin", daemon.cubin, "--kernel",
                             "gx_saxpy"], capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("saxpy on 1048576 floats: "), result.stdout
    # Without --cubin: the image shipped with the C++ client's examples
    # (which the test double runs too).
    shipped = os.path.join(EXAMPLES, os.pardir, os.pardir, "cpp", "examples", "saxpy.cubin")
    if os.path.exists(shipped):
        result = subprocess.run([sys.executable, example], capture_output=True, text=True,
                                timeout=120, env=env)
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith("saxpy on 1048576 floats: "), result.stdout
    # Nothing there: the error names the target the environment gave.
    env["GPUEXEC_TARGET"] = f"unix:{tmp_path}/none.sock"
    result = subprocess.run([sys.executable, example, "--cubin", daemon.cubin], text=True,
                            capture_output=True, timeout=120, env=env)
    assert result.returncode != 0
    assert result.stderr.strip().splitlines()[-1] == (
        f"UNAVAILABLE: gpuexec: cannot connect to unix:{tmp_path}/none.sock: no such socket: is "
        f"gpuexecd running? {HINT}"), result.stderr


def test_each_public_object_has_a_repr(client, daemon):
    assert repr(client) == f"<gpuexec.Client {daemon.target}, {client.command_stream} stream>"
    with client.session() as s:
        assert repr(s) == f"<gpuexec.Session {s.token[:8]} on device {s.device}>"
        buf = s.alloc(64)
        assert repr(buf) == f"<gpuexec.Buffer 0x{buf.handle:x} uint8[64], session {s.token[:8]}>"
        module = s.load_module(daemon.cubin)
        assert repr(module) == f"<gpuexec.Module {module.sha256[:12]} (cubin)>"
        fill = module.function("gx_fill_u32")
        assert repr(fill) == "<gpuexec.Function gx_fill_u32, 3 params>"


def test_the_package_says_it_is_typed():
    assert os.path.isfile(os.path.join(os.path.dirname(gpuexec.__file__), "py.typed"))
