#!/usr/bin/env python3
"""The README's walk-through in Python: y = a*x + y on the daemon's GPU.

    python3 saxpy.py [--target 127.0.0.1:50051] [--cubin saxpy.cubin]
"""
import argparse

import numpy as np

import gpuexec

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--target", default="127.0.0.1:50051")
parser.add_argument("--cubin", default="saxpy.cubin")
parser.add_argument("--kernel", default="saxpy")
args = parser.parse_args()

n = 1 << 20
x = np.arange(n, dtype=np.float32)
y = np.ones(n, dtype=np.float32)

with gpuexec.connect(args.target) as client, client.session() as session:
    saxpy = session.load_module(args.cubin).function(args.kernel)
    dx, dy = session.upload(x), session.upload(y)        # device buffers, freed with the session
    session.synchronize()                                # so the launch's GPU time is its own
    seconds = saxpy.launch((n + 255) // 256, 256,        # grid, block
                           np.float32(2.0), dx, dy, np.uint64(n), sync=True)
    result = dy.read_array()                             # numpy float32, shape (n,)

assert np.array_equal(result, 2 * x + y)
print(f"saxpy on {n} floats: {seconds * 1e3:.3f} ms of GPU time; y[:4] = {result[:4]}")
