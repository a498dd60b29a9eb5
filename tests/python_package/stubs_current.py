#!/usr/bin/python3
"""The committed gRPC stubs (client/python/gpuexec/v1/gpuexec_pb2*.py) are
what scripts/regenerate-python-stubs.sh makes from the .proto now.

    stubs_current.py PROTOC GRPC_PYTHON_PLUGIN

Regenerates them into a temporary directory and compares:
  - the serialized descriptor each gpuexec_pb2.py embeds (the .proto's
    content, whichever protoc wrote it): a difference is a .proto changed
    without regenerating, and fails;
  - both files byte for byte: a difference with protoc 3.21 (the committed
    stubs' generator, Debian 12's) fails; with another protoc, whose code
    differs anyway, the test reports SKIPPED once the descriptors agree.
"""

import ast
import difflib
import os
import re
import subprocess
import sys
import tempfile

import pkgtest

GENERATOR = "libprotoc 3.21."
FILES = ("gpuexec_pb2.py", "gpuexec_pb2_grpc.py")
REGENERATE = "scripts/regenerate-python-stubs.sh"

if len(sys.argv) != 3:
    sys.exit(__doc__)
protoc, plugin = sys.argv[1], sys.argv[2]
if not plugin or plugin.endswith("NOTFOUND") or not os.access(plugin, os.X_OK):
    pkgtest.skip("grpc_python_plugin not found (Debian: protobuf-compiler-grpc, which "
                 "scripts/setup.sh installs): the stubs cannot be regenerated to compare")
version = subprocess.run([protoc, "--version"], capture_output=True, text=True).stdout.strip()


def embedded_descriptor(path):
    """The serialized FileDescriptorProto that gpuexec_pb2.py passes to
    AddSerializedFile(b'...')."""
    with open(path) as f:
        m = re.search(r"AddSerializedFile\((b'.*?')\)\n", f.read())
    if not m:
        pkgtest.fail(f"{path} has no AddSerializedFile(b'...'): is it protoc's output? "
                     f"Regenerate it: {REGENERATE}")
    return ast.literal_eval(m.group(1))


with tempfile.TemporaryDirectory(prefix="gpuexec-stubs-") as tmp:
    run = subprocess.run([os.path.join(pkgtest.ROOT, REGENERATE), tmp],
                         env=dict(os.environ, PROTOC=protoc, GRPC_PYTHON_PLUGIN=plugin),
                         capture_output=True, text=True)
    if run.returncode != 0:
        pkgtest.fail(f"{REGENERATE} failed ({run.returncode}):\n{run.stdout}{run.stderr}")
    fresh = {f: os.path.join(tmp, "gpuexec", "v1", f) for f in FILES}
    committed = {f: os.path.join(pkgtest.PACKAGE_SOURCE, "gpuexec", "v1", f) for f in FILES}

    if embedded_descriptor(fresh["gpuexec_pb2.py"]) != embedded_descriptor(
            committed["gpuexec_pb2.py"]):
        pkgtest.fail("client/python/gpuexec/v1/gpuexec_pb2.py does not describe "
                     "proto/gpuexec/v1/gpuexec.proto as it is now (the .proto changed since the "
                     f"stubs were generated): run {REGENERATE} (with {GENERATOR}x, Debian 12's "
                     "protoc) and commit client/python/gpuexec/v1/")
    differ = []
    for f in FILES:
        with open(fresh[f]) as a, open(committed[f]) as b:
            new, old = a.read(), b.read()
        if new != old:
            diff = difflib.unified_diff(old.splitlines(True), new.splitlines(True),
                                        f"committed {f}", f"regenerated {f}", n=1)
            differ.append((f, "".join(list(diff)[:40])))
if differ and not version.startswith(GENERATOR):
    pkgtest.skip(f"the committed stubs come from {GENERATOR}x, this protoc is {version!r}, whose "
                 "code differs: compared the descriptors only, which match the .proto")
if differ:
    pkgtest.fail("the committed stubs are not what the generator makes now; run "
                 f"{REGENERATE} and commit client/python/gpuexec/v1/:\n" +
                 "\n".join(d for _, d in differ))
pkgtest.ok(f"client/python/gpuexec/v1/{{{', '.join(FILES)}}} are {version}'s output for the "
           ".proto, byte for byte")
