#!/usr/bin/python3
"""`pip install ./client/python` as a user without a build tree does it.

    pip_install.py PROJECT_VERSION     (GPUEXEC_DAEMON: a gpuexecd to serve it)

From a copy of client/python alone, in a fresh virtual environment that
sees the system's packages (grpcio, protobuf and numpy come from Debian:
pip reaches no index here), it installs the package with
`pip install --no-index --no-build-isolation`, then from a neutral
directory checks that the installed package is the source's (every file of
gpuexec/, py.typed and the stubs in gpuexec/v1 included, the version the
project's), runs the shipped saxpy on `gpuexecd --simulator` through it,
runs stubs_serve.py (the installed stubs serving connect()), and, where
there is mypy, checks typed_usage.py with `mypy --strict` against the
installed package. It also builds the wheel and checks that it is pure Python (py3-none-any)
and carries py.typed and the stubs.
"""

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile

import pkgtest

HERE = os.path.dirname(os.path.abspath(__file__))
SAXPY_CUBIN = os.path.join(pkgtest.ROOT, "client", "cpp", "examples", "saxpy.cubin")
SERVING = re.compile(r"gpuexecd serving gpuexec\.v1 on ")
READY_TIMEOUT_S = 30

# Run by the venv's python, from a neutral directory, with argv: the copy of
# the source, the project's version, the daemon's target, saxpy.cubin.
CHECK = r'''
import filecmp, importlib.metadata, os, sys, sysconfig
source, version, target, cubin = sys.argv[1:]
import gpuexec
package = os.path.dirname(os.path.abspath(gpuexec.__file__))
site = os.path.realpath(sysconfig.get_paths()["purelib"])
assert os.path.realpath(package).startswith(site + os.sep), (
    f"gpuexec imported from {package}, not the venv's {site}")
assert gpuexec.__version__ == version, (gpuexec.__version__, version)
assert importlib.metadata.version("gpuexec") == version, importlib.metadata.version("gpuexec")
for required in ("py.typed", "v1/gpuexec_pb2.py", "v1/gpuexec_pb2_grpc.py", "v1/__init__.py"):
    assert os.path.isfile(os.path.join(package, required)), f"{required} not installed"
# The installed files are the source's, and none is missing.
src = os.path.join(source, "gpuexec")
subpackages = sorted(os.path.relpath(d, src) for d, _, files in os.walk(src) if "__init__.py" in files)
assert "v1" in subpackages, subpackages
for sub in subpackages:
    names = sorted(n for n in os.listdir(os.path.join(src, sub))
                   if n.endswith(".py") or n == "py.typed")
    match, mismatch, errors = filecmp.cmpfiles(os.path.join(src, sub), os.path.join(package, sub),
                                               names, shallow=False)
    assert not mismatch and not errors, f"in gpuexec/{sub}: differ {mismatch}, missing {errors}"
    print(f"installed gpuexec/{sub if sub != '.' else ''}: {len(match)} files, the source's")

import numpy as np
n = 1 << 16
x = np.arange(n, dtype=np.float32)
y = np.ones(n, dtype=np.float32)
with gpuexec.connect(target) as client, client.session() as s:
    dx, dy = s.upload(x), s.upload(y)
    saxpy = s.load_module(cubin).function("saxpy")
    saxpy.launch((n + 255) // 256, 256, gpuexec.f32(2.0), dx, dy, gpuexec.u64(n), sync=True)
    out = dy.read_array()
assert np.array_equal(out, 2 * x + y), out[:8]
print(f"saxpy through the installed gpuexec {gpuexec.__version__}: y[:4] = {out[:4]}")
'''


def run(cmd, **kw):
    """Runs ``cmd``, echoing it (a -c script as "CHECK") and its output;
    fails the test if it fails."""
    print("+", " ".join("CHECK" if a is CHECK else a for a in cmd), flush=True)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)
    print(p.stdout, end="", flush=True)
    if p.returncode != 0:
        pkgtest.fail(f"{cmd[0]} ... {cmd[2] if len(cmd) > 2 else ''} exited with {p.returncode}")
    return p.stdout


