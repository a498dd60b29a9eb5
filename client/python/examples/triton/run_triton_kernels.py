#!/usr/bin/env python3
"""Compile three Triton kernels with Triton and run them through gpuexecd.

Triton only compiles here (no launch, no torch): each kernel's cubin and
metadata JSON go to --out, then gpuexec.triton loads and launches them on the
daemon's device and numpy checks the results. Exits non-zero on a failure.

    python3 run_triton_kernels.py --target 127.0.0.1:50051
    python3 run_triton_kernels.py --daemon path/to/gpuexecd     # starts its own

Needs triton (3.x), numpy, and the gpuexec package on the path.
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

import gpuexec
from gpuexec import triton as gt

try:
    import triton
    import triton.language as tl
except ImportError:  # importable without Triton; main() says what is missing
    triton = None

if triton is not None:

    @triton.jit
    def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask)
        y = tl.load(y_ptr + offs, mask=mask)
        tl.store(out_ptr + offs, x + y, mask=mask)

    @triton.jit
    def softmax_kernel(out_ptr, in_ptr, in_row_stride, out_row_stride, n_cols,
                       BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        mask = cols < n_cols
        x = tl.load(in_ptr + row * in_row_stride + cols, mask=mask, other=-float("inf"))
        x = x - tl.max(x, axis=0)
        num = tl.exp(x)
        tl.store(out_ptr + row * out_row_stride + cols, num / tl.sum(num, axis=0), mask=mask)

    @triton.jit
    def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_bk, stride_cm,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        # C (fp32, M x N) = A (fp16, M x K) @ B (fp16, K x N), all row-major.
        offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = tl.arange(0, BLOCK_K)
        a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :]
        b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :]
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, tl.cdiv(K, BLOCK_K)):
            k_left = K - k * BLOCK_K
            a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & (offs_k[None, :] < k_left), other=0.0)
            b = tl.load(b_ptrs, mask=(offs_k[:, None] < k_left) & (offs_n[None, :] < N), other=0.0)
            acc = tl.dot(a, b, acc)
            a_ptrs += BLOCK_K
            b_ptrs += BLOCK_K * stride_bk
        c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :]
        tl.store(c_ptrs, acc, mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


def compile_kernel(fn, signature, constexprs, aligned, options, arch, out_dir):
    """Compiles ``fn`` for sm_<arch>; writes <name>.cubin and <name>.json."""
    compiled = gt.compile(fn, signature, constexprs, target=arch, aligned=aligned,
                          options=options)
    return compiled.save(out_dir), compiled.metadata


def start_daemon(path, directory):
    socket = os.path.join(directory, "gpuexecd.sock")
    log = open(os.path.join(directory, "gpuexecd.log"), "wb")
    process = subprocess.Popen([path, "--listen=", f"--unix_socket={socket}"], stdout=log,
                               stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while True:
        try:
            gpuexec.connect(f"unix:{socket}", timeout=0.5).close()
            return process, f"unix:{socket}"
        except gpuexec.Error:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                log.flush()
                with open(log.name, errors="replace") as f:
                    sys.exit(f"gpuexecd did not start:\n{f.read()}")


def report(name, error, tolerance):
    ok = bool(error <= tolerance)
    print(f"  {name}: max error {error:.3g} (tolerance {tolerance:g}): {'PASS' if ok else 'FAIL'}")
    return ok


def run(target, out_dir):
    results = []
    with gpuexec.connect(target) as client, client.session() as session:
        device = client.devices()[session.device]
        major, minor = device.compute_capability
        arch = major * 10 + minor
        print(f"device {device.index}: {device.name}, sm_{arch}; kernels in {out_dir}")
        rng = np.random.default_rng(0)

        # 1. Vector add.
        cubin, md = compile_kernel(
            add_kernel, {"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32",
                         "BLOCK": "constexpr"},
            {"BLOCK": 1024}, ["x_ptr", "y_ptr", "out_ptr"], {"num_warps": 4}, arch, out_dir)
        n = 1_000_003
        x = rng.standard_normal(n, dtype=np.float32)
        y = rng.standard_normal(n, dtype=np.float32)
        kernel = gt.load(session, cubin)  # the .json next to it
        xb, yb, out = session.upload(x), session.upload(y), session.alloc(4 * n)
        session.synchronize()  # so that the launch's GPU time is the kernel's alone
        t = kernel.launch(triton.cdiv(n, 1024), xb, yb, out, n, sync=True)
        print(f"add_kernel: {md['num_warps']} warps, shared {md['shared']} B, "
              f"{t * 1e6:.1f} us")
        results.append(report("add", float(np.max(np.abs(out.read(np.float32) - (x + y)))), 0.0))

        # 2. Row softmax.
        rows, cols = 1823, 781
        cubin, md = compile_kernel(
            softmax_kernel, {"out_ptr": "*fp32", "in_ptr": "*fp32", "in_row_stride": "i32",
                             "out_row_stride": "i32", "n_cols": "i32", "BLOCK": "constexpr"},
            {"BLOCK": 1024}, ["out_ptr", "in_ptr"], {"num_warps": 8}, arch, out_dir)
        a = rng.standard_normal((rows, cols), dtype=np.float32) * 4
        kernel = gt.load(session, cubin)
        out, ab = session.empty((rows, cols), np.float32), session.upload(a)
        session.synchronize()
        t = kernel.launch(rows, out, ab, cols, cols, cols, sync=True)
        e = np.exp(a.astype(np.float64) - a.max(axis=1, keepdims=True))
        expected = e / e.sum(axis=1, keepdims=True)
        print(f"softmax_kernel: {md['num_warps']} warps, shared {md['shared']} B, "
              f"{t * 1e6:.1f} us")
        results.append(report("softmax", float(np.max(np.abs(out.read_array() - expected))), 1e-5))

        # 3. Matmul, fp16 in, fp32 out, 128x128x64 tiles in 3 stages.
        M, N, K = 777, 640, 512
        cubin, md = compile_kernel(
            matmul_kernel, {"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp32", "M": "i32",
                            "N": "i32", "K": "i32", "stride_am": "i32", "stride_bk": "i32",
                            "stride_cm": "i32", "BLOCK_M": "constexpr", "BLOCK_N": "constexpr",
                            "BLOCK_K": "constexpr"},
            {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64},
            ["a_ptr", "b_ptr", "c_ptr", "stride_am", "stride_bk", "stride_cm"],
            {"num_warps": 8, "num_stages": 3}, arch, out_dir)
        A = rng.standard_normal((M, K)).astype(np.float16)
        B = rng.standard_normal((K, N)).astype(np.float16)
        kernel = gt.load(session, cubin)
        C = session.empty((M, N), np.float32)
        grid = (triton.cdiv(M, 128), triton.cdiv(N, 128))
        Ab, Bb = session.upload(A), session.upload(B)
        session.synchronize()
        t = kernel.launch(grid, Ab, Bb, C, M, N, K, K, N, N, sync=True)
        print(f"matmul_kernel: {md['num_warps']} warps, {md.get('num_stages')} stages, "
              f"shared {md['shared']} B ({md['shared'] / 1024:.1f} KiB), {t * 1e6:.1f} us")
        if md["shared"] <= 48 * 1024:
            print("  note: this build used no more than 48 KiB of shared memory")
        expected = A.astype(np.float64) @ B.astype(np.float64)
        err = float(np.max(np.abs(C.read_array() - expected) / (1 + np.abs(expected))))
        results.append(report("matmul", err, 1e-3))
    return all(results)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="127.0.0.1:50051", help="daemon address")
    parser.add_argument("--daemon", help="start this gpuexecd (on a Unix socket) instead")
    parser.add_argument("--out", help="where to write the cubins and JSON (default: a temp dir)")
    args = parser.parse_args()
    if triton is None:
        sys.exit("triton is not installed")
    with tempfile.TemporaryDirectory(prefix="gpuexec-triton-") as tmp:
        out_dir = args.out or tmp
        os.makedirs(out_dir, exist_ok=True)
        process, target = (start_daemon(args.daemon, tmp) if args.daemon else (None, args.target))
        try:
            ok = run(target, out_dir)
        except gpuexec.Error as e:
            print(f"FAIL: {e}")
            ok = False
        finally:
            if process is not None:
                process.terminate()
                process.wait(timeout=30)
    print("all passed" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
