#!/usr/bin/python3
"""What holds device memory once a daemon's sessions are gone.

Starts a gpuexecd of its own (loopback, port 0), then runs one kind of work
at a time and reads the device memory in use (ListDevices: total less free)
before it, right after its sessions end, and again once it settles (no
change for 1 s, at most --settle_s). Each row is one kind of work; its
"kept" column is what stayed in use after it, so the row that keeps memory
names what holds it.

  /usr/bin/python3 scripts/device_memory_probe.py --build build
  python3 scripts/device_memory_probe.py --daemon B/bin/gpuexecd --driver libcuda.so.1 \\
      --kernels B/kernels/sm_90 --python_package B/python

Exit status 1 when a row keeps more than --margin MiB, or the device holds
more than --margin MiB above the start after every row, else 0. The first
round of 64 sessions at once is the exception: the driver keeps its
per-stream resources at the high-water mark of streams alive at once (16
MiB on an H200, 20 on an H100), so that round may keep up to
--high_water_mib, and the end's check allows what it kept beyond what the
same round again keeps (which must be within --margin): a leak of every
round still counts in full. Bounded: each row's work is fixed, and each
wait is at most --settle_s.
"""

import argparse
import os
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from soak import Daemon, resolve_paths  # noqa: E402  (the same daemon and paths as the soak)

MIB = 1 << 20


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build", default=None)
    p.add_argument("--daemon", default=None)
    p.add_argument("--driver", default=None)
    p.add_argument("--kernels", default=None)
    p.add_argument("--python_package", default=None)
    p.add_argument("--daemon_arg", action="append", default=[])
    p.add_argument("--settle_s", type=float, default=10.0,
                   help="longest wait for device memory to settle after each row")
    p.add_argument("--margin", type=float, default=16.0,
                   help="MiB a row may keep, and above the start the device may hold after "
                        "every row (less the high-water round's)")
    p.add_argument("--high_water_mib", type=float, default=32.0,
                   help="MiB the first round of 64 sessions at once may keep (the driver's "
                        "once-only cost of that many streams: 16 MiB on an H200, 20 on an H100)")
    return p.parse_args(argv)


