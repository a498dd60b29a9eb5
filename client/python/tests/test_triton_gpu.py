"""Kernels compiled here by Triton and run through gpuexec.triton on the
daemon's GPU, checked against numpy: a persistent matmul over host tensor
descriptors, a grid-synchronizing kernel (launch_cooperative_grid), a
programmatic dependent launch pair (launch_pdl) and clusters (num_ctas).

Only with Triton installed and a daemon on a real GPU (the test double runs
no compiled code); otherwise skipped. Each test compiles its own kernels
and is independent of the others. No torch tensor is used anywhere.

Assumptions about Triton (3.4 to 3.6), written down because they are where
a new Triton would differ:
- ``triton.compiler.ASTSource(fn, signature, constexprs, attrs)`` with
  signature types by argument name ("*fp16", "i32", "constexpr"), constexprs
  by name and attrs keyed by (argument index,).
- A host tensor descriptor's signature type is what Triton's own
  specialization writes for a ``TensorDescriptor``:
  ``f"tensordesc<{dtype}{list(block_shape)}>"``, e.g. "tensordesc<fp16[64, 64]>".
- ``triton.compile(src, target=GPUTarget("cuda", arch, 32), options=...)``
  with options num_warps, num_ctas, launch_cooperative_grid, launch_pdl.
- ``compiled.asm["cubin"]`` and ``compiled.metadata._asdict()`` (passed as
  is, and once written with ``json.dump(..., default=str)``).
"""

import json
import os
import subprocess
import time

import numpy as np
import pytest

import gpuexec
from gpuexec import triton as gt

try:
    import triton
    import triton.language as tl
except ImportError:  # the tests skip; the module still imports
    triton = None


@pytest.fixture
def gpu(daemon):
    """Skips unless Triton is importable and the daemon drives a real GPU."""
    if triton is None:
        pytest.skip("triton is not installed")
    if daemon.is_test_double:
        pytest.skip("Triton kernels need a real GPU (the daemon runs the test double)")
    return daemon


@pytest.fixture
def device(client, session, gpu):
    return client.devices()[session.device]


def _arch(device):
    major, minor = device.compute_capability
    return major * 10 + minor


def _compile(fn, signature, constexprs=None, aligned=(), options=None, arch=90):
    """Compiles ``fn``; returns (cubin bytes, metadata dict as Triton gives it)."""
    from triton.backends.compiler import GPUTarget

    names = list(signature)
    attrs = {(names.index(a),): [["tt.divisibility", 16]] for a in aligned}
    source = triton.compiler.ASTSource(fn=fn, signature=signature,
                                       constexprs=dict(constexprs or {}), attrs=attrs)
    compiled = triton.compile(source, target=GPUTarget("cuda", arch, 32),
                              options=dict(options or {}))
    return compiled.asm["cubin"], compiled.metadata._asdict()


def _cli(daemon, tmp_path, *args):
    """Runs the command-line tool ($GPUEXEC_CLI) against the test's daemon
    in tmp_path; returns False (and runs nothing) where it is not given."""
    cli = os.environ.get("GPUEXEC_CLI")
    if not cli:
        print("  GPUEXEC_CLI is not set: the command-line tool is not run")
        return False
    done = subprocess.run([cli, f"--target={daemon.target}", *args], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, check=False)
    print(f"  gpuexec {' '.join(args)}: exit {done.returncode}\n{done.stdout}{done.stderr}")
    assert done.returncode == 0, done.stderr
    return True


def _show(what, md, kernel=None):
    """Printed before the checks: pytest shows it when one fails."""
    keys = ("name", "num_warps", "num_ctas", "cluster_dims", "shared", "tensordesc_meta",
            "launch_cooperative_grid", "launch_pdl", "global_scratch_size",
            "profile_scratch_size", "triton_version")
    print(f"{what}: triton {getattr(triton, '__version__', '?')}; metadata "
          f"{ {k: md.get(k) for k in keys if k in md} }")
    if kernel is not None:
        print(f"  {kernel!r}; parameters {kernel.function.params}; "
              f"metadata read as {kernel.metadata}")


