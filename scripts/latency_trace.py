#!/usr/bin/python3
"""Where a launch + synchronize spends its time, from a timestamping build.

Build with -DGPUEXEC_LATENCY_TRACE=ON, run a daemon and the benchmark's
launch figure with GPUEXEC_TRACE_DIR set to one directory for both, then:

    scripts/latency_trace.py DIR

Each round runs from one kClientSend to the next; in it every point of
server/common/trace.h is taken at its first time after the point before
(a round missing one is skipped). Prints the median and 90th percentile of
each step, in microseconds.
"""
import bisect
import os
import re
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
# In the tree, or beside the script in a GPU bundle.
HEADER = next((p for p in (os.path.join(HERE, "..", "server", "common", "trace.h"),
                           os.path.join(HERE, "trace.h")) if os.path.exists(p)), "trace.h")


def points():
    names = {}
    for line in open(HEADER):
        m = re.match(r"\s*k(\w+)\s*=\s*(\d+),", line)
        if m:
            names[int(m.group(2))] = m.group(1)
    return [names[k] for k in sorted(names)], names


def load(directory):
    times = {}
    for name in sorted(os.listdir(directory)):
        if not name.endswith(".trace"):
            continue
        with open(os.path.join(directory, name), "rb") as f:
            data = f.read()
        # Records are written from the front: trailing zeros were never used.
        end = len(data.rstrip(b"\0"))
        end += (-end) % 16
        for point, _, ns in struct.iter_unpack("<IIQ", data[:end]):
            if point:
                times.setdefault(point, []).append(ns)
    for v in times.values():
        v.sort()
    return times


def pct(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    order, names = points()
    ids = {v: k for k, v in names.items()}
    times = load(sys.argv[1])
    starts = times.get(ids[order[0]], [])
    if not starts:
        sys.exit("no rounds: no %s was recorded" % order[0])
    steps = [[] for _ in order[1:]]
    totals = []
    skipped = 0
    for i, start in enumerate(starts):
        stop = starts[i + 1] if i + 1 < len(starts) else float("inf")
        t = start
        got = []
        for name in order[1:]:
            v = times.get(ids[name], [])
            j = bisect.bisect_left(v, t)
            if j == len(v) or v[j] >= stop:
                break
            got.append(v[j] - t)
            t = v[j]
        if len(got) != len(order) - 1:
            skipped += 1
            continue
        for k, d in enumerate(got):
            steps[k].append(d)
        totals.append(t - start)
    if not totals:
        sys.exit("no complete round among %d" % len(starts))
    print("%d rounds (%d incomplete skipped)" % (len(totals), skipped))
    print("%-44s %9s %9s" % ("step", "p50 us", "p90 us"))
    for k, name in enumerate(order[1:]):
        print("%-44s %9.2f %9.2f" % (order[k] + " -> " + name, pct(steps[k], 0.5) / 1e3,
                                     pct(steps[k], 0.9) / 1e3))
    print("%-44s %9.2f %9.2f" % ("total", pct(totals, 0.5) / 1e3, pct(totals, 0.9) / 1e3))


if __name__ == "__main__":
    main()