def main(argv):
    args = parse_args(argv)
    daemon_path, driver, cubin, package, _ = resolve_paths(args)
    sys.path.insert(0, package)
    import gpuexec
    import numpy as np

    work = tempfile.mkdtemp(prefix="gpuexec-memprobe-")
    argv_d = [daemon_path, "--listen=127.0.0.1:0", f"--driver={driver}",
              "--default_lease_ms=2000", "--log_level=info"] + args.daemon_arg
    daemon = Daemon(argv_d, dict(os.environ), os.path.join(work, "gpuexecd.log"))
    target = f"127.0.0.1:{daemon.port}"
    control = gpuexec.connect(target, timeout=30)

    def in_use():
        d = control.devices()[0]
        return (d.memory_total_bytes - d.memory_free_bytes) / MIB, d.sessions

    def settle():
        """Device MiB in use once no session is open and the figure held for 1 s."""
        deadline = time.time() + args.settle_s
        last, since = None, time.time()
        while True:
            used, sessions = in_use()
            if used != last or sessions != 0:
                last, since = used, time.time()
            if time.time() - since >= 1.0 or time.time() > deadline:
                return used, time.time() - (deadline - args.settle_s)
            time.sleep(0.1)

    def empty_session():
        with control.session() as s:
            s.synchronize()

    def alloc_free():
        with control.session() as s:
            bufs = [s.alloc(16 * MIB) for _ in range(64)]
            for b in bufs:
                b.free()

    def kernels():
        with control.session() as s:
            mod = s.load_module(cubin)
            fill, saxpy = mod.function("gx_fill_u32"), mod.function("gx_saxpy")
            n = 1 << 20
            b = s.alloc(n * 4)
            fill.launch(n // 256, 256, b, gpuexec.u32(7), gpuexec.u64(n), sync=True)
            y = s.alloc(n * 4)
            saxpy.launch(n // 256, 256, gpuexec.f32(2.0), b, y, gpuexec.u64(n), sync=True)

    def transfers():
        with control.session() as s:
            data = np.arange(16 * MIB // 4, dtype=np.uint32)
            b = s.alloc(data.nbytes)
            b.write(data)
            b.memset(3)
            c = s.alloc(data.nbytes)
            c.copy_from(b)
            c.read()

    def many_sessions():
        errors = []

        def one():
            try:
                with gpuexec.connect(target, timeout=30) as c, c.session() as s:
                    b = s.alloc(8 * MIB)
                    b.write(np.ones(2 * MIB, np.uint32))
                    b.read()
            except Exception as e:  # reported below
                errors.append(e)
        threads = [threading.Thread(target=one) for _ in range(64)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]

    def abandoned():
        # A client that vanishes: its session lapses with its lease.
        c = gpuexec.connect(target, timeout=30)
        s = c.session(lease=1.0)
        s.alloc(64 * MIB)
        time.sleep(3.0)

    # (name, work, whether it is a round of 64 sessions at once)
    rows = [("an empty session", empty_session, False),
            ("64 x 16 MiB allocated and freed", alloc_free, False),
            ("gx_kernels loaded, gx_fill_u32 and gx_saxpy run", kernels, False),
            ("the same kernels again (module kept loaded)", kernels, False),
            ("16 MiB written, memset, copied, read", transfers, False),
            ("64 sessions at once, 8 MiB written and read each", many_sessions, True),
            # What the first round kept and the second does not add is the
            # driver's once-only cost of that many streams at once, not a leak.
            ("the same 64 sessions again", many_sessions, True),
            ("a session left to lapse (64 MiB)", abandoned, False)]
    start, _ = settle()
    print(f"device memory in use at the start: {start:.1f} MiB")
    print("| work | before MiB | right after | settled | kept (vs before) | vs start | settle s |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    failed = []
    # The first 64-session round that ran: what it keeps beyond what the
    # same round again keeps is the driver's high-water mark, allowed at the
    # end; the rest of it (a leak of every round) counts as a leak.
    first_many, repeat_many = None, None
    for name, work_fn, many in rows:
        before, _ = settle()
        try:
            work_fn()
        except gpuexec.Error as e:
            print(f"| {name} | failed: {e} |")
            failed.append(f"{name}: {e.code.name}")
            continue
        right_after, _ = in_use()
        settled, took = settle()
        kept = settled - before
        print(f"| {name} | {before:.1f} | {right_after:.1f} | {settled:.1f} | "
              f"{kept:+.1f} | {settled - start:+.1f} | {took:.1f} |", flush=True)
        if many and first_many is None:
            first_many = kept
            if kept > args.high_water_mib:
                failed.append(f"{name} kept {kept:.1f} MiB (high-water bound "
                              f"{args.high_water_mib:g})")
            continue
        if many and repeat_many is None:
            repeat_many = kept
        if kept > args.margin:
            failed.append(f"{name} kept {kept:.1f} MiB (margin {args.margin:g})")
    high_water = 0.0
    if first_many is not None:
        high_water = max(first_many - max(repeat_many or 0.0, 0.0), 0.0)
        if repeat_many is None:
            failed.append("no second round of 64 sessions ran: the first round's keep cannot be "
                          "told from a leak")
    end, _ = settle()
    print(f"device memory in use at the end: {end:.1f} MiB ({end - start:+.1f} against the start, "
          f"of which {high_water:.1f} the driver's high-water mark: what the first 64-session "
          f"round kept beyond the second's; margin {args.margin:g})")
    if end - start - high_water > args.margin:
        failed.append(f"the end holds {end - start - high_water:.1f} MiB above the start and the "
                      f"high-water mark (margin {args.margin:g})")
    control.close()
    rc = daemon.stop()
    if rc != 0:
        failed.append(f"gpuexecd exited with {rc}")
    for why in failed:
        print(f"FAILED: {why}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
