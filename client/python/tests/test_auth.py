"""Tenants and identity: the Python client's token, TLS and client
certificates against gpuexecd daemons with a tenants file (see conftest.py).

The certificates are made here with the `openssl` command: a CA, the
daemon's certificate (for 127.0.0.1 and localhost), a client certificate
naming tenant team-a, one naming no tenant, and a CA that signed nothing
the daemon has.
"""

import copy
import hashlib
import secrets
import shutil
import subprocess
import time
from types import SimpleNamespace

import grpc
import numpy as np
import pytest

import gpuexec
from gpuexec._channel import is_local_target
from gpuexec._commands import CommandStream
from gpuexec._session_commands import SessionCommands
from conftest import start_daemon, stop_daemon

MiB = 1 << 20

# Not the reason that marks the whole run skipped (conftest.SKIP): without
# openssl only the tests that need certificates are skipped.
NO_OPENSSL = "openssl not found: no certificates for the TLS tests"

_CNF = """\
[req]
distinguished_name = dn
prompt = no
[dn]
CN = gpuexec test CA
[ca]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
"""


def _openssl(cwd, *args):
    result = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if result.returncode != 0:
        pytest.fail(f"openssl {' '.join(args)} failed:\n{result.stderr}")


def _new_ca(d, name):
    _openssl(d, "req", "-x509", "-new", "-newkey", "ec", "-pkeyopt",
             "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", f"{name}.key", "-out",
             f"{name}.crt", "-days", "2", "-config", "openssl.cnf", "-extensions", "ca",
             "-subj", f"/CN={name}")
    return d / f"{name}.crt"


def _issue(d, ca, name, extensions, serial):
    """A certificate for ``name`` signed by ``ca`` with these X.509v3
    extensions (the -extfile, written here): (crt, key) paths."""
    _openssl(d, "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr", "-config",
             "openssl.cnf", "-subj", f"/CN={name}")
    (d / f"{name}.ext").write_text(
        "basicConstraints = CA:FALSE\n"
        "authorityKeyIdentifier = keyid\n" + "".join(f"{line}\n" for line in extensions))
    _openssl(d, "x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey",
             f"{ca}.key", "-set_serial", str(serial), "-days", "2", "-out", f"{name}.crt",
             "-extfile", f"{name}.ext")
    return d / f"{name}.crt", d / f"{name}.key"


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    if shutil.which("openssl") is None:
        pytest.skip(NO_OPENSSL)
    d = tmp_path_factory.mktemp("pki")
    (d / "openssl.cnf").write_text(_CNF)
    ca = _new_ca(d, "ca")
    rogue_ca = _new_ca(d, "rogue-ca")
    server = _issue(d, "ca", "server", ["subjectAltName = IP:127.0.0.1, DNS:localhost",
                                         "keyUsage = critical, digitalSignature",
                                         "extendedKeyUsage = serverAuth"], 2)
    client_usage = ["keyUsage = critical, digitalSignature", "extendedKeyUsage = clientAuth"]
    client = _issue(d, "ca", "team-a-client",
                    ["subjectAltName = DNS:team-a.clients"] + client_usage, 3)
    stranger = _issue(d, "ca", "stranger", ["subjectAltName = DNS:nobody.clients"] + client_usage,
                      4)
    token_a, token_b = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
    tenants = d / "tenants.textproto"

    def digest(token):
        return hashlib.sha256(token.encode()).hexdigest()

    tenants.write_text(
        f'tenant {{ name: "team-a" token_sha256: "{digest(token_a)}" '
        f'certificate_name: "team-a.clients" }}\n'
        f'tenant {{ name: "team-b" token_sha256: "{digest(token_b)}" }}\n')
    return SimpleNamespace(dir=d, ca=ca, rogue_ca=rogue_ca, server=server, client=client,
                           stranger=stranger, token_a=token_a, token_b=token_b, tenants=tenants)


