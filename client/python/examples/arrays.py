#!/usr/bin/env python3
"""Buffers as arrays, and kernels called as CuPy and Numba call them.

    python3 arrays.py [--target HOST:PORT | unix:PATH]

Runs the shipped saxpy (client/cpp/examples/saxpy.cubin) on the daemon's
GPU, or on `gpuexecd --simulator`.
"""
import argparse
import os
import sys

import numpy as np

import gpuexec

CUBIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, "cpp",
                     "examples", "saxpy.cubin")
parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--target", default=os.environ.get("GPUEXEC_TARGET") or "127.0.0.1:50051")
args = parser.parse_args()

n = 1 << 16
x = np.arange(n, dtype=np.float32)

try:
    with gpuexec.connect(args.target) as client, client.session() as s:
        saxpy = s.load_module(os.path.normpath(CUBIN)).function("saxpy")
        dx = s.asarray(x)                                # float32[65536] on the device
        dy = s.full(n, 1.0, "float32")
        print("x on the device:", dx.shape, dx.dtype, dx.nbytes, "bytes")
        # CuPy's call: grid, block, a tuple of arguments; queued, no round trip.
        saxpy((n // 256,), (256,), (np.float32(2.0), dx, dy, np.uint64(n)))
        print("y[:4] =", dy[:4].get())                  # a view; get() downloads (waits)
        # Host arrays copied around one launch: x in, y in and out.
        y = np.ones(n, dtype=np.float32)
        saxpy(n // 256, 256, (np.float32(3.0), gpuexec.In(x), gpuexec.InOut(y), np.uint64(n)))
        print("y[:4] =", y[:4])
        # Numba's launch configuration, on views at an offset: y - 2x there is 1 again.
        half = dy[n // 2:]
        saxpy[n // 512, 256](np.float32(-2.0), dx[n // 2:], half, np.uint64(n // 2))
        print("y[n/2:n/2+4] =", half[:4].get())
        try:
            np.asarray(dy)
        except TypeError as e:
            print("np.asarray(buffer):", str(e).split(": ", 1)[1])
except gpuexec.Error as e:
    sys.exit(str(e))
