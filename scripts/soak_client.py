"""The soak's clients (scripts/soak.py): each a process of sessions of mixed
work, and the warm-up that measures device memory before the run."""

import os
import random
import signal
import time

MIB = 1 << 20

# A client's state, shared with the parent so that it can kill one while it
# is inside a Write or a Read.
IDLE, WRITING, READING = 0, 1, 2
# Shared counters per client slot: operations, errors, mismatches, and the
# sessions whose commands went through a command ring.
N_COUNTERS = 4


class Mismatch(Exception):
    pass


def client_main(slot, target, ring_target, ring_share, cubin, big_mib, lease_s, deadline, stop,
                counters, states, errdir, seed):
    """One client process: sessions of mixed work until ``deadline`` or ``stop``."""
    import numpy as np
    import gpuexec

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    rng = random.Random(seed)
    nprng = np.random.default_rng(seed)
    base = slot * N_COUNTERS
    errlog = open(os.path.join(errdir, f"client-{slot}-{os.getpid()}.log"), "a", buffering=1)

    def op(n=1):
        counters[base] += n

    def size_bytes():
        r = rng.random()
        if r < 0.04:
            return rng.randint(4, big_mib) * MIB
        if r < 0.25:
            return rng.randint(256 << 10, 4 * MIB) & ~3
        return rng.randint(1, 64 << 10) * 4

    def transfer(state, fn, *a, **kw):
        states[slot] = state
        try:
            return fn(*a, **kw)
        finally:
            states[slot] = IDLE

    def check(ok, what):
        if not ok:
            raise Mismatch(what)

    def one_session(client):
        # Mostly the daemon's default lease; some ask for one, never a
        # shorter one (a client starved on a busy host would lose it).
        lease = None if rng.random() < 0.9 else rng.choice((1.0, 2.0)) * lease_s
        s = client.session(lease=lease)
        op()
        abandon = rng.random() < 0.05  # left for its lease to close
        try:
            mod = s.load_module(cubin)
            op(1 if not mod.uploaded else 2)
            fill = mod.function("gx_fill_u32")
            saxpy = mod.function("gx_saxpy")
            op(2)
            kept = []
            for _ in range(rng.randint(3, 25)):
                if stop.value or time.time() > deadline:
                    break
                kind = rng.random()
                nbytes = size_bytes()
                if kind < 0.25:  # fill on the device, read back
                    n = nbytes // 4
                    value = rng.randrange(1 << 32)
                    buf = s.alloc(n * 4)
                    op()
                    fill.launch(min((n + 255) // 256, 4096), 256, buf, gpuexec.u32(value),
                                gpuexec.u64(n), sync=rng.random() < 0.3)
                    op()
                    out = np.empty(n, np.uint32)
                    transfer(READING, buf.read_into, out)
                    op()
                    check(bool((out == value).all()), f"gx_fill_u32 of {n} x {value:#x}")
                elif kind < 0.5:  # saxpy: exact in float32 (small integers, a power of two)
                    n = max(nbytes // 4, 1)
                    a = rng.choice((2.0, 0.5, -4.0, 1.0))
                    x = nprng.integers(-2048, 2048, n).astype(np.float32)
                    y = nprng.integers(-2048, 2048, n).astype(np.float32)
                    bx = s.alloc(n * 4, dtype=np.float32)
                    by = s.alloc(n * 4, dtype=np.float32)
                    op(2)
                    transfer(WRITING, bx.write, x)
                    transfer(WRITING, by.write, y)
                    op(2)
                    saxpy.launch(min((n + 255) // 256, 4096), 256, gpuexec.f32(a), bx, by,
                                 gpuexec.u64(n))
                    op()
                    got = transfer(READING, by.read, np.float32)
                    op()
                    check(np.array_equal(got, np.float32(a) * x + y), f"gx_saxpy of {n}")
                    buf = by
                    bx.free()
                    op()
                elif kind < 0.8:  # bytes there and back, at an offset
                    data = nprng.integers(0, 256, nbytes, dtype=np.uint8)
                    offset = rng.choice((0, 0, 4096, rng.randrange(0, 1 << 16)))
                    buf = s.alloc(nbytes + offset)
                    op()
                    transfer(WRITING, buf.write, data, offset)
                    op()
                    if rng.random() < 0.5:
                        got = np.frombuffer(transfer(READING, buf.read, offset=offset,
                                                     size=nbytes), np.uint8)
                    else:
                        got = np.empty(nbytes, np.uint8)
                        transfer(READING, buf.read_into, got, offset)
                    op()
                    check(np.array_equal(got, data), f"{nbytes} bytes at {offset}")
                else:  # memset, a device-to-device copy, read the copy
                    value = rng.randrange(256)
                    src = s.alloc(nbytes)
                    dst = s.alloc(nbytes)
                    op(2)
                    src.memset(value)
                    dst.copy_from(src)
                    op(2)
                    got = np.frombuffer(transfer(READING, dst.read), np.uint8)
                    op()
                    check(bool((got == value).all()), f"memset/copy of {nbytes} x {value}")
                    src.free()
                    op()
                    buf = dst
                if rng.random() < 0.7:
                    buf.free()
                    op()
                else:
                    kept.append(buf)  # freed by the session's close (or lapse)
            if rng.random() < 0.2:
                s.synchronize()
                op()
            if rng.random() < 0.1:
                s.keep_alive()
                op()
        finally:
            states[slot] = IDLE
            # Whether the session's commands rode its ring (the package's
            # own record of it; a ring the daemon closed counts too).
            commands = getattr(s, "_commands", None)
            if getattr(commands, "_ring", None) is not None:
                counters[base + 3] += 1
            if not abandon:
                s.close()
                op()

    while not stop.value and time.time() < deadline:
        try:
            on_ring = ring_target is not None and rng.random() < ring_share
            with gpuexec.connect(ring_target if on_ring else target, timeout=30,
                                 command_ring=on_ring) as client:
                for _ in range(rng.randint(1, 5)):
                    if stop.value or time.time() > deadline:
                        break
                    one_session(client)
        except gpuexec.Error as e:
            counters[base + 1] += 1
            errlog.write(f"{time.time():.3f} error {e.code.name}: {e.message}\n")
            time.sleep(0.1)
        except Mismatch as e:
            counters[base + 2] += 1
            errlog.write(f"{time.time():.3f} mismatch: {e}\n")
    errlog.close()


def warm_up(control, gpuexec, cubin, sessions, devices):
    """Device memory in use (MiB) before any session, after one that loaded
    the module and ran its kernels, and after `sessions` at once; None when
    `sessions` is 0."""
    if sessions <= 0:
        return None
    import numpy as np
    cold = devices()[1]
    s = control.session()
    mod = s.load_module(cubin)
    fill, saxpy = mod.function("gx_fill_u32"), mod.function("gx_saxpy")
    x, y = s.alloc(1 << 20, dtype=np.float32), s.alloc(1 << 20, dtype=np.float32)
    fill.launch(1024, 256, x, gpuexec.u32(0), gpuexec.u64(1 << 18))
    saxpy.launch(1024, 256, gpuexec.f32(2.0), x, y, gpuexec.u64(1 << 18), sync=True)
    s.close()
    module = devices()[1]
    opened = []
    try:
        for _ in range(sessions):
            o = control.session()
            opened.append(o)
            b = o.alloc(4096)
            o.load_module(cubin).function("gx_fill_u32").launch(1, 256, b, gpuexec.u32(1),
                                                                 gpuexec.u64(1024))
        for o in opened:
            o.synchronize()
    finally:
        for o in opened:
            o.close()
    time.sleep(0.5)
    return cold, module, devices()[1]
