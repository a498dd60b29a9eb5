#!/usr/bin/python3
"""Checks the layering of gpuexec's sources (docs/architecture.md, "Layers"):
which part may include which, that the driver's declarations (the project's
own server/cuda/cuda_api.h, or a toolkit's <cuda.h>) stay in server/cuda (and
the driver double, and the test that checks the one against the other), and
that nothing of gRPC or of the
public protocol reaches below server/rpc. Prints each offending include with
its file and line and the rule it breaks; exits 1 if there is one.

  /usr/bin/python3 scripts/check_layering.py [REPO_ROOT]
"""

import os
import re
import sys

# What each part of the daemon may include of the project's own headers
# (besides its own). A file's part is the longest prefix of its path here.
ALLOWED = {
    "server/common": [],
    "server/port": ["server/common"],
    "server/shm": ["server/common"],
    "server/cuda": ["server/common", "server/port"],
    "server/device": ["server/common", "server/port", "server/cuda"],
    # The front's side of the worker: the proxy, its channel and wire.
    "server/worker": ["server/common", "server/port", "server/shm", "server/worker/answer_areas.h",
                      "server/worker/channel.h",
                      "server/worker/convert.h", "server/worker/remote_device.h",
                      "server/worker/remote_device_internal.h", "server/worker/ring.h",
                      "server/worker/request_reader.h", "server/worker/sandbox.h", "server/worker/worker_main.h",
                      "server/worker/worker.pb.h"],
    # The worker's own side: its main owns the device.
    "server/worker/worker_main.cc": ["server/common", "server/port", "server/shm", "server/cuda",
                                     "server/device", "server/worker"],
    "server/worker/request_handler.cc": ["server/common", "server/port", "server/shm", "server/cuda",
                                         "server/device", "server/worker"],
    "server/worker/request_handler.h": ["server/common", "server/port", "server/shm", "server/cuda",
                                        "server/device", "server/worker"],
    "server/core": ["server/common", "server/port", "server/shm"],
    "server/tenants": ["server/common", "server/core", "gpuexec/config/"],
    "server/metrics": ["server/common"],
    # The compile process and its front: NVRTC's declarations stay here.
    "server/compile": ["server/common", "server/shm/region_fd.h"],
    # The composition root and the gRPC layer: everything above the driver.
    "server/rpc": ["server/common", "server/port", "server/shm", "server/core", "server/tenants",
                   "server/metrics", "server/compile/compile_service.h",
                   "server/compile/compile_request.h", "server/compile/compiler.h",
                   "server/compile/compile_sandbox.h", "server/worker/remote_device.h",
                   "server/worker/worker_main.h", "gpuexec/"],
    "server/main.cc": ["server/common", "server/rpc", "server/tenants", "server/compile/compile_main.h",
                       "server/worker/sandbox.h", "server/worker/worker_main.h"],
    # Clients know the protocol, never the daemon.
    "client": ["gpuexec/", "client/"],
}

# Headers of the project's own small libraries, free of gRPC and of the
# driver, that any part may use.
ANYWHERE = ["gpuexec/sha256.h", "gpuexec/half.h", "gpuexec/version.h",
            "gpuexec/command_ring.h"]

# Parts that must not see gRPC, or the public protocol's messages.
NO_GRPC = ["server/common", "server/port", "server/cuda", "server/device", "server/worker",
           "server/core", "server/tenants", "server/metrics", "server/compile"]
NO_PUBLIC_PROTO = NO_GRPC
# Where the driver's declarations may be included: the project's own
# (server/cuda/cuda_api.h, and the entry-point table built on it) or a
# toolkit's. Only the check of cuda_api.h sees both.
CUDA_HEADERS = ("cuda_api.h", "driver_api_internal.h", "cuda.h", "cudaTypedefs.h",
                "cuda_runtime.h", "cuda_runtime_api.h")
