"""Triton programs as their users write them, run on a gpuexec daemon's GPU.

Each program is plain Triton -- @triton.jit, kernel[grid](...) with a grid
callable, @triton.autotune, host TensorDescriptors -- with gpuexec buffers
where a torch program has tensors. The only gpuexec line is
``gpuexec.triton.activate(session)``. Each result is checked against numpy.

    python3 programs.py --target=127.0.0.1:50051            # all programs
    python3 programs.py --target=... --only=add,softmax
    python3 programs.py --target=... --no-torch             # torch imports fail

With --no-torch every import of torch fails (and is reported), and the run
ends by checking that no libcuda is mapped in this process: Triton
compiles here with its own ptxas; the GPU is the daemon's. Exits 1 if any
program's error is over its tolerance or if either check fails.
"""

import argparse
import importlib.abc
import os
import sys
import traceback

TORCH_IMPORTS = []


class _NoTorch(importlib.abc.MetaPathFinder):
    """Fails every import of torch and torch.*, and records where from."""

    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            frames = traceback.extract_stack()[:-1]
            TORCH_IMPORTS.append((name, [f.filename for f in frames],
                                  "".join(traceback.format_list(frames[-8:]))))
            raise ImportError(f"{name} is blocked in this run")
        return None


if "--no-torch" in sys.argv:
    sys.meta_path.insert(0, _NoTorch())

import numpy as np  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: E402

import gpuexec  # noqa: E402
import gpuexec.triton  # noqa: E402

# ------------------------------------------------------------------ kernels


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
    x = tl.load(in_ptr + row * in_row_stride + cols, mask=cols < n_cols, other=-float("inf"))
    x = x - tl.max(x, axis=0)
    num = tl.exp(x)
    tl.store(out_ptr + row * out_row_stride + cols, num / tl.sum(num, axis=0),
             mask=cols < n_cols)