def _tenant_daemon(daemon, pki, tmp_path_factory, name, *flags):
    d = tmp_path_factory.mktemp(name)
    socket = d / "d.sock"
    process, addresses = start_daemon(
        daemon.binary, [f"--driver={daemon.driver}", "--listen=127.0.0.1:0",
                        f"--tenants={pki.tenants}", f"--unix_socket={socket}", *flags],
        d / "gpuexecd.log")
    tcp = [a for a in addresses if not a.startswith("unix:")]
    assert len(tcp) == 1, addresses
    return process, SimpleNamespace(target=tcp[0], unix=f"unix:{socket}", log=d / "gpuexecd.log")


@pytest.fixture(scope="module")
def tls_daemon(daemon, pki, tmp_path_factory):
    """TLS on TCP, no client certificates: tokens name the tenants."""
    process, d = _tenant_daemon(daemon, pki, tmp_path_factory, "tls",
                                f"--tls_cert={pki.server[0]}", f"--tls_key={pki.server[1]}")
    yield d
    stop_daemon(process)


@pytest.fixture(scope="module")
def mtls_daemon(daemon, pki, tmp_path_factory):
    """Mutual TLS: every TCP client presents a certificate the CA signed."""
    process, d = _tenant_daemon(daemon, pki, tmp_path_factory, "mtls",
                                f"--tls_cert={pki.server[0]}", f"--tls_key={pki.server[1]}",
                                f"--tls_client_ca={pki.ca}")
    yield d
    stop_daemon(process)


@pytest.fixture(scope="module")
def plain_daemon(daemon, pki, tmp_path_factory):
    """Tenants on plain TCP on loopback: the token travels in clear on this host."""
    process, d = _tenant_daemon(daemon, pki, tmp_path_factory, "plain")
    yield d
    stop_daemon(process)


