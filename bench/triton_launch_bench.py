"""What a cached ``kernel[grid](...)`` costs the host through gpuexec's
Triton driver, against Triton's own launcher on this host's GPU (torch
tensors) and against the package's own Function.launch_async, in one run.

    python3 triton_launch_bench.py --target=unix:/path/d.sock [--calls=20000]

Rows (per call, wall time of the calling thread; medians of 5 rounds):
- enqueue: a loop of asynchronous calls, the work synchronized after the
  loop (not timed); and launches per second over the loop plus that
  synchronize;
- launch + synchronize: one call then a synchronize, p50 and p99.
Ratios are printed against Triton's own launcher (enqueue) and against the
package's Function.launch (launch + synchronize). Needs Triton; the torch
rows need torch with a GPU (else they are left out, said so).
"""

import argparse
import statistics
import sys
import time

import numpy as np
import triton
import triton.language as tl

import gpuexec
import gpuexec.triton


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask),
             mask=mask)


N = 4096
BLOCK = 1024
GRID = (N // BLOCK,)


def _enqueue(call, sync, calls, rounds=5):
    """(us per call, launches per second) medians of ``rounds``."""
    per_call, rates = [], []
    for _ in range(rounds):
        sync()
        t0 = time.perf_counter()
        for _ in range(calls):
            call()
        t1 = time.perf_counter()
        sync()
        t2 = time.perf_counter()
        per_call.append((t1 - t0) / calls * 1e6)
        rates.append(calls / (t2 - t0))
    return statistics.median(per_call), statistics.median(rates)


def _round_trips(call, sync, count):
    times = []
    for _ in range(count):
        t0 = time.perf_counter()
        call()
        sync()
        times.append((time.perf_counter() - t0) * 1e6)
    times.sort()
    return times[len(times) // 2], times[int(len(times) * 0.99)]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", required=True)
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--round-trips", type=int, default=2000)
    parser.add_argument("--profile", action="store_true",
                        help="also print where a kernel[grid] call's host time goes")
    args = parser.parse_args()
    rows = {}

    # Triton's own launcher on this host's GPU, with torch tensors.
    try:
        import torch  # pylint: disable=import-outside-toplevel
        have_torch = torch.cuda.is_available()
    except ImportError:
        have_torch = False
    if have_torch:
        x = torch.randn(N, device="cuda")
        y = torch.randn(N, device="cuda")
        out = torch.empty_like(x)
        call = lambda: add_kernel[GRID](x, y, out, N, BLOCK=BLOCK)  # noqa: E731
        call()
        torch.cuda.synchronize()
        assert torch.equal(out, x + y)
        rows["triton_local_enqueue"] = _enqueue(call, torch.cuda.synchronize, args.calls)
        rows["triton_local_sync"] = _round_trips(call, torch.cuda.synchronize,
                                                 args.round_trips)
        # The driver was the CUDA one; gpuexec's replaces it below.
    else:
        print("torch with a GPU is not available: Triton's own launcher is not measured")

    with gpuexec.connect(args.target) as client, client.session() as s:
        gpuexec.triton.activate(s)
        rng = np.random.default_rng(0)
        xh = rng.standard_normal(N, dtype=np.float32)
        yh = rng.standard_normal(N, dtype=np.float32)
        xb, yb = s.asarray(xh), s.asarray(yh)
        ob = s.empty_like(xb)
        call = lambda: add_kernel[GRID](xb, yb, ob, N, BLOCK=BLOCK)  # noqa: E731
        compiled = add_kernel[GRID](xb, yb, ob, N, BLOCK=BLOCK)
        s.synchronize()
        assert np.array_equal(ob.get(), xh + yh)
        rows["gpuexec_driver_enqueue"] = _enqueue(call, s.synchronize, args.calls)
        rows["gpuexec_driver_sync"] = _round_trips(call, s.synchronize, args.round_trips)
        # The same cubin through the package's own Function.
        kernel = gpuexec.triton.load(s, compiled.asm["cubin"], compiled.metadata._asdict())
        function = kernel.function
        block, shared = kernel.block, kernel.shared
        launch_async = lambda: function.launch_async(  # noqa: E731
            GRID, block, xb, yb, ob, N, None, None, shared=shared)
        launch_sync = lambda: function.launch(  # noqa: E731
            GRID, block, xb, yb, ob, N, None, None, shared=shared, sync=True)
        rows["function_launch_async"] = _enqueue(launch_async, s.synchronize, args.calls)
        rows["function_launch_sync"] = _round_trips(launch_sync, lambda: None,
                                                    args.round_trips)
        rows["function_async_then_sync"] = _round_trips(launch_async, s.synchronize,
                                                        args.round_trips)
        if args.profile:
            import cProfile  # pylint: disable=import-outside-toplevel
            import pstats  # pylint: disable=import-outside-toplevel
            profile = cProfile.Profile()
            profile.enable()
            for _ in range(3000):
                call()
            profile.disable()
            s.synchronize()
            pstats.Stats(profile).sort_stats("tottime").print_stats(18)

    print(f"Triton {triton.__version__}, gpuexec {gpuexec.__version__}, {N} floats, "
          f"grid {GRID[0]}, {args.calls} calls x 5 rounds")
    print("| path | host us per async call | launches/s | launch+sync p50 us | p99 us |")
    print("| --- | --- | --- | --- | --- |")
    for name, enqueue, sync in (("Triton's launcher, torch, local GPU", "triton_local_enqueue",
                                 "triton_local_sync"),
                                ("gpuexec Triton driver, kernel[grid]",
                                 "gpuexec_driver_enqueue", "gpuexec_driver_sync"),
                                ("gpuexec Function.launch_async / launch(sync)",
                                 "function_launch_async", "function_launch_sync")):
        if enqueue not in rows:
            continue
        us, rate = rows[enqueue]
        p50, p99 = rows[sync]
        print(f"| {name} | {us:.2f} | {rate:,.0f} | {p50:.1f} | {p99:.1f} |")
    if "triton_local_enqueue" in rows:
        print(f"ratio host cost, gpuexec driver / Triton local: "
              f"{rows['gpuexec_driver_enqueue'][0] / rows['triton_local_enqueue'][0]:.2f} "
              "(goal <= 1.0)")
    print(f"ratio host cost, gpuexec driver / Function.launch_async: "
          f"{rows['gpuexec_driver_enqueue'][0] / rows['function_launch_async'][0]:.2f}")
    p50, p99 = rows["function_async_then_sync"]
    print(f"Function.launch_async then synchronize: p50 {p50:.1f} us, p99 {p99:.1f} us")
    print(f"ratio launch+sync p50, gpuexec driver / Function.launch_async + synchronize: "
          f"{rows['gpuexec_driver_sync'][0] / p50:.2f}")
    print(f"ratio launch+sync p50, gpuexec driver / Function.launch(sync=True): "
          f"{rows['gpuexec_driver_sync'][0] / rows['function_launch_sync'][0]:.2f} "
          "(goal <= 1.2)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
