"""A user's program, not run but type-checked: pip_install.py runs
`mypy --strict` on it against the installed package (py.typed), so the
public API's hints are what a user's checker reads (and untyped or wrong
ones fail here)."""

from __future__ import annotations

from typing import List

import numpy as np
from numpy.typing import NDArray

import gpuexec


def saxpy(target: str, cubin: str, n: int) -> NDArray[np.float32]:
    with gpuexec.connect(target, timeout=5.0) as client, client.session() as session:
        x = session.upload(np.arange(n, dtype=np.float32))
        y = session.upload(np.ones(n, dtype=np.float32))
        kernel = session.load_module(cubin).function("saxpy")
        seconds = kernel.launch((n + 255) // 256, 256, gpuexec.f32(2.0), x, y, gpuexec.u64(n),
                                sync=True)
        print(f"{seconds} s of GPU time")
        out: NDArray[np.float32] = y.read_array()
        return out


def device_names(target: str) -> List[str]:
    with gpuexec.connect(target) as client:
        if isinstance(client, gpuexec.Pool):
            return [d.daemon for d in client.devices()]
        return [f"{d.name} ({d.memory_free_bytes} bytes free)" for d in client.devices()]


def launch_args() -> List[gpuexec.Arg]:
    return [gpuexec.i32(-1), gpuexec.u64(1 << 40), gpuexec.f16(0.5), gpuexec.raw(b"\0" * 8),
            gpuexec.null()]


try:
    saxpy("unix:/nonexistent.sock", "saxpy.cubin", 16)
except gpuexec.Error as e:
    print(e.code, e.message)
