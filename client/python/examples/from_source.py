#!/usr/bin/env python3
"""Kernels from source: CUDA C++ the daemon compiles for its own GPU.

    python3 from_source.py [--target HOST:PORT | unix:PATH]

No CUDA toolkit is needed here: the daemon compiles the source with NVRTC
(on the simulator, with its stand-in), once per source. --target defaults
to $GPUEXEC_TARGET, else 127.0.0.1:50051.
"""
import argparse
import os
import sys

import numpy as np

import gpuexec

SAXPY_CU = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir,
                        "cpp", "examples", "saxpy.cu")

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--target", default=os.environ.get("GPUEXEC_TARGET") or "127.0.0.1:50051",
                    help="the daemon (default: $GPUEXEC_TARGET, else %(default)s)")
args = parser.parse_args()
with open(os.path.normpath(SAXPY_CU)) as f:
    source = f.read()

n = 1 << 20
x = np.arange(n, dtype=np.float32)

try:
    with gpuexec.connect(args.target) as client, client.session() as session:
        compiled = session.compile(source, name="saxpy.cu")   # NVRTC, for this session's GPU
        saxpy = compiled.function("saxpy")
        dx, dy = session.upload(x), session.full(n, 1.0, "float32")
        saxpy((n + 255) // 256, 256, (np.float32(2.0), dx, dy, np.uint64(n)), sync=True)
        print("y[:4] =", dy[:4].get())
        again = session.compile(source, name="saxpy.cu")      # the daemon's cache: no compile
        # CuPy's habit: the source and a kernel name, compiled on first use
        # in each session (here, a cache hit too).
        raw = gpuexec.RawKernel(source, "saxpy")
        raw(session, (n + 255) // 256, 256, (np.float32(-2.0), dx, dy, np.uint64(n)))
        result = dy.get()
except gpuexec.Error as e:
    sys.exit(str(e))                                          # a compile error holds NVRTC's log

assert np.array_equal(result, np.ones(n, dtype=np.float32))
print(f"compiled saxpy.cu for {compiled.arch} with NVRTC {compiled.nvrtc_version} in "
      f"{compiled.compile_time * 1e3:.1f} ms; again: {'cached' if again.cached else 'compiled'}")
