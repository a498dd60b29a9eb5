#!/usr/bin/python3
"""Soak test of gpuexecd: many clients of mixed valid work, some killed
mid-transfer, and the daemon's memory (front process and device workers)
sampled all along and again once every session has gone.

It starts a gpuexecd of its own on 127.0.0.1 (port 0, loopback only), runs
--clients client processes for --seconds (killed clients are started
again), and fails (exit 1) when:

  (a) a client saw an error, or read back data other than it expected, or
      the daemon died or did not exit cleanly;
  (b) the front process, or the workers together, kept growing after the
      warm-up (the first --warmup_frac of the run): the median of the last
      quarter of the samples is above the warm-up's highest sample by more
      than --growth_margin MiB + --growth_frac of it; or the least-squares
      slope after the warm-up is real (above 4 standard errors), above
      --max_slope MiB/min, and rose by more than that margin;
  (c) once the sessions are gone (ListDevices counts none), the RSS is not
      back within the warm-up's highest sample + --after_margin MiB +
      --after_frac of it; device memory in use is above the start's by more
      than --device_margin MiB (the start: after the warm-up sessions, see
      --warmup_sessions); or sessions are still open --drain_s after
      the run. On the test double, whose "device" memory is the worker's
      heap, the workers may also keep the run's peak of device memory. With
      --heap (needs gdb), also when the front's live heap (malloc_stats'
      "in use" bytes) is above the one at the start by more than
      --heap_margin MiB, or the test double still holds device memory.

docs/soak.md says why these thresholds, and what a 10-minute run measured.

  /usr/bin/python3 scripts/soak.py --build build --clients 8 --seconds 60
  /usr/bin/python3 scripts/soak.py --build build --driver libcuda.so.1 --clients 64

Bounded in time (--seconds, then at most --drain_s for the sessions to go)
and in count (--clients processes at a time, --max_kills kills in all).
The clients are in soak_client.py, the views of processes in soak_proc.py.
"""

import argparse
import multiprocessing as mp
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