def _saxpy_cycle(client, cubin):
    """Everything a client does, streams included: a session, a module load,
    uploads (Allocate and Write), a launch, reads back (Read), frees.
    Returns the session's token."""
    n = 300000
    x = np.arange(n, dtype=np.float32)
    y = np.full(n, 1.0, dtype=np.float32)
    with client.session() as s:
        saxpy = s.load_module(cubin).function("gx_saxpy")
        xb, yb = s.upload(x), s.upload(y)
        saxpy.launch((n + 255) // 256, 256, gpuexec.f32(2.0), xb, yb, gpuexec.u64(n), sync=True)
        np.testing.assert_array_equal(yb.read_array(), 2.0 * x + 1.0)
        out = np.empty(n, dtype=np.float32)
        yb.read_into(out)
        np.testing.assert_array_equal(out, 2.0 * x + 1.0)
        xb.free()
        yb.free()
        return s.token


def _health(channel):
    """grpc.health.v1 Check of the whole server: b"\\x08\\x01" is SERVING."""
    return channel.unary_unary("/grpc.health.v1.Health/Check")(b"", timeout=10)


def _borrow(client, session):
    """``session`` (opened by another client) as seen from ``client``."""
    other = copy.copy(session)
    other.client = client
    other._closed = False
    # Its own commands, through `client` (on its stream: a ring would be
    # registered on the host memory socket, outside gRPC's credentials).
    other._commands = SessionCommands(CommandStream(client, session.token), None)
    return other


def _unauthenticated(call, *patterns):
    with pytest.raises(gpuexec.Error) as e:
        call()
    assert e.value.code == grpc.StatusCode.UNAUTHENTICATED, e.value
    for p in patterns:
        assert p in e.value.message, e.value
    return e.value


# ------------------------------------------------------------------ TLS, tokens


def test_token_over_tls_end_to_end(daemon, tls_daemon, pki):
    with gpuexec.connect(tls_daemon.target, token=pki.token_a, root_ca=pki.ca) as c:
        assert c.devices()[0].healthy
        _saxpy_cycle(c, daemon.cubin)


def test_root_ca_and_client_files_may_be_pem_bytes(daemon, tls_daemon, mtls_daemon, pki):
    with gpuexec.connect(tls_daemon.target, token=pki.token_b,
                         root_ca=pki.ca.read_bytes()) as c:
        c.session().close()
    with gpuexec.connect(mtls_daemon.target, root_ca=pki.ca.read_bytes(),
                         cert=pki.client[0].read_bytes(), key=pki.client[1].read_bytes()) as c:
        c.session().close()


def test_no_token_is_unauthenticated(daemon, tls_daemon, pki):
    with gpuexec.connect(tls_daemon.target, root_ca=pki.ca) as c:
        _unauthenticated(c.session, "no credentials")
        _unauthenticated(c.devices, "no credentials")
        # Health answers anyone.
        assert _health(c.channel) == b"\x08\x01"
        # Streams need the token too: a session opened with one is no use
        # to a client without it.
        with gpuexec.connect(tls_daemon.target, token=pki.token_a, root_ca=pki.ca) as a:
            with a.session() as s:
                buf = s.upload(b"x" * 1024)
                mine = _borrow(c, s)
                theirs = gpuexec.Buffer(mine, buf.handle, buf.size)
                _unauthenticated(lambda: theirs.write(b"y" * 10), "no credentials")
                _unauthenticated(theirs.read, "no credentials")
                _unauthenticated(lambda: mine.load_module(daemon.cubin), "no credentials")
                assert buf.read() == b"x" * 1024


def test_wrong_token_is_unauthenticated(tls_daemon, plain_daemon, pki):
    for target, tls in ((tls_daemon.target, {"root_ca": pki.ca}), (plain_daemon.target, {})):
        with gpuexec.connect(target, token="not-" + pki.token_a, **tls) as c:
            err = _unauthenticated(c.session, "unknown or revoked bearer token")
            assert pki.token_a not in str(err)
            _unauthenticated(c.devices, "unknown or revoked bearer token")


def test_another_tenants_session_is_not_found(daemon, tls_daemon, pki):
    with gpuexec.connect(tls_daemon.target, token=pki.token_a, root_ca=pki.ca) as a, \
            gpuexec.connect(tls_daemon.target, token=pki.token_b, root_ca=pki.ca) as b, \
            a.session() as s:
        buf = s.upload(b"secret" * 1000)
        stolen = _borrow(b, s)
        theirs = gpuexec.Buffer(stolen, buf.handle, buf.size)
        for call in (lambda: stolen.alloc(64), stolen.keep_alive, stolen.synchronize,
                     theirs.read, lambda: theirs.write(b"mine"), theirs.free,
                     lambda: stolen.load_module(daemon.cubin), stolen.close):
            with pytest.raises(gpuexec.Error) as e:
                call()
            assert e.value.code == grpc.StatusCode.NOT_FOUND, e.value
        # Nothing of it happened to tenant A's session.
        assert buf.read() == b"secret" * 1000
        s.keep_alive()


def test_token_from_the_environment(daemon, tls_daemon, pki, monkeypatch):
    monkeypatch.setenv("GPUEXEC_TOKEN", pki.token_a + "\n")  # as read from a file
    with gpuexec.connect(tls_daemon.target, root_ca=pki.ca) as c:
        _saxpy_cycle(c, daemon.cubin)
    # The root CA too: TLS because $GPUEXEC_TLS_CA names one.
    monkeypatch.setenv("GPUEXEC_TLS_CA", str(pki.ca))
    with gpuexec.connect(tls_daemon.target) as c:
        c.session().close()
    monkeypatch.setenv("GPUEXEC_TARGET", tls_daemon.target)
    with gpuexec.connect() as c:
        c.session().close()
    # An explicit token wins; "" sends none.
    monkeypatch.setenv("GPUEXEC_TOKEN", "not-a-token")
    with gpuexec.connect(tls_daemon.target, token=pki.token_b) as c:
        c.session().close()
    with gpuexec.connect(tls_daemon.target) as c:
        _unauthenticated(c.session, "unknown or revoked bearer token")
    with gpuexec.connect(tls_daemon.target, token="") as c:
        _unauthenticated(c.session, "no credentials")


def test_environment_ca_is_not_used_for_unix_sockets(tls_daemon, pki, monkeypatch):
    monkeypatch.setenv("GPUEXEC_TLS_CA", str(pki.ca))
    monkeypatch.setenv("GPUEXEC_TOKEN", pki.token_a)
    with gpuexec.connect(tls_daemon.unix, timeout=5) as c:
        c.session().close()


def test_token_over_plain_tcp_on_loopback_and_unix(daemon, plain_daemon, tls_daemon, pki):
    assert plain_daemon.target.startswith("127.0.0.1:")
    with gpuexec.connect(plain_daemon.target, token=pki.token_a) as c:
        _saxpy_cycle(c, daemon.cubin)
    with gpuexec.connect(plain_daemon.target) as c:
        _unauthenticated(c.session, "no credentials")
    with gpuexec.connect(tls_daemon.unix, token=pki.token_b) as c:
        _saxpy_cycle(c, daemon.cubin)


def test_tls_needs_the_daemons_ca(tls_daemon, pki):
    for tls in ({"root_ca": pki.rogue_ca}, {"tls": True}):  # the system's roots
        with pytest.raises(gpuexec.Error) as e:
            gpuexec.connect(tls_daemon.target, token=pki.token_a, timeout=1, **tls)
        assert e.value.code == grpc.StatusCode.UNAVAILABLE
        assert "TLS" in e.value.message


# ---------------------------------------------------------- client certificates


def test_client_certificate_names_the_tenant(daemon, mtls_daemon, pki):
    mtls = {"root_ca": pki.ca, "cert": pki.client[0], "key": pki.client[1]}
    with gpuexec.connect(mtls_daemon.target, **mtls) as c:
        token = _saxpy_cycle(c, daemon.cubin)
        s = c.session()
    assert token != s.token
    # The certificate names team-a: team-a's token on top of it is the same
    # tenant, which may use the session the certificate alone opened...
    with gpuexec.connect(mtls_daemon.target, token=pki.token_a, **mtls) as c:
        _borrow(c, s).keep_alive()
    # ...while team-b's is a contradiction.
    with gpuexec.connect(mtls_daemon.target, token=pki.token_b, **mtls) as c:
        _unauthenticated(_borrow(c, s).keep_alive, "different tenants")
        _unauthenticated(c.session, "different tenants")
    # Tenant B reaches the daemon through its Unix socket with its token,
    # and finds no session of A's there.
    with gpuexec.connect(mtls_daemon.unix, token=pki.token_b) as b:
        with pytest.raises(gpuexec.Error) as e:
            _borrow(b, s).keep_alive()
        assert e.value.code == grpc.StatusCode.NOT_FOUND
    with gpuexec.connect(mtls_daemon.target, **mtls) as c:
        _borrow(c, s).close()


def test_certificate_of_no_tenant_is_unauthenticated(mtls_daemon, pki):
    with gpuexec.connect(mtls_daemon.target, root_ca=pki.ca, cert=pki.stranger[0],
                         key=pki.stranger[1]) as c:
        _unauthenticated(c.session, "names no tenant")
    # A token names a tenant where the certificate names none.
    with gpuexec.connect(mtls_daemon.target, root_ca=pki.ca, cert=pki.stranger[0],
                         key=pki.stranger[1], token=pki.token_b) as c:
        c.session().close()


def test_mutual_tls_without_a_certificate_does_not_connect(mtls_daemon, pki):
    with pytest.raises(gpuexec.Error) as e:
        gpuexec.connect(mtls_daemon.target, root_ca=pki.ca, token=pki.token_a, timeout=1)
    assert e.value.code == grpc.StatusCode.UNAVAILABLE


# ---------------------------------------------- refused before any connection


@pytest.mark.parametrize("target", ["192.0.2.1:50051", "gpu-host.example:50051",
                                    "dns:///gpu-host.example:50051", "[2001:db8::1]:50051",
                                    "127.example.com:50051", "0.0.0.0:50051"])
def test_token_over_plain_tcp_to_another_host_is_refused(target, monkeypatch):
    token = secrets.token_urlsafe(16)
    for kwargs in ({"token": token}, {}):
        if not kwargs:
            monkeypatch.setenv("GPUEXEC_TOKEN", token)
        start = time.monotonic()
        with pytest.raises(gpuexec.Error) as e:
            gpuexec.connect(target, timeout=30, **kwargs)
        assert time.monotonic() - start < 5  # refused, not a connection timing out
        assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
        assert "plain TCP" in e.value.message and target in e.value.message
        assert "allow_token_over_plain_tcp" in e.value.message
        assert token not in str(e.value)


def test_token_over_plain_tcp_when_allowed_or_over_tls(pki):
    # Past the check, on to a connection that cannot be made (TEST-NET-1).
    for kwargs in ({"allow_token_over_plain_tcp": True}, {"root_ca": pki.ca}, {"tls": True}):
        with pytest.raises(gpuexec.Error) as e:
            gpuexec.connect("192.0.2.1:50051", token="t", timeout=0.2, **kwargs)
        assert e.value.code == grpc.StatusCode.UNAVAILABLE, e.value


def test_local_targets():
    for t in ("127.0.0.1:50051", "127.4.5.6:1", "localhost:50051", "[::1]:50051",
              "unix:/run/gpuexec.sock", "unix-abstract:gx", "dns:///localhost:50051",
              "ipv4:127.0.0.1:1", "ipv6:[::1]:1"):
        assert is_local_target(t), t
    for t in ("10.0.0.1:50051", "[::2]:1", "0.0.0.0:1", "localhost.example.com:1",
              "127.example.com:1", "dns:///gpu:50051"):
        assert not is_local_target(t), t


def test_bad_tls_arguments_are_invalid(pki, tmp_path):
    cases = [
        ({"cert": pki.client[0]}, "both cert and key"),
        ({"key": pki.client[1]}, "both cert and key"),
        ({"root_ca": tmp_path / "none.pem"}, "none.pem"),
        ({"root_ca": b"not a certificate"}, "not PEM"),
        ({"root_ca": 42}, "path or PEM bytes"),
        ({"tls": False, "root_ca": pki.ca}, "tls=False"),
        ({"token": b"bytes"}, "must be a str"),
        ({"token": "a\nb"}, "line break"),
    ]
    for kwargs, words in cases:
        with pytest.raises(gpuexec.Error) as e:
            gpuexec.connect("127.0.0.1:1", timeout=0.1, **kwargs)
        assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT, (kwargs, e.value)
        assert words in e.value.message, (kwargs, e.value)


def test_tls_false_ignores_the_environment_ca(plain_daemon, pki, monkeypatch):
    monkeypatch.setenv("GPUEXEC_TLS_CA", str(pki.ca))
    with gpuexec.connect(plain_daemon.target, token=pki.token_a, tls=False, timeout=5) as c:
        c.session().close()


def test_a_pool_holds_each_daemon_to_the_name_it_was_found_under(daemon, pki, tmp_path_factory):
    """A pod's certificate names the Service, not the pod's address: a pool
    found under a DNS name checks each daemon against that name."""
    d = pki.dir
    named = _issue(d, "ca", "pool-server", ["subjectAltName = DNS:localhost",
                                            "keyUsage = critical, digitalSignature",
                                            "extendedKeyUsage = serverAuth"], 5)
    process, tls = _tenant_daemon(daemon, pki, tmp_path_factory, "pool-tls",
                                  f"--tls_cert={named[0]}", f"--tls_key={named[1]}")
    try:
        port = tls.target.rsplit(":", 1)[1]
        with gpuexec.connect(f"pool://localhost:{port}", token=pki.token_a,
                             root_ca=pki.ca) as pool:
            with pool.session() as s:
                assert s.daemon == f"127.0.0.1:{port}"
                s.alloc(MiB)
        # Listed by address, the daemon's certificate does not carry it.
        with gpuexec.connect(f"pool://127.0.0.1:{port}", token=pki.token_a,
                             root_ca=pki.ca) as pool:
            with pytest.raises(gpuexec.Error) as e:
                pool.session()
            assert e.value.code == grpc.StatusCode.UNAVAILABLE
            assert "no daemon answered" in e.value.message
    finally:
        stop_daemon(process)
