"""A real gpuexecd for the tests, on the driver the environment names.

GPUEXEC_DAEMON       the gpuexecd binary
GPUEXEC_TEST_DRIVER  the driver library it opens (the test double, or libcuda.so.1)
GPUEXEC_TEST_KERNELS the directory with gx_kernels.cubin for that driver

Where the daemon has no usable device, or the environment is incomplete,
every test is skipped with a reason that starts "gpuexec-tests-skipped".
"""

import os
import subprocess
import tempfile
import time

import grpc
import pytest

import gpuexec

SKIP = "gpuexec-tests-skipped"
# The daemon may hold this much device memory in all (see test_memory_freed).
DAEMON_MEMORY_LIMIT = 64 << 20
READY_TIMEOUT_S = 30


class Daemon:
    def __init__(self, target, kernels, process, log_path):
        self.target = target
        self.kernels = kernels
        self.process = process
        self.log_path = log_path

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


@pytest.fixture(scope="session")
def daemon():
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
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [env["GPUEXEC_DAEMON"], f"--driver={env['GPUEXEC_TEST_DRIVER']}", "--listen=",
             f"--unix_socket={socket}", f"--daemon_memory_limit={DAEMON_MEMORY_LIMIT}"],
            stdout=log, stderr=subprocess.STDOUT)
    d = Daemon(f"unix:{socket}", kernels, process, log_path)
    try:
        # Wait for the socket to accept a connection, with a deadline; stop
        # early if the daemon exits.
        channel = grpc.insecure_channel(d.target, options=[
            ("grpc.initial_reconnect_backoff_ms", 50), ("grpc.min_reconnect_backoff_ms", 50),
            ("grpc.max_reconnect_backoff_ms", 250)])
        ready = grpc.channel_ready_future(channel)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            try:
                ready.result(timeout=0.25)
                break
            except grpc.FutureTimeoutError:
                if process.poll() is not None:
                    pytest.fail(f"gpuexecd exited with {process.returncode}:\n{d.log()}")
                if time.monotonic() > deadline:
                    pytest.fail(f"gpuexecd not serving after {READY_TIMEOUT_S} s:\n{d.log()}")
        channel.close()
        with gpuexec.connect(d.target) as client:
            if not [dev for dev in client.devices() if dev.healthy]:
                pytest.skip(f"{SKIP}: no usable device on driver {env['GPUEXEC_TEST_DRIVER']}")
        yield d
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        tmp.cleanup()


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
