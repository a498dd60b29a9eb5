"""The soak's view of processes (scripts/soak.py): /proc figures, calls into a
live process under gdb, the daemon it starts, and the statistics of its
samples."""

import os
import re
import shutil
import signal
import subprocess
import sys
import time


def proc_status_kib(pid, fields=("VmRSS",)):
    """The named fields of /proc/PID/status in KiB (None if the process is gone)."""
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                name, _, rest = line.partition(":")
                if name in fields:
                    out[name] = int(rest.split()[0])
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return out


def children_of(pid):
    kids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        # The command name is in parentheses and may hold anything: the
        # fields after its last ')' are state, ppid, ...
        rest = stat[stat.rfind(")") + 2:].split()
        if len(rest) > 1 and int(rest[1]) == pid:
            kids.append(int(entry))
    return sorted(kids)


def smaps_rollup(pid):
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            return f.read()
    except OSError as e:
        return f"(smaps_rollup: {e})"


def gdb_calls(pid, logpath, calls):
    """Runs `calls` in process `pid` under gdb. Returns (the values gdb
    printed, what the process wrote to its log meanwhile), or None."""
    gdb = shutil.which("gdb")
    if gdb is None:
        return None
    before = os.path.getsize(logpath)
    argv = [gdb, "-nx", "-batch", "-p", str(pid)]
    for c in calls:
        argv += ["-ex", f"call {c}"]
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=120).stdout
    except subprocess.TimeoutExpired:
        return None
    values = re.findall(r"^\$\d+ = (-?\d+)", out, re.M)
    if len(values) != sum(1 for c in calls if not c.startswith("(void)")):
        return None
    time.sleep(0.2)
    with open(logpath, "rb") as f:
        f.seek(before)
        written = f.read().decode(errors="replace")
    return [int(v) for v in values], written


def malloc_totals(text):
    """(system bytes, in use bytes) of malloc_stats' "Total (incl. mmap)"."""
    m = re.search(r"Total \(incl\. mmap\):\s*system bytes\s*=\s*(\d+)\s*in use bytes\s*=\s*(\d+)",
                  text)
    return (int(m.group(1)), int(m.group(2))) if m else None


class Daemon:
    def __init__(self, argv, env, logpath):
        self.log = open(logpath, "wb")
        self.logpath = logpath
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, env=env,
                                     stdin=subprocess.DEVNULL)
        self.port = None
        deadline = time.time() + 60
        pattern = re.compile(rb"serving gpuexec\.v1 on 127\.0\.0\.1:(\d+)")
        while time.time() < deadline:
            with open(logpath, "rb") as f:
                m = pattern.search(f.read())
            if m:
                self.port = int(m.group(1))
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        self.stop()
        with open(logpath, "rb") as f:
            tail = f.read()[-4000:].decode(errors="replace")
        sys.exit(f"soak: gpuexecd did not start serving:\n{tail}")

    @property
    def pid(self):
        return self.proc.pid

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode


def fit(points):
    """Least-squares slope of (seconds, MiB) points in MiB/min, and its
    standard error."""
    n = len(points)
    if n < 3:
        return 0.0, float("inf")
    mt = sum(t for t, _ in points) / n
    mv = sum(v for _, v in points) / n
    stt = sum((t - mt) ** 2 for t, _ in points)
    if stt == 0:
        return 0.0, float("inf")
    b = sum((t - mt) * (v - mv) for t, v in points) / stt
    resid = sum((v - mv - b * (t - mt)) ** 2 for t, v in points)
    se = (resid / (n - 2) / stt) ** 0.5
    return 60.0 * b, 60.0 * se


def median(values):
    v = sorted(values)
    n = len(v)
    return (v[n // 2] + v[(n - 1) // 2]) / 2
