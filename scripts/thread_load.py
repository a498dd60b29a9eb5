#!/usr/bin/env python3
"""How busy each thread of some processes was while a command ran.

    scripts/thread_load.py PID[,PID...] -- COMMAND [ARGS...]

Reads every thread's user + system time from /proc before and after
COMMAND, and prints each thread that used any, as a share of one core over
COMMAND's wall time; COMMAND's own threads too (as last seen, every 20 ms,
before it exited). Threads with the same name are listed apart.
"""
import os
import subprocess
import sys
import threading
import time

TICK = os.sysconf("SC_CLK_TCK")


def sample(pids):
    out = {}
    for pid in pids:
        base = "/proc/%d/task" % pid
        try:
            tids = os.listdir(base)
        except FileNotFoundError:
            continue
        for tid in tids:
            try:
                with open("%s/%s/stat" % (base, tid)) as f:
                    stat = f.read()
            except FileNotFoundError:
                continue
            name = stat[stat.index("(") + 1:stat.rindex(")")]
            fields = stat[stat.rindex(")") + 2:].split()
            out[(pid, int(tid))] = (name, int(fields[11]) + int(fields[12]))
    return out


def main():
    if "--" not in sys.argv or sys.argv.index("--") != 2:
        sys.exit(__doc__)
    pids = [int(p) for p in sys.argv[1].split(",") if p]
    command = sys.argv[3:]
    before = sample(pids)
    t0 = time.monotonic()
    child = subprocess.Popen(command)
    seen = {}

    def watch():
        while child.poll() is None:
            got = sample([child.pid])
            if got:
                seen.update(got)
            time.sleep(0.02)

    watcher = threading.Thread(target=watch)
    watcher.start()
    rc = child.wait()
    wall = time.monotonic() - t0
    watcher.join()
    after = sample(pids)
    after.update(seen)
    rows = []
    for key, (name, ticks) in after.items():
        used = ticks - before.get(key, (name, 0))[1]
        if used > 0:
            rows.append((used / TICK / wall, key, name))
    rows.sort(reverse=True)
    print("thread load over %.2f s (%s):" % (wall, " ".join(command[:1])))
    for share, (pid, tid), name in rows:
        print("  %5.1f%%  pid %d tid %d %s" % (100 * share, pid, tid, name))
    sys.exit(rc)


if __name__ == "__main__":
    main()