from soak_client import IDLE, MIB, N_COUNTERS, client_main, warm_up
from soak_proc import (Daemon, children_of, fit, gdb_calls, malloc_totals, median,
                       proc_status_kib, smaps_rollup)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default=None,
                   help="build tree with server/gpuexecd, client/python, tests/kernels and "
                        "tests/fake_cuda (default: ../build next to this script)")
    p.add_argument("--daemon", default=None, help="gpuexecd (default: BUILD/server/gpuexecd)")
    p.add_argument("--driver", default=None,
                   help="driver library (default: the test double in BUILD if there, else "
                        "libcuda.so.1)")
    p.add_argument("--kernels", default=None,
                   help="directory with gx_kernels.cubin (default: BUILD/tests/kernels/fake "
                        "on the double, BUILD/tests/kernels/sm_90 on a driver)")
    p.add_argument("--python_package", default=None,
                   help="directory holding the gpuexec package (default: BUILD/client/python)")
    p.add_argument("--clients", type=int, default=8, help="client processes at a time")
    p.add_argument("--seconds", type=float, default=60, help="length of the run")
    p.add_argument("--sample_s", type=float, default=5, help="seconds between RSS samples")
    p.add_argument("--kill_every_s", type=float, default=2.0,
                   help="how often a client is SIGKILLed, mid-Write/Read when it can be "
                        "caught in one within 3 s (0: never)")
    p.add_argument("--max_kills", type=int, default=10000, help="kills in all, at most")
    p.add_argument("--ring_share", type=float, default=0.0,
                   help="share of the clients' connections made on the daemon's Unix socket "
                        "with command rings (the daemon then serves a Unix socket, a host "
                        "memory socket and rings); the rest use TCP and the Execute stream")
    p.add_argument("--big_mib", type=int, default=16,
                   help="largest transfer in MiB (4%% of operations are 4 MiB to this)")
    p.add_argument("--lease_ms", type=int, default=5000,
                   help="the daemon's --default_lease_ms: how soon killed clients' sessions go "
                        "(short enough to drain fast, long enough that a client starved on a "
                        "busy host keeps its session)")
    p.add_argument("--daemon_arg", action="append", default=[],
                   help="another flag for gpuexecd (repeatable)")
    p.add_argument("--daemon_env", action="append", default=[],
                   help="NAME=VALUE in the daemon's environment (repeatable), e.g. "
                        "MALLOC_ARENA_MAX=2")
    p.add_argument("--warmup_frac", type=float, default=0.3,
                   help="share of the run that is warm-up")
    p.add_argument("--growth_margin", type=float, default=16.0,
                   help="MiB the last quarter's median may exceed the warm-up's highest by ...")
    p.add_argument("--growth_frac", type=float, default=0.10, help="... plus this share of it")
    p.add_argument("--max_slope", type=float, default=2.0,
                   help="MiB/min of significant growth after the warm-up that fails the run")
    p.add_argument("--after_margin", type=float, default=16.0,
                   help="MiB above the warm-up's highest sample that may stay once the sessions "
                        "are gone ...")
    p.add_argument("--after_frac", type=float, default=0.10, help="... plus this share of it")
    p.add_argument("--device_margin", type=float, default=64.0,
                   help="MiB more device memory in use (ListDevices) after the sessions than at "
                        "the start that fails the run")
    p.add_argument("--warmup_sessions", type=int, default=None,
                   help="before the start sample: one session that loads the module and runs "
                        "its kernels, then this many sessions open at once (default --clients), "
                        "each with a launch; device memory is sampled before and after each "
                        "step, which says what the daemon keeps once it has served (its "
                        "module cache, the driver's per-stream resources at their high-water "
                        "mark). 0: none")
    p.add_argument("--heap", action="store_true",
                   help="with gdb: the front's live heap (malloc_stats) at the start and after "
                        "the sessions, then malloc_trim(0) and a 'trimmed' sample (a measurement "
                        "of what the allocator keeps; it changes the daemon's state)")
    p.add_argument("--heap_margin", type=float, default=24.0,
                   help="MiB of live heap the front may hold after the sessions beyond its "
                        "start (the idle read chunks are 16 x --chunk_bytes)")
    p.add_argument("--drain_s", type=float, default=60,
                   help="longest wait for the sessions to go after the run")
    p.add_argument("--settle_s", type=float, default=3,
                   help="wait after the last session went, before the 'after' sample")
    p.add_argument("--hold_s", type=float, default=0,
                   help="keep the idle daemon this long after the 'after' sample (to look at it "
                        "with other tools), then sample it once more")
    p.add_argument("--seed", type=int, default=None, help="random seed (default: the time)")
    p.add_argument("--keep_log", default=None, help="copy the daemon's log to this file")
    p.add_argument("--smaps", action="store_true",
                   help="print the front's /proc/PID/smaps_rollup at its peak and after")
    p.add_argument("--quiet", action="store_true", help="no line per sample while running")
    args = p.parse_args(argv)
    if args.clients < 1 or args.seconds <= 0 or args.sample_s <= 0:
        p.error("--clients, --seconds and --sample_s must be positive")
    return args


def resolve_paths(args):
    here = os.path.dirname(os.path.abspath(__file__))
    build = os.path.abspath(args.build or os.path.join(here, "..", "build"))
    daemon = args.daemon or os.path.join(build, "server", "gpuexecd")
    fake = os.path.join(build, "tests", "fake_cuda", "libgpuexec_fakecuda.so")
    driver = args.driver or (fake if os.path.exists(fake) else "libcuda.so.1")
    on_double = os.path.basename(driver).startswith("libgpuexec_fakecuda")
    kernels = args.kernels or os.path.join(build, "tests", "kernels",
                                           "fake" if on_double else "sm_90")
    package = args.python_package or os.path.join(build, "client", "python")
    cubin = os.path.join(kernels, "gx_kernels.cubin")
    for what, path in (("gpuexecd", daemon), ("kernel image", cubin),
                       ("gpuexec package", os.path.join(package, "gpuexec", "__init__.py"))):
        if not os.path.exists(path):
            sys.exit(f"soak: no {what} at {path} (see --build, --daemon, --kernels, "
                     "--python_package)")
    return daemon, driver, cubin, package, on_double


# ---------------------------------------------------------------- the run

