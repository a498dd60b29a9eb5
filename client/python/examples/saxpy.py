#!/usr/bin/env python3
"""The README's walk-through in Python: y = a*x + y on the daemon's GPU.

    python3 saxpy.py [--target HOST:PORT | unix:PATH] [--cubin saxpy.cubin]

--target defaults to $GPUEXEC_TARGET, else 127.0.0.1:50051; --cubin to the
saxpy.cubin shipped with the C++ client's examples (client/cpp/examples).
"""
import argparse
import os
import sys

import numpy as np

import gpuexec

SHIPPED_CUBIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir,
                             "cpp", "examples", "saxpy.cubin")

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--target", default=os.environ.get("GPUEXEC_TARGET") or "127.0.0.1:50051",
                    help="the daemon (default: $GPUEXEC_TARGET, else %(default)s)")
parser.add_argument("--cubin", default=None,
                    help="the module image (default: client/cpp/examples/saxpy.cubin)")
parser.add_argument("--kernel", default="saxpy")
args = parser.parse_args()
cubin = args.cubin or os.path.normpath(SHIPPED_CUBIN)
if not os.path.exists(cubin):
    sys.exit(f"saxpy.py: no module image at {cubin}: pass --cubin PATH")

n = 1 << 20
x = np.arange(n, dtype=np.float32)
y = np.ones(n, dtype=np.float32)

try:
    with gpuexec.connect(args.target) as client, client.session() as session:
        saxpy = session.load_module(cubin).function(args.kernel)
        dx, dy = session.upload(x), session.upload(y)    # device buffers, freed with the session
        session.synchronize()                            # so the launch's GPU time is its own
        seconds = saxpy.launch((n + 255) // 256, 256,    # grid, block
                               np.float32(2.0), dx, dy, np.uint64(n), sync=True)
        result = dy.read_array()                         # numpy float32, shape (n,)
except gpuexec.Error as e:
    sys.exit(str(e))                                     # one line: the code, then the cause

assert np.array_equal(result, 2 * x + y)
print(f"saxpy on {n} floats: {seconds * 1e3:.3f} ms of GPU time; y[:4] = {result[:4]}")
