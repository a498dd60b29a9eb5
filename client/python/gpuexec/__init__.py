"""Python client of gpuexec: run CUDA kernels on a remote daemon's GPUs.

    import gpuexec, numpy as np
    with gpuexec.connect("127.0.0.1:50051") as client, client.session() as s:
        x = s.upload(np.arange(n, dtype=np.float32))
        y = s.upload(np.ones(n, dtype=np.float32))
        saxpy = s.load_module("saxpy.cubin").function("saxpy")
        saxpy.launch((n + 255) // 256, 256, gpuexec.f32(2.0), x, y, gpuexec.u64(n))
        print(y.read_array())              # waits for the kernel (same stream)

Kernels from source: ``s.compile(cuda_source)`` has the daemon compile
CUDA C++ (NVRTC) and load it (a gpuexec.CompiledModule);
``gpuexec.RawKernel(source, "saxpy")`` compiles on first use per session
and launches as ``saxpy(s, grid, block, args)``.

A kernel's CUtensorMap parameter takes a gpuexec.TensorMap (a buffer and
the map's shape; the daemon encodes it). Every failure raises gpuexec.Error
(.code: grpc.StatusCode, .message: the daemon's message). numpy is
optional: without it data is bytes.

A pool of daemons: ``gpuexec.connect("pool://gpuexec-pool.gpu.svc:50051")``
gives a gpuexec.Pool, whose ``session(memory_limit=...)`` places the session
on the daemon where it fits best.
"""

import os as _os

# gRPC's C core logs each failed connection attempt (a TLS handshake's,
# say) to stderr; connect() raises what went wrong in one line instead.
# grpcio reads GRPC_VERBOSITY once, when it is first imported: a program's
# own setting, or an import of grpc before this package's, wins.
_os.environ.setdefault("GRPC_VERBOSITY", "NONE")

from ._args import (Arg, bf16, f16, f32, f64, i8, i16, i32, i64, null, ptr, raw, u8, u16, u32,
                    u64)
from ._buffer import Buffer
from ._client import Client, Device, Session
from ._compile import CompiledModule, RawKernel
from ._dtype import (DType, bfloat16, bool_, dtype, float16, float32, float64, int8, int16, int32,
                     int64, uint8, uint16, uint32, uint64)
from ._function import Function, FunctionAttributes, Module, Param
from ._graph import Graph
from ._open import connect
from ._errors import Error
from ._host_memory import HostMemory
from ._pool import Pool, PoolDaemon
from ._tensor_map import TensorMap
from ._transfer import In, InOut, Out
from ._version import __version__  # the project's version (test python_version_current)
from ._version_check import VersionWarning

__all__ = [
    "Arg", "Buffer", "Client", "CompiledModule", "Device", "Error", "Function", "FunctionAttributes", "Graph", "HostMemory",
    "In", "InOut", "Module", "Out", "Param", "Pool", "PoolDaemon", "RawKernel", "Session", "TensorMap",
    "VersionWarning", "bf16",
    "connect", "f16", "f32", "f64", "i8", "i16", "i32", "i64", "null", "ptr", "raw", "u8", "u16",
    "u32", "u64",
    "DType", "bfloat16", "bool_", "dtype", "float16", "float32", "float64", "int8", "int16",
    "int32", "int64", "uint8", "uint16", "uint32", "uint64", "__version__",
]