@triton.autotune(
    configs=[
        triton.Config({"BM": 128, "BN": 128, "BK": 64}, num_stages=3, num_warps=8),
        triton.Config({"BM": 128, "BN": 64, "BK": 64}, num_stages=4, num_warps=4),
        triton.Config({"BM": 64, "BN": 128, "BK": 32}, num_stages=4, num_warps=4),
        triton.Config({"BM": 64, "BN": 64, "BK": 32}, num_stages=5, num_warps=2),
        triton.Config({"BM": 32, "BN": 64, "BK": 32}, num_stages=5, num_warps=2),
    ],
    key=["M", "N", "K"],
)
@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                  stride_cm, stride_cn, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BK)):
        kk = k * BK + rk
        a = tl.load(a_ptr + rm[:, None] * stride_am + kk[None, :] * stride_ak,
                    mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)
        b = tl.load(b_ptr + kk[:, None] * stride_bk + rn[None, :] * stride_bn,
                    mask=(kk[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc)
    tl.store(c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn, acc,
             mask=(rm[:, None] < M) & (rn[None, :] < N))


@triton.jit
def layer_norm_fwd(X, Y, W, B, Mean, Rstd, stride, N, eps, BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    x = tl.load(X + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / N
    xc = tl.where(mask, x - mean, 0.0)
    rstd = 1 / tl.sqrt(tl.sum(xc * xc, axis=0) / N + eps)
    tl.store(Mean + row, mean)
    tl.store(Rstd + row, rstd)
    w = tl.load(W + cols, mask=mask)
    b = tl.load(B + cols, mask=mask)
    tl.store(Y + row * stride + cols, xc * rstd * w + b, mask=mask)


@triton.jit
def layer_norm_bwd_dx(DX, DY, PartialDW, PartialDB, X, W, Mean, Rstd, stride, N,
                      ROWS: tl.constexpr, BLOCK_N: tl.constexpr):
    # dx of ROWS rows per program; each program's sums of dy * xhat and dy
    # (the parts of dw and db) go to its own row of the partial buffers.
    group = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    w = tl.load(W + cols, mask=mask, other=0.0)
    dw = tl.zeros((BLOCK_N,), dtype=tl.float32)
    db = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for i in range(ROWS):
        row = group * ROWS + i
        x = tl.load(X + row * stride + cols, mask=mask, other=0.0)
        dy = tl.load(DY + row * stride + cols, mask=mask, other=0.0)
        mean = tl.load(Mean + row)
        rstd = tl.load(Rstd + row)
        xhat = tl.where(mask, (x - mean) * rstd, 0.0)
        wdy = tl.where(mask, w * dy, 0.0)
        c1 = tl.sum(xhat * wdy, axis=0) / N
        c2 = tl.sum(wdy, axis=0) / N
        tl.store(DX + row * stride + cols, (wdy - (xhat * c1 + c2)) * rstd, mask=mask)
        dw += dy * xhat
        db += dy
    tl.store(PartialDW + group * N + cols, dw, mask=mask)
    tl.store(PartialDB + group * N + cols, db, mask=mask)


@triton.jit
def layer_norm_bwd_dwdb(PartialDW, PartialDB, DW, DB, groups, N, BLOCK_N: tl.constexpr):
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = cols < N
    dw = tl.zeros((BLOCK_N,), dtype=tl.float32)
    db = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for g in range(0, groups):
        dw += tl.load(PartialDW + g * N + cols, mask=mask, other=0.0)
        db += tl.load(PartialDB + g * N + cols, mask=mask, other=0.0)
    tl.store(DW + cols, dw, mask=mask)
    tl.store(DB + cols, db, mask=mask)


@triton.jit
def matmul_tma_persistent(a_desc, b_desc, c_desc, M, N, K, BLOCK_M: tl.constexpr,
                          BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, NUM_SMS: tl.constexpr):
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_tiles = tl.cdiv(M, BLOCK_M) * num_pid_n
    for tile_id in tl.range(tl.program_id(0), num_tiles, NUM_SMS):
        offs_m = (tile_id // num_pid_n) * BLOCK_M
        offs_n = (tile_id % num_pid_n) * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for ki in range(tl.cdiv(K, BLOCK_K)):
            a = a_desc.load([offs_m, ki * BLOCK_K])
            b = b_desc.load([offs_n, ki * BLOCK_K])
            acc = tl.dot(a, b.T, acc)
        c_desc.store([offs_m, offs_n], acc.to(tl.float16))


@triton.jit
def scale_with_device_descriptors(in_ptr, out_ptr, M, N, BM: tl.constexpr, BN: tl.constexpr):
    # Descriptors made on the device live in the kernel's global scratch.
    src = tl.make_tensor_descriptor(in_ptr, shape=[M, N], strides=[N, 1], block_shape=[BM, BN])
    dst = tl.make_tensor_descriptor(out_ptr, shape=[M, N], strides=[N, 1], block_shape=[BM, BN])
    m = tl.program_id(0) * BM
    n = tl.program_id(1) * BN
    dst.store([m, n], src.load([m, n]) * 3.0)


# ----------------------------------------------------------------- programs

RNG = np.random.default_rng(0)


def _max_error(got, expected, relative=False):
    got = np.asarray(got, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    diff = np.abs(got - expected)
    if relative:
        diff = diff / (1.0 + np.abs(expected))
    return float(diff.max())


def vector_add(s):
    n = 1_000_003
    x = RNG.standard_normal(n, dtype=np.float32)
    y = RNG.standard_normal(n, dtype=np.float32)
    xb, yb = s.asarray(x), s.asarray(y)
    out = s.empty_like(xb)
    add_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](xb, yb, out, n, BLOCK=1024)
    # A view at an offset is a pointer too.
    half = s.zeros(n, "float32")
    add_kernel[lambda meta: (triton.cdiv(n - 1000, meta["BLOCK"]),)](
        xb[1000:], yb[1000:], half[1000:], n - 1000, BLOCK=1024)
    expected_half = np.concatenate([np.zeros(1000, np.float32), (x + y)[1000:]])
    return max(_max_error(out.get(), x + y), _max_error(half.get(), expected_half)), 0.0


def fused_softmax(s):
    rows, cols = 1823, 781
    a = RNG.standard_normal((rows, cols), dtype=np.float32) * 4
    ab = s.asarray(a)
    out = s.empty_like(ab)
    softmax_kernel[(rows,)](out, ab, ab.stride(0), out.stride(0), cols,
                            BLOCK=triton.next_power_of_2(cols), num_warps=8)
    e = np.exp(a.astype(np.float64) - a.max(axis=1, keepdims=True))
    return _max_error(out.get(), e / e.sum(axis=1, keepdims=True)), 1e-5


def autotuned_matmul(s):
    M, N, K = 1000, 768, 512
    a = RNG.standard_normal((M, K)).astype(np.float16)
    b = RNG.standard_normal((K, N)).astype(np.float16)
    ab, bb = s.asarray(a), s.asarray(b)
    c = s.empty((M, N), "float32")
    grid = lambda meta: (triton.cdiv(M, meta["BM"]), triton.cdiv(N, meta["BN"]))  # noqa: E731
    matmul_kernel[grid](ab, bb, c, M, N, K, ab.stride(0), ab.stride(1), bb.stride(0),
                        bb.stride(1), c.stride(0), c.stride(1))
    timings = getattr(matmul_kernel, "configs_timings", None) or {}
    for config, t in sorted(timings.items(), key=lambda kv: kv[1][0]):
        print(f"    {config}: {t[0] * 1e3:.1f} us GPU time (median)")
    best = matmul_kernel.best_config
    print(f"    chosen: {best}, {timings[best][0] * 1e3:.1f} us" if best in timings
          else f"    chosen: {best}")
    assert len(timings) >= 4, f"the autotuner timed {len(timings)} configurations"
    expected = a.astype(np.float32) @ b.astype(np.float32)
    return _max_error(c.get(), expected, relative=True), 1e-2


def layer_norm(s):
    M, N, eps = 1024, 1536, 1e-5
    rows_per_group = 16
    x = RNG.standard_normal((M, N), dtype=np.float32)
    w = RNG.standard_normal(N, dtype=np.float32)
    b = RNG.standard_normal(N, dtype=np.float32)
    dy = RNG.standard_normal((M, N), dtype=np.float32)
    xb, wb, bb, dyb = s.asarray(x), s.asarray(w), s.asarray(b), s.asarray(dy)
    y, mean, rstd = s.empty_like(xb), s.empty(M, "float32"), s.empty(M, "float32")
    block = triton.next_power_of_2(N)
    layer_norm_fwd[(M,)](xb, y, wb, bb, mean, rstd, xb.stride(0), N, eps, BLOCK_N=block,
                         num_warps=8)
    groups = M // rows_per_group
    dx = s.empty_like(xb)
    pdw, pdb = s.empty((groups, N), "float32"), s.empty((groups, N), "float32")
    layer_norm_bwd_dx[(groups,)](dx, dyb, pdw, pdb, xb, wb, mean, rstd, xb.stride(0), N,
                                 ROWS=rows_per_group, BLOCK_N=block, num_warps=8)
    dw, db = s.empty(N, "float32"), s.empty(N, "float32")
    layer_norm_bwd_dwdb[lambda meta: (triton.cdiv(N, meta["BLOCK_N"]),)](
        pdw, pdb, dw, db, groups, N, BLOCK_N=128)
    x64, w64, dy64 = x.astype(np.float64), w.astype(np.float64), dy.astype(np.float64)
    mu = x64.mean(axis=1, keepdims=True)
    r = 1 / np.sqrt(((x64 - mu) ** 2).mean(axis=1, keepdims=True) + eps)
    xhat = (x64 - mu) * r
    wdy = w64 * dy64
    dx_ref = (wdy - (xhat * (xhat * wdy).mean(axis=1, keepdims=True)
                     + wdy.mean(axis=1, keepdims=True))) * r
    errors = [_max_error(y.get(), xhat * w64 + b), _max_error(dx.get(), dx_ref),
              _max_error(dw.get(), (dy64 * xhat).sum(axis=0), relative=True),
              _max_error(db.get(), dy64.sum(axis=0), relative=True)]
    print(f"    forward {errors[0]:.2g}, dx {errors[1]:.2g}, dw {errors[2]:.2g}, "
          f"db {errors[3]:.2g}")
    return max(errors), 1e-3


def persistent_matmul_tma(s):
    M = N = K = 1024
    BM = BN = BK = 64
    num_sms = s.client.devices()[s.device].multiprocessor_count
    a = RNG.standard_normal((M, K)).astype(np.float16)
    b = RNG.standard_normal((K, N)).astype(np.float16)
    ab, btb = s.asarray(a), s.asarray(np.ascontiguousarray(b.T))
    c = s.zeros((M, N), "float16")
    tiles = triton.cdiv(M, BM) * triton.cdiv(N, BN)
    matmul_tma_persistent[(min(num_sms, tiles),)](
        TensorDescriptor.from_tensor(ab, [BM, BK]), TensorDescriptor.from_tensor(btb, [BN, BK]),
        TensorDescriptor.from_tensor(c, [BM, BN]), M, N, K, BLOCK_M=BM, BLOCK_N=BN,
        BLOCK_K=BK, NUM_SMS=num_sms, num_warps=4, num_stages=3)
    expected = a.astype(np.float32) @ b.astype(np.float32)
    return _max_error(c.get(), expected, relative=True), 2e-2


def global_scratch(s):
    M, N, BM, BN = 512, 384, 64, 64
    x = RNG.standard_normal((M, N), dtype=np.float32)
    xb = s.asarray(x)
    out = s.zeros((M, N), "float32")
    kernel = scale_with_device_descriptors[(M // BM, N // BN)](xb, out, M, N, BM=BM, BN=BN)
    size = getattr(kernel.metadata, "global_scratch_size", 0)
    print(f"    global scratch: {size} bytes per program")
    assert size > 0, "the kernel was compiled without global scratch"
    return _max_error(out.get(), x * np.float32(3.0)), 0.0


def two_ctas(s):
    n = 1_000_003
    x = RNG.standard_normal(n, dtype=np.float32)
    y = RNG.standard_normal(n, dtype=np.float32)
    xb, yb = s.asarray(x), s.asarray(y)
    out = s.zeros(n, "float32")
    kernel = add_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](
        xb, yb, out, n, BLOCK=8192, num_ctas=2)
    print(f"    num_ctas {kernel.metadata.num_ctas}")
    return _max_error(out.get(), x + y), 0.0


PROGRAMS = {"add": vector_add, "softmax": fused_softmax, "matmul_autotune": autotuned_matmul,
            "layer_norm": layer_norm, "persistent_matmul_tma": persistent_matmul_tma,
            "global_scratch": global_scratch, "num_ctas_2": two_ctas}


def _libcuda_mapped():
    with open("/proc/self/maps", encoding="utf-8") as f:
        return sorted({line.split()[-1] for line in f if "libcuda" in line})


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default=os.environ.get("GPUEXEC_TARGET"))
    parser.add_argument("--only", default="", help="programs to run, comma-separated")
    parser.add_argument("--no-torch", action="store_true", help="fail every import of torch")
    args = parser.parse_args()
    names = [n for n in args.only.split(",") if n] or list(PROGRAMS)
    failed = []
    with gpuexec.connect(args.target) as client, client.session() as s:
        gpuexec.triton.activate(s)
        print(f"Triton {triton.__version__}; session on {client.devices()[s.device].name}")
        for name in names:
            try:
                error, tolerance = PROGRAMS[name](s)
            except Exception:  # pylint: disable=broad-except
                traceback.print_exc()
                print(f"{name}: FAILED")
                failed.append(name)
                continue
            ok = error <= tolerance
            print(f"{name}: max error {error:.3g} (tolerance {tolerance:g}) "
                  f"{'ok' if ok else 'TOO LARGE'}")
            if not ok:
                failed.append(name)
    if args.no_torch:
        # Triton's own argument specializer tries torch once (and goes on
        # without it); an attempt made by the gpuexec package's code (the
        # importing frame in its directory, whatever the directory of this
        # script) would be a failure.
        package = os.path.dirname(os.path.abspath(gpuexec.__file__)) + os.sep

        def importer(files):
            # The innermost frame that is not the import machinery's.
            for f in reversed(files):
                if not f.startswith("<frozen importlib") and "importlib" not in f:
                    return os.path.abspath(f)
            return ""
        ours = [n for n, files, _ in TORCH_IMPORTS if importer(files).startswith(package)]
        print(f"torch imports attempted: {len(TORCH_IMPORTS)} ({len(ours)} from the gpuexec "
              f"package, {package}); torch in sys.modules: {'torch' in sys.modules}")
        for name, _, where in TORCH_IMPORTS[:2]:
            print(f"  {name} from:\n{where}")
        mapped = _libcuda_mapped()
        print(f"libcuda mapped in this process: {mapped or 'none'}")
        if ours or mapped or "torch" in sys.modules:
            failed.append("no-torch")
    print("all programs passed" if not failed else f"FAILED: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