def start_simulator(daemon, tmp):
    """gpuexecd --simulator on a Unix socket in ``tmp``; its target once it serves."""
    socket = os.path.join(tmp, "d.sock")
    log_path = os.path.join(tmp, "gpuexecd.log")
    with open(log_path, "wb") as log:
        process = subprocess.Popen([daemon, "--simulator", "--listen=", f"--unix_socket={socket}"],
                                   stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        with open(log_path, errors="replace") as f:
            text = f.read()
        if SERVING.search(text):
            return process, f"unix:{socket}"
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            process.wait()
            pkgtest.fail(f"gpuexecd --simulator did not serve:\n{text}")
        time.sleep(0.05)


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    version = sys.argv[1]
    daemon = os.environ.get("GPUEXEC_DAEMON")
    if not daemon or not os.access(daemon, os.X_OK):
        pkgtest.fail("GPUEXEC_DAEMON does not name a gpuexecd binary (ctest sets it)")
    if importlib.util.find_spec("ensurepip") is None:  # Debian: python3-venv
        pkgtest.skip("this Python cannot make a venv with pip (Debian: python3-venv, which "
                     "scripts/setup.sh installs)")

    with tempfile.TemporaryDirectory(prefix="gpuexec-pip-") as tmp:
        # client/python alone, as a checkout of it or its sdist has it.
        source = os.path.join(tmp, "src", "python")
        shutil.copytree(pkgtest.PACKAGE_SOURCE, source, ignore=shutil.ignore_patterns(
            "__pycache__", "*.pyc", "build", "dist", "*.egg-info", ".mypy_cache"))
        venv = os.path.join(tmp, "venv")
        run([sys.executable, "-m", "venv", "--system-site-packages", venv])
        python = os.path.join(venv, "bin", "python")
        # Nothing of this tree or the build's on the path: only what pip installed.
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
        # pip as it comes: no configuration of this machine's, no index (none is reachable).
        env = {k: v for k, v in env.items() if not k.startswith("PIP_")}
        env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1",
                   PIP_NO_CACHE_DIR="1")
        pip = [python, "-m", "pip"]
        run(pip + ["install", "--no-index", "--no-build-isolation", source], env=env, cwd=tmp)

        wheels = os.path.join(tmp, "wheels")
        run(pip + ["wheel", "--no-index", "--no-build-isolation", "--no-deps", "-w", wheels,
                   source], env=env, cwd=tmp)
        built = os.listdir(wheels)
        expected = f"gpuexec-{version}-py3-none-any.whl"
        if built != [expected]:
            pkgtest.fail(f"pip wheel built {built}, not [{expected!r}] (a pure-Python wheel)")
        with zipfile.ZipFile(os.path.join(wheels, expected)) as whl:
            names = set(whl.namelist())
            metadata = whl.read(f"gpuexec-{version}.dist-info/METADATA").decode()
        for required in ("gpuexec/py.typed", "gpuexec/__init__.py", "gpuexec/_version.py",
                         "gpuexec/v1/gpuexec_pb2.py", "gpuexec/v1/gpuexec_pb2_grpc.py"):
            if required not in names:
                pkgtest.fail(f"the wheel {expected} lacks {required}")
        # setuptools writes "grpcio (>=1.51)" or "grpcio>=1.51", by its version.
        lines = {re.sub(r"[ ()]", "", line) for line in metadata.splitlines()}
        for line in ("Requires-Python: >=3.9", "Requires-Dist: grpcio>=1.51",
                     "Requires-Dist: protobuf>=3.20"):
            if re.sub(r"[ ()]", "", line) not in lines:
                pkgtest.fail(f"the wheel's METADATA lacks {line!r}")
        print(f"wheel {expected}: {len(names)} files, py.typed and the stubs included")

        neutral = os.path.join(tmp, "elsewhere")
        os.mkdir(neutral)
        process, target = start_simulator(daemon, tmp)
        try:
            run([python, "-c", CHECK, source, version, target, SAXPY_CUBIN], env=env, cwd=neutral)
        finally:
            process.terminate()
            process.wait(timeout=20)
        # The installed stubs serve, too (a server of their own, no daemon).
        run([python, os.path.join(HERE, "stubs_serve.py")], env=env, cwd=neutral)
        # A user's program type-checks against the installed package (its
        # py.typed), where this Python has mypy.
        if importlib.util.find_spec("mypy") is not None:
            run([sys.executable, "-m", "mypy", "--strict", "--python-executable", python,
                 "--cache-dir", os.path.join(tmp, "mypy-cache"),
                 os.path.join(HERE, "typed_usage.py")], env=env, cwd=neutral)
            typed = "; a user's program passes mypy --strict against it"
        else:
            print("(no mypy for this Python: typed_usage.py not checked)")
            typed = ""
    pkgtest.ok(f"pip installed gpuexec {version} from client/python alone; it ran saxpy on "
               f"gpuexecd --simulator, and its stubs served{typed}; the wheel is py3-none-any "
               "with py.typed")


main()
