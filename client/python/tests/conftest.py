"""A real gpuexecd for the tests, on the driver the environment names.

GPUEXEC_DAEMON       the gpuexecd binary
GPUEXEC_TEST_DRIVER  the driver library it opens (the test double, or libcuda.so.1)
GPUEXEC_TEST_KERNELS the directory with gx_kernels.cubin for that driver
GPUEXEC_TEST_SKIP    if set, why this backend cannot serve (set by the build)
GPUEXEC_TEST_NVRTC   if set, the NVRTC library the daemon compiles with
                     (gpuexecd --nvrtc; the build names the NVRTC double);
                     without it the tests of kernels from source skip

Where the daemon has no usable device, or the environment is incomplete,
every test is skipped with a reason that starts "gpuexec-tests-skipped".
"""

import os
import re
import subprocess
import tempfile
import time

import pytest

import gpuexec

SKIP = "gpuexec-tests-skipped"
# The daemon may hold this much device memory in all (see test_memory_freed).
DAEMON_MEMORY_LIMIT = 64 << 20
READY_TIMEOUT_S = 30


class Daemon:
    def __init__(self, target, kernels, process, log_path, binary, driver, nvrtc=None):
        self.target = target
        self.kernels = kernels
        self.process = process
        self.log_path = log_path
        # What started it, for tests that start daemons of their own.
        self.binary = binary
        self.driver = driver
        # The NVRTC library given with --nvrtc; None when none was.
        self.nvrtc = nvrtc

    def log(self):
        with open(self.log_path, errors="replace") as f:
            return f.read()

    @property
    def cubin(self):
        return os.path.join(self.kernels, "gx_kernels.cubin")

    @property
    def is_test_double(self):
        with open(self.cubin, "rb") as f:
            return f.read(7) == b"GXFAKE1"


# The line gpuexecd logs once all its listeners accept connections.
SERVING = re.compile(r"gpuexecd serving gpuexec\.v1 on (.+?) with ")


def start_daemon(binary, args, log_path, env=None):
    """Runs gpuexecd with ``args`` (and ``env`` added to the environment),
    its output in ``log_path``; returns the process and the addresses it
    serves on once it logs them (a TCP port 0 is the port it got). Fails the
    test if it exits or takes too long."""
    with open(log_path, "wb") as log:
        process = subprocess.Popen([binary] + list(args), stdout=log, stderr=subprocess.STDOUT,
                                   env=dict(os.environ, **(env or {})))
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        with open(log_path, errors="replace") as f:
            text = f.read()
        m = SERVING.search(text)
        if m:
            return process, m.group(1).split(" and ")
        if process.poll() is not None:
            pytest.fail(f"gpuexecd exited with {process.returncode}:\n{text}")
        if time.monotonic() > deadline:
            stop_daemon(process)
            pytest.fail(f"gpuexecd not serving after {READY_TIMEOUT_S} s:\n{text}")
        time.sleep(0.05)


def stop_daemon(process):
    process.terminate()
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@pytest.fixture(scope="session")
def daemon():
    if os.environ.get("GPUEXEC_TEST_SKIP"):
        pytest.skip(f"{SKIP}: {os.environ['GPUEXEC_TEST_SKIP']}")
    env = {k: os.environ.get(k) for k in
           ("GPUEXEC_DAEMON", "GPUEXEC_TEST_DRIVER", "GPUEXEC_TEST_KERNELS")}
    missing = [k for k, v in env.items() if not v]
    if missing:
        pytest.skip(f"{SKIP}: {', '.join(missing)} not set")
    kernels = env["GPUEXEC_TEST_KERNELS"]
    if not os.path.exists(os.path.join(kernels, "gx_kernels.cubin")):
        pytest.skip(f"{SKIP}: no test kernels in {kernels}")
    tmp = tempfile.TemporaryDirectory(prefix="gpuexec-pytest-")
    socket = os.path.join(tmp.name, "d.sock")
    log_path = os.path.join(tmp.name, "gpuexecd.log")
    nvrtc = os.environ.get("GPUEXEC_TEST_NVRTC") or None
    args = [f"--driver={env['GPUEXEC_TEST_DRIVER']}", "--listen=", f"--unix_socket={socket}",
            f"--daemon_memory_limit={DAEMON_MEMORY_LIMIT}"]
    if nvrtc:
        args.append(f"--nvrtc={nvrtc}")
    process, _ = start_daemon(env["GPUEXEC_DAEMON"], args, log_path)
    d = Daemon(f"unix:{socket}", kernels, process, log_path, env["GPUEXEC_DAEMON"],
               env["GPUEXEC_TEST_DRIVER"], nvrtc)
    try:
        with gpuexec.connect(d.target) as client:
            if not [dev for dev in client.devices() if dev.healthy]:
                pytest.skip(f"{SKIP}: no usable device on driver {env['GPUEXEC_TEST_DRIVER']}")
        yield d
    finally:
        stop_daemon(process)
        tmp.cleanup()


@pytest.fixture(autouse=True)
def no_credentials_from_the_environment(monkeypatch):
    """Tests name their credentials: none come from the caller's environment."""
    for name in ("GPUEXEC_TOKEN", "GPUEXEC_TLS_CA", "GPUEXEC_TLS_CERT", "GPUEXEC_TLS_KEY"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def client(daemon):
    with gpuexec.connect(daemon.target) as c:
        yield c


@pytest.fixture
def session(client):
    with client.session() as s:
        yield s


@pytest.fixture
def kernels(session, daemon):
    """The gx_kernels module loaded in ``session``."""
    return session.load_module(daemon.cubin)