if triton is not None:

    @triton.jit
    def matmul_tma_persistent(a_desc, b_desc, c_desc, M, N, K, BLOCK_M: tl.constexpr,
                              BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                              NUM_SMS: tl.constexpr):
        # C (M x N) = A (M x K) @ B, with B given as B^T (N x K); fp16 in and
        # out, fp32 accumulation; each program walks tiles NUM_SMS apart.
        num_pid_n = tl.cdiv(N, BLOCK_N)
        num_tiles = tl.cdiv(M, BLOCK_M) * num_pid_n
        k_tiles = tl.cdiv(K, BLOCK_K)
        for tile_id in tl.range(tl.program_id(0), num_tiles, NUM_SMS):
            offs_m = (tile_id // num_pid_n) * BLOCK_M
            offs_n = (tile_id % num_pid_n) * BLOCK_N
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for ki in range(k_tiles):
                a = a_desc.load([offs_m, ki * BLOCK_K])
                b = b_desc.load([offs_n, ki * BLOCK_K])
                acc = tl.dot(a, b.T, acc)
            c_desc.store([offs_m, offs_n], acc.to(tl.float16))

    @triton.jit
    def grid_sync_kernel(counter_ptr, out_ptr, n_programs):
        # Every program arrives at a grid-wide barrier (a counter) and waits
        # for all the others, which only ends when all are resident at once
        # (a cooperative launch); then writes the count it saw (n_programs).
        tl.atomic_add(counter_ptr, 1, sem="release")
        seen = tl.atomic_add(counter_ptr, 0, sem="acquire")
        while seen < n_programs:
            seen = tl.atomic_add(counter_ptr, 0, sem="acquire")
        tl.store(out_ptr + tl.program_id(0), seen)

    @triton.jit
    def pdl_produce(data_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(data_ptr + offs, offs + 1, mask=offs < n)
        tl.extra.cuda.gdc_launch_dependents()

    @triton.jit
    def pdl_consume(data_ptr, out_ptr, n, BLOCK: tl.constexpr):
        tl.extra.cuda.gdc_wait()
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(out_ptr + offs, 2 * tl.load(data_ptr + offs, mask=mask), mask=mask)

    @triton.jit
    def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask)
        tl.store(out_ptr + offs, x + tl.load(y_ptr + offs, mask=mask), mask=mask)


def test_persistent_matmul_with_host_tensor_descriptors(session, device, gpu, tmp_path):
    M = N = K = 512
    BM = BN = BK = 64
    desc = f"tensordesc<fp16{[BM, BK]}>"  # the three blocks are 64 x 64
    num_sms = device.multiprocessor_count
    cubin, md = _compile(
        matmul_tma_persistent,
        {"a_desc": desc, "b_desc": desc, "c_desc": desc, "M": "i32", "N": "i32", "K": "i32",
         "BLOCK_M": "constexpr", "BLOCK_N": "constexpr", "BLOCK_K": "constexpr",
         "NUM_SMS": "constexpr"},
        {"BLOCK_M": BM, "BLOCK_N": BN, "BLOCK_K": BK, "NUM_SMS": num_sms},
        options={"num_warps": 4, "num_stages": 3}, arch=_arch(device))
    _show("matmul_tma_persistent", md)
    assert md.get("tensordesc_meta"), "Triton wrote no tensordesc_meta: no host descriptors"
    # The metadata as Triton's dict, and as json.dump(..., default=str) writes it.
    path = tmp_path / "matmul.json"
    path.write_text(json.dumps(md, default=str))
    for metadata in (md, str(path)):
        kernel = gt.load(session, cubin, metadata)
        _show("loaded", md, kernel)
        assert kernel.num_args == 6 and len(kernel.metadata.tensordesc_meta) == 3
        rng = np.random.default_rng(1)
        a = rng.standard_normal((M, K)).astype(np.float16)
        b = rng.standard_normal((K, N)).astype(np.float16)
        ab, btb = session.upload(a), session.upload(np.ascontiguousarray(b.T))
        c = session.empty((M, N), np.float16)
        c.memset(0)
        grid = min(num_sms, (M // BM) * (N // BN))
        t = kernel.launch(grid, gt.TensorDescriptor(ab, [M, K], block_shape=[BM, BK]),
                          gt.TensorDescriptor(btb, [N, K], block_shape=[BN, BK]),
                          gt.TensorDescriptor(c, [M, N], block_shape=[BM, BN]), M, N, K,
                          sync=True)
        expected = a.astype(np.float32) @ b.astype(np.float32)
        got = c.read_array().astype(np.float32)
        err = float(np.max(np.abs(got - expected) / (1 + np.abs(expected))))
        print(f"  grid {grid}, {t * 1e6:.1f} us, max relative error {err:.3g}")
        assert err < 2e-2
    # The same through the command-line tool, from the files.
    (tmp_path / "matmul.cubin").write_bytes(cubin)
    a.tofile(tmp_path / "a.bin")
    np.ascontiguousarray(b.T).tofile(tmp_path / "bt.bin")
    if _cli(gpu, tmp_path, "run", "--triton=matmul.json", "matmul.cubin", f"--grid={grid}",
            f"desc:{M}x{K}:in:a.bin", f"desc:{N}x{K}:in:bt.bin",
            f"desc:{M}x{N}:out:{M * N * 2}:c.bin", f"i32:{M}", f"i32:{N}", f"i32:{K}"):
        got = np.fromfile(tmp_path / "c.bin", np.float16).reshape(M, N).astype(np.float32)
        err = float(np.max(np.abs(got - expected) / (1 + np.abs(expected))))
        print(f"  through the CLI: max relative error {err:.3g}")
        assert err < 2e-2


def test_grid_synchronizing_kernel_with_a_cooperative_launch(session, device, gpu, tmp_path):
    cubin, md = _compile(grid_sync_kernel,
                         {"counter_ptr": "*i32", "out_ptr": "*i32", "n_programs": "i32"},
                         options={"num_warps": 4, "launch_cooperative_grid": True},
                         arch=_arch(device))
    _show("grid_sync_kernel", md)
    kernel = gt.load(session, cubin, md)
    _show("loaded", md, kernel)
    assert kernel.cooperative, "Triton did not set launch_cooperative_grid"
    n = 2 * device.multiprocessor_count
    counter, out = session.alloc(4), session.alloc(4 * n)
    counter.memset(0)
    out.memset(0)
    kernel.launch(n, counter, out, n, sync=True)
    assert counter.read(np.int32).tolist() == [n]
    assert out.read(np.int32).tolist() == [n] * n
    # The same through the command-line tool: the cooperative launch comes
    # from the metadata.
    (tmp_path / "grid_sync.cubin").write_bytes(cubin)
    (tmp_path / "grid_sync.json").write_text(json.dumps(md, default=str))
    if _cli(gpu, tmp_path, "run", "--triton=grid_sync.json", "grid_sync.cubin", f"--grid={n}",
            "zeros:4,save=counter.bin", f"out:{4 * n}:out.bin", f"i32:{n}"):
        assert np.fromfile(tmp_path / "counter.bin", np.int32).tolist() == [n]
        assert np.fromfile(tmp_path / "out.bin", np.int32).tolist() == [n] * n


def test_programmatic_dependent_launch_pair(session, device):
    extra = getattr(getattr(tl, "extra", None), "cuda", None)
    if extra is None or not hasattr(extra, "gdc_wait"):
        pytest.skip("this Triton has no tl.extra.cuda.gdc_wait")
    sig = {"data_ptr": "*i32", "n": "i32", "BLOCK": "constexpr"}
    produce_cubin, produce_md = _compile(pdl_produce, sig, {"BLOCK": 1024}, ["data_ptr"],
                                         {"num_warps": 4}, arch=_arch(device))
    consume_cubin, consume_md = _compile(
        pdl_consume, {"data_ptr": "*i32", "out_ptr": "*i32", "n": "i32", "BLOCK": "constexpr"},
        {"BLOCK": 1024}, ["data_ptr", "out_ptr"], {"num_warps": 4, "launch_pdl": True},
        arch=_arch(device))
    _show("pdl_consume", consume_md)
    produce = gt.load(session, produce_cubin, produce_md)
    consume = gt.load(session, consume_cubin, consume_md)
    assert consume.pdl, "Triton did not set launch_pdl"
    n = 1_000_003
    data, out = session.alloc(4 * n), session.alloc(4 * n)
    data.memset(0)
    grid = triton.cdiv(n, 1024)
    for _ in range(3):
        produce.launch_async(grid, data, n)
        consume.launch_async(grid, data, out, n)
    session.synchronize()
    np.testing.assert_array_equal(out.read(np.int32), 2 * (np.arange(n, dtype=np.int32) + 1))


@pytest.mark.parametrize("num_ctas", [2, 16])
def test_cluster_kernel(session, device, num_ctas):
    block = 8192
    try:
        cubin, md = _compile(add_kernel, {"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32",
                                          "n": "i32", "BLOCK": "constexpr"},
                             {"BLOCK": block}, ["x_ptr", "y_ptr", "out_ptr"],
                             {"num_warps": 4, "num_ctas": num_ctas}, arch=_arch(device))
    except Exception as e:  # pylint: disable=broad-except
        pytest.skip(f"Triton does not compile num_ctas={num_ctas} here: "
                    f"{type(e).__name__}: {str(e)[:300]}")
    _show(f"add_kernel num_ctas={num_ctas}", md)
    kernel = gt.load(session, cubin, md)
    _show("loaded", md, kernel)
    blocks = kernel.cluster[0] * kernel.cluster[1] * kernel.cluster[2]
    n = 1_000_003
    rng = np.random.default_rng(2)
    x = rng.standard_normal(n, dtype=np.float32)
    y = rng.standard_normal(n, dtype=np.float32)
    xb, yb, out = session.upload(x), session.upload(y), session.alloc(4 * n)
    try:
        kernel.launch(triton.cdiv(n, block), xb, yb, out, n, sync=True)
    except gpuexec.Error as e:
        if blocks > 8:
            pytest.skip(f"the daemon refuses a cluster of {blocks} blocks here: {e}")
        raise
    np.testing.assert_array_equal(out.read(np.float32), x + y)



def test_synchronize_reports_the_gpu_time_of_the_work(session, device):
    """Synchronize's GPU time ends where the session's last work did, not
    when the Synchronize arrives: a kernel queued, then 100 ms of idle
    time, then Synchronize reports about what the kernel's own
    synchronizing launch reports (and six kernels about six times it)."""
    block = 1024
    cubin, md = _compile(add_kernel, {"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32",
                                      "n": "i32", "BLOCK": "constexpr"},
                         {"BLOCK": block}, ["x_ptr", "y_ptr", "out_ptr"], {"num_warps": 4},
                         arch=_arch(device))
    kernel = gt.load(session, cubin, md)
    n = 1 << 22  # 16 MiB arrays (the test daemon allows 64 MiB in all)
    x, y, out = session.alloc(4 * n), session.alloc(4 * n), session.alloc(4 * n)
    for b in (x, y):
        b.memset(0)
    grid = triton.cdiv(n, block)
    own = min(kernel.launch(grid, x, y, out, n, sync=True) for _ in range(5))
    session.synchronize()
    for queued in (1, 6):
        reported = []
        for _ in range(3):
            for _ in range(queued):
                kernel.launch_async(grid, x, y, out, n)
            time.sleep(0.1)
            reported.append(session.synchronize())
        print(f"{queued} kernel(s), 100 ms idle: Synchronize reports "
              f"{[round(r * 1e6, 1) for r in reported]} us; one synchronizing launch "
              f"{own * 1e6:.1f} us")
        # Idle time after the work is not counted: every report is far
        # below the 100 ms wait. One kernel reports about its own time.
        # Queued kernels report from the first one's start to the last
        # one's end, gaps between their arrivals included (the client's
        # first queued launch may wait for its sender thread): the best of
        # three rounds is within a few launches of the kernels' own.
        assert max(reported) < 0.02
        assert min(reported) < queued * own * 3 + 200e-6
        assert min(reported) >= queued * own * 0.5