CUDA_ALLOWED = ["server/cuda", "tests/fake_cuda", "tests/unit/cuda_api_test.cc"]
# NVRTC's declarations likewise: the project's own (server/compile/nvrtc_api.h)
# in the compile process, the NVRTC double, the check of the header, and the
# benchmark's baseline (NVRTC called in the benchmark's own process).
NVRTC_HEADERS = ("nvrtc_api.h", "nvrtc.h")
NVRTC_ALLOWED = ["server/compile", "tests/fake_nvrtc", "tests/unit/nvrtc_api_test.cc",
                 "bench/compile.cc"]

SOURCES = ("server", "client/cpp", "tests", "bench")
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')


def part_of(path, table):
    best = None
    for prefix in table:
        if path == prefix or path.startswith(prefix.rstrip("/") + "/"):
            if best is None or len(prefix) > len(best):
                best = prefix
    return best


def may_include(part, inc):
    if inc in ANYWHERE:
        return True
    rules = ALLOWED[part]
    # A directory's files may include each other; the worker's proxy only
    # the headers named (the worker's own side is worker_main.cc's).
    if not part.endswith((".cc", ".h")) and part != "server/worker":
        if inc.startswith(part + "/"):
            return True
    for r in rules:
        if r.endswith("/"):
            if inc.startswith(r):
                return True
        elif r.endswith(".h"):
            if inc == r:
                return True
        elif inc.startswith(r + "/"):
            return True
    return False


def check_file(root, path):
    problems = []
    with open(os.path.join(root, path), encoding="utf-8", errors="replace") as f:
        lines = f.readlines()
    part = part_of(path, ALLOWED)
    below_rpc = part_of(path, NO_GRPC)
    for n, line in enumerate(lines, 1):
        m = INCLUDE.match(line)
        if not m:
            continue
        kind, inc = m.groups()
        where = f"{path}:{n}: includes {kind}{inc}{'>' if kind == '<' else kind}"
        if os.path.basename(inc) in CUDA_HEADERS and part_of(path, CUDA_ALLOWED) is None:
            problems.append(f"{where}: the driver's declarations belong in server/cuda only")
            continue
        if os.path.basename(inc) in NVRTC_HEADERS and part_of(path, NVRTC_ALLOWED) is None:
            problems.append(f"{where}: NVRTC's declarations belong in server/compile only")
            continue
        if below_rpc is not None:
            if inc.startswith(("grpcpp/", "grpc/", "grpc++/")) or inc.endswith(".grpc.pb.h"):
                problems.append(f"{where}: nothing of gRPC below server/rpc ({below_rpc})")
                continue
            if inc.startswith("gpuexec/v1/"):
                problems.append(f"{where}: the public protocol's messages stay in server/rpc "
                                f"and above ({below_rpc})")
                continue
        if kind != '"' or part is None:
            continue
        if not inc.startswith(("server/", "client/", "gpuexec/")):
            continue  # third-party, or generated beside the file
        if not may_include(part, inc):
            rules = ALLOWED[part]
            may = ", ".join(rules) if rules else "nothing else of the project's"
            problems.append(f"{where}: {part} may include its own headers and {may}")
    return problems


def main(argv):
    root = os.path.abspath(argv[1] if len(argv) > 1 else
                           os.path.join(os.path.dirname(__file__), ".."))
    problems = []
    files = 0
    for top in SOURCES:
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, top)):
            dirnames[:] = [d for d in dirnames if d not in ("node_modules", "__pycache__")]
            for name in sorted(filenames):
                if not name.endswith((".h", ".cc", ".cu")):
                    continue
                path = os.path.relpath(os.path.join(dirpath, name), root)
                files += 1
                problems.extend(check_file(root, path))
    for p in problems:
        print(p)
    if problems:
        print(f"check_layering: {len(problems)} include(s) break the layering "
              f"(docs/architecture.md, \"Layers\")")
        return 1
    print(f"check_layering: {files} files, the layering holds")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