def main(argv):
    args = parse_args(argv)
    daemon_path, driver, cubin, package, on_double = resolve_paths(args)
    sys.path.insert(0, package)
    import gpuexec  # the spawned clients import it from the same path

    seed = args.seed if args.seed is not None else int(time.time())
    rng = random.Random(seed)
    work = tempfile.mkdtemp(prefix="gpuexec-soak-")
    errdir = os.path.join(work, "clients")
    os.mkdir(errdir)

    env = dict(os.environ)
    for kv in args.daemon_env:
        name, _, value = kv.partition("=")
        env[name] = value
    # At info: the line that names the port is an info line.
    argv_d = [daemon_path, "--listen=127.0.0.1:0", f"--driver={driver}",
              f"--default_lease_ms={args.lease_ms}", "--log_level=info"] + args.daemon_arg
    ring_target = None
    if args.ring_share > 0:
        argv_d += [f"--unix_socket={work}/gx.sock", f"--shm_socket={work}/shm.sock",
                   "--command_rings"]
        ring_target = f"unix:{work}/gx.sock"
    daemon = Daemon(argv_d, env, os.path.join(work, "gpuexecd.log"))
    target = f"127.0.0.1:{daemon.port}"
    print(f"soak: gpuexecd pid {daemon.pid} on {target}, driver {os.path.basename(driver)}, "
          f"{args.clients} clients for {args.seconds:g} s, a kill every {args.kill_every_s:g} "
          f"s, lease {args.lease_ms} ms, seed {seed}"
          + (f", env {' '.join(args.daemon_env)}" if args.daemon_env else ""), flush=True)

    control = gpuexec.connect(target, timeout=30)

    def devices():
        """(sessions open, device memory in use in MiB) over all devices."""
        try:
            ds = control.devices()
        except gpuexec.Error:
            return -1, 0.0
        return (sum(d.sessions for d in ds),
                sum(d.memory_total_bytes - d.memory_free_bytes for d in ds) / MIB)

    def device_detail():
        """What may hold device memory: modules, workers, and each process's
        share as nvidia-smi sees it (on a driver)."""
        try:
            ds = control.devices()
        except gpuexec.Error as e:
            return f"ListDevices failed: {e.code.name}"
        text = "; ".join(f"device {d.index}: {d.modules_loaded} modules loaded, "
                         f"{d.workers} workers, "
                         f"{(d.memory_total_bytes - d.memory_free_bytes) / MIB:.1f} MiB in use"
                         for d in ds)
        if shutil.which("nvidia-smi"):
            smi = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                                  "--format=csv,noheader"], capture_output=True, text=True)
            text += "; nvidia-smi per process: " + (
                ", ".join(smi.stdout.split("\n")).strip(", ") or "(none)")
        return text

    def live_sessions():
        return devices()[0]

    heap = {}

    def measure_heap(when, trim=False):
        calls = ["(void)malloc_stats()"] + (["(int)malloc_trim(0)"] if trim else [])
        got = gdb_calls(daemon.pid, daemon.logpath, calls)
        totals = malloc_totals(got[1]) if got else None
        if totals is None:
            print(f"soak: --heap: could not read the front's heap ({when}): is gdb installed, "
                  "and may it attach?", flush=True)
            return
        heap[when] = totals
        if on_double:
            for w in children_of(daemon.pid):
                got = gdb_calls(w, daemon.logpath, ["(unsigned long)gxfake_bytes_allocated()"])
                if got:
                    heap.setdefault(f"{when} double", 0)
                    heap[f"{when} double"] += got[0][0]

    ctx = mp.get_context("spawn")  # no fork of a process that holds gRPC threads
    counters = ctx.Array("q", args.clients * N_COUNTERS, lock=False)
    states = ctx.Array("b", args.clients, lock=False)
    stop = ctx.Value("b", 0, lock=False)
    gone = [0] * N_COUNTERS  # counts of clients whose slot was reused
    kills = {"mid": 0, "other": 0}
    procs = [None] * args.clients
    lock = threading.Lock()

    def retire(slot):
        for k in range(N_COUNTERS):
            gone[k] += counters[slot * N_COUNTERS + k]
            counters[slot * N_COUNTERS + k] = 0
        states[slot] = IDLE

    def spawn(slot, deadline):
        p = ctx.Process(target=client_main, daemon=True,
                        args=(slot, target, ring_target, args.ring_share, cubin, args.big_mib,
                              args.lease_ms / 1000, deadline, stop, counters, states, errdir,
                              rng.randrange(1 << 62)))
        p.start()
        procs[slot] = p

    def totals():
        t = list(gone)
        for slot in range(args.clients):
            for k in range(N_COUNTERS):
                t[k] += counters[slot * N_COUNTERS + k]
        return t

    t0 = [time.time()]

    def sample(label=None):
        front = proc_status_kib(daemon.pid, ("VmRSS", "RssAnon", "RssShmem")) or {}
        workers = [w for w in (proc_status_kib(c) for c in children_of(daemon.pid)) if w]
        ops, errors, mismatches, on_rings = totals()
        sessions, device_mib = devices()
        return {"t": time.time() - t0[0], "label": label,
                "front": front.get("VmRSS", 0) / 1024, "anon": front.get("RssAnon", 0) / 1024,
                "shmem": front.get("RssShmem", 0) / 1024,
                "workers": sum(w["VmRSS"] for w in workers) / 1024,
                "device": device_mib, "sessions": sessions, "ops": ops,
                "errors": errors + mismatches, "on_rings": on_rings,
                "kills": kills["mid"] + kills["other"]}

    header = (f"{'t (s)':>7} {'front MiB':>9} {'(anon)':>7} {'(shm)':>6} {'workers MiB':>11} "
              f"{'device MiB':>10} {'sessions':>8} {'ops':>9} {'errors':>6} {'kills':>5}")

    def row(s):
        t = s["label"] or f"{s['t']:.0f}"
        return (f"{t:>7} {s['front']:9.1f} {s['anon']:7.1f} {s['shmem']:6.1f} "
                f"{s['workers']:11.1f} {s['device']:10.1f} {s['sessions']:8d} {s['ops']:9d} "
                f"{s['errors']:6d} "
                f"{s['kills']:5d}")

    samples = []

    def record(label=None):
        s = sample(label)
        samples.append(s)
        if not args.quiet:
            print(row(s), flush=True)
        return s

    if args.heap:
        measure_heap("start")
    if not args.quiet:
        print(header)
    warmup = warm_up(control, gpuexec, cubin, args.clients if args.warmup_sessions is None
                     else args.warmup_sessions, devices)
    record("start")
    t0[0] = start = time.time()
    deadline = start + args.seconds
    for slot in range(args.clients):
        spawn(slot, deadline)

    def killer():
        next_kill = time.time() + args.kill_every_s
        while kills["mid"] + kills["other"] < args.max_kills:
            time.sleep(max(0.0, next_kill - time.time()))
            if time.time() >= deadline - 1 or stop.value:
                return
            next_kill += args.kill_every_s
            slot = rng.randrange(args.clients)
            until = time.time() + 3
            while states[slot] == IDLE and time.time() < until:
                time.sleep(0.001)
            time.sleep(rng.random() * 0.003)  # somewhere into the transfer
            with lock:
                p = procs[slot]
                if not p.is_alive() or time.time() >= deadline - 1 or stop.value:
                    continue
                mid = states[slot] != IDLE
                os.kill(p.pid, signal.SIGKILL)
                p.join()
                kills["mid" if mid else "other"] += 1
                retire(slot)
                spawn(slot, deadline)

    kill_thread = None
    if args.kill_every_s > 0:
        kill_thread = threading.Thread(target=killer, daemon=True)
        kill_thread.start()

    peak_smaps, peak_front = None, 0.0
    next_sample = start + args.sample_s
    crashed = 0
    died = None
    while True:
        now = time.time()
        if daemon.proc.poll() is not None:
            died = (now - start, daemon.proc.returncode)
            print(f"soak: gpuexecd exited with {died[1]} at {died[0]:.1f} s; the run stops",
                  flush=True)
            break
        if now >= next_sample:
            s = record()
            if args.smaps and s["front"] > peak_front:
                peak_front, peak_smaps = s["front"], smaps_rollup(daemon.pid)
            next_sample += args.sample_s
        if next_sample > deadline + 0.5 * args.sample_s:
            break
        with lock:
            for slot, p in enumerate(procs):
                # A client that died by itself (not by our SIGKILL) is an error.
                if not p.is_alive() and p.exitcode != 0 and time.time() < deadline - 1:
                    print(f"soak: client {slot} (pid {p.pid}) exited with {p.exitcode}",
                          flush=True)
                    crashed += 1
                    retire(slot)
                    spawn(slot, deadline)
        time.sleep(min(0.2, max(0.0, next_sample - time.time())))
    run_samples = [s for s in samples if s["label"] is None]

    # The end: clients finish the operation they are in and close their
    # sessions; the killed clients' sessions lapse.
    stop.value = 1
    if kill_thread is not None:
        kill_thread.join()
    for p in procs:
        if died is not None:
            p.kill()  # no daemon to finish with
        p.join(60)
        if p.is_alive():
            print(f"soak: client pid {p.pid} still running 60 s after the end; killed")
            crashed += 1
            p.kill()
            p.join()
        elif p.exitcode != 0 and died is None:
            crashed += 1
    end = record("end")
    drain_deadline = time.time() + (args.drain_s if died is None else 0)
    sessions = end["sessions"]
    while sessions != 0 and time.time() < drain_deadline:
        time.sleep(0.5)
        sessions = live_sessions()
    drained_in = time.time() - (start + end["t"])
    # How soon device memory is back within --device_margin of the start
    # once the last session has gone (the pool is trimmed as each closes).
    device_back_in = None
    if sessions == 0:
        last_gone = time.time()
        while time.time() - last_gone <= 10.0:
            if devices()[1] - samples[0]["device"] <= args.device_margin:
                device_back_in = time.time() - last_gone
                break
            time.sleep(0.25)
    time.sleep(args.settle_s)
    after = record("after")
    print("soak: after the sessions: " + device_detail(), flush=True)
    after_smaps = smaps_rollup(daemon.pid) if args.smaps else None
    if args.hold_s > 0:
        print(f"soak: holding the idle daemon (pid {daemon.pid}, workers "
              f"{children_of(daemon.pid)}) for {args.hold_s:g} s", flush=True)
        time.sleep(args.hold_s)
        record("held")
        print("soak: held: " + device_detail(), flush=True)
    if args.heap and died is None:
        measure_heap("after", trim=True)
        if "after" in heap:
            time.sleep(1)
            record("trimmed")
    control.close()
    rc = daemon.stop()

    # ---- report
    total_ops, total_errors = after["ops"], after["errors"]
    print()
    print(f"soak: {total_ops} operations, {total_errors} errors, {kills['mid']} clients killed "
          f"mid-transfer and {kills['other']} between operations; sessions gone "
          f"{drained_in:.1f} s after the run; daemon exit status {rc}")
    if ring_target is not None:
        print(f"soak: {after['on_rings']} sessions ran their commands through a command ring")
    print(header)
    for s in samples:
        print(row(s))
    errors = []
    for name in sorted(os.listdir(errdir)):
        with open(os.path.join(errdir, name)) as f:
            errors += [f"{name}: {line.rstrip()}" for line in f]
    for line in errors[:20]:
        print("  " + line)
    if len(errors) > 20:
        print(f"  ... and {len(errors) - 20} more")

    failures = []
    if total_errors or errors or crashed:
        failures.append(f"(a) {total_errors} client errors or mismatches, {crashed} clients "
                        "exited badly")
    if died is not None:
        failures.append(f"(a) gpuexecd died during the run ({died[0]:.0f} s in), exit status "
                        f"{died[1]}" + (f" (signal {-died[1]})" if died[1] < 0 else ""))
    elif rc != 0:
        failures.append(f"(a) gpuexecd exited with {rc}")
    if ring_target is not None and after["on_rings"] == 0:
        failures.append("(a) no session's commands went through a command ring")
    if sessions != 0 and died is None:
        failures.append(f"(c) {sessions} sessions still open {args.drain_s:g} s after the run")
    warm_end = args.warmup_frac * args.seconds
    warm = [s for s in run_samples if s["t"] <= warm_end] or run_samples[:1]
    post = [s for s in run_samples if s["t"] > warm_end]
    last_quarter = run_samples[-max(3, len(run_samples) // 4):]
    # On the test double a worker's heap holds the device memory, and what
    # it freed may stay there (allocator retention): the workers may keep the
    # run's peak of device memory on top of the margins.
    peak_device = max(0.0, max(s["device"] for s in run_samples) - samples[0]["device"])
    for key in ("front", "workers"):
        extra = peak_device if key == "workers" and on_double else 0.0
        warm_max = max(s[key] for s in warm)
        tail_median = median([s[key] for s in last_quarter])
        slope, se = fit([(s["t"], s[key]) for s in post])
        span_min = (post[-1]["t"] - post[0]["t"]) / 60 if len(post) > 1 else 0.0
        grow_limit = warm_max * (1 + args.growth_frac) + args.growth_margin + extra
        after_limit = warm_max * (1 + args.after_frac) + args.after_margin + extra
        print(f"soak: {key}: {samples[0][key]:.1f} MiB at the start; warm-up max {warm_max:.1f}; "
              f"peak {max(s[key] for s in run_samples):.1f}; last quarter's median "
              f"{tail_median:.1f} (limit {grow_limit:.1f}); slope after the warm-up "
              f"{slope:+.2f} +- {se:.2f} MiB/min, {slope * span_min:+.1f} MiB over "
              f"{span_min:.1f} min; after the sessions {after[key]:.1f} (limit {after_limit:.1f})")
        if tail_median > grow_limit:
            failures.append(f"(b) {key}: the last quarter's median, {tail_median:.1f} MiB, is "
                            f"above the warm-up's {warm_max:.1f} + margin ({grow_limit:.1f})")
        # A trend fails the run when it is real (4 standard errors), steeper
        # than --max_slope, and rose by more than the margin after the warm-up.
        if (len(post) >= 6 and slope > args.max_slope and slope > 4 * se
                and slope * span_min > grow_limit - warm_max):
            failures.append(f"(b) {key} grows {slope:.2f} +- {se:.2f} MiB/min after the warm-up "
                            f"({slope * span_min:+.1f} MiB)")
        if after[key] > after_limit:
            failures.append(f"(c) {key} holds {after[key]:.1f} MiB after the sessions went, "
                            f"above {after_limit:.1f}")
    if warmup:
        cold, module, streams = warmup
        print(f"soak: device memory before any session {cold:.1f} MiB; after one session that "
              f"loaded the module and ran its kernels {module:.1f} ({module - cold:+.1f}); after "
              f"{args.clients if args.warmup_sessions is None else args.warmup_sessions} "
              f"sessions at once {streams:.1f} ({streams - module:+.1f}): the start")
    device_kept = after["device"] - samples[0]["device"]
    print(f"soak: device memory in use: {samples[0]['device']:.1f} MiB at the start, peak "
          f"{max(s['device'] for s in run_samples):.1f}, after the sessions {after['device']:.1f}; "
          + (f"within {args.device_margin:g} MiB of the start {device_back_in:.2f} s after the "
             "last session went" if device_back_in is not None
             else f"not within {args.device_margin:g} MiB of the start 10 s after the last "
             "session went"))
    if died is None and device_kept > args.device_margin:
        failures.append(f"(c) {device_kept:.1f} MiB more device memory in use after the sessions "
                        f"than at the start (limit {args.device_margin:g})")
    if "start" in heap and "after" in heap:
        (sys0, use0), (sys1, use1) = heap["start"], heap["after"]
        trimmed = [s for s in samples if s["label"] == "trimmed"][0]
        print(f"soak: front heap (malloc_stats): at the start {sys0 / MIB:.1f} MiB from the "
              f"system, {use0 / MIB:.1f} in use; after the sessions {sys1 / MIB:.1f} from the "
              f"system, {use1 / MIB:.1f} in use; after malloc_trim(0) RSS {trimmed['front']:.1f} "
              f"MiB ({trimmed['anon']:.1f} anonymous)")
        if (use1 - use0) / MIB > args.heap_margin:
            failures.append(f"(c) the front's live heap grew by {(use1 - use0) / MIB:.1f} MiB "
                            f"(limit {args.heap_margin:g})")
        if "after double" in heap:
            print(f"soak: the test double holds {heap['after double']} bytes of device memory "
                  "after the sessions")
            if heap["after double"] != 0:
                failures.append(f"(c) the test double still holds {heap['after double']} bytes")
    if args.smaps:
        print("\nfront smaps_rollup at its peak:\n" + (peak_smaps or "(none)"))
        print("front smaps_rollup after the sessions:\n" + after_smaps)
    if args.keep_log:
        shutil.copyfile(daemon.logpath, args.keep_log)
    if died is not None:
        with open(daemon.logpath, "rb") as f:
            lines = f.read().decode(errors="replace").splitlines()
        print("soak: the daemon's last log lines:")
        for line in lines[-10:]:
            print("  " + line)
    if failures:
        print("soak: FAILED: " + "; ".join(failures))
        print(f"soak: the daemon's log and the clients' errors are in {work}")
        return 1
    print("soak: PASSED")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
