#!/usr/bin/python3
"""`gpuexec top` on a real terminal: tmux's, against gpuexecd on the driver double.

A daemon with two tenants (team-a and team-b, each with a token), its metrics
endpoint on a port the kernel picks; each tenant runs a kernel with the gpuexec
tool, so both have series. Then, in a pane of a tmux server of the test's own
(a private socket, killed at the end):

  1. `gpuexec top` draws the device row and both tenants' rows, the header
     naming the default sort and the last line the keys;
  2. 'n' sorts by name (team-a first), 'r' reverses it (team-b first), 'm'
     sorts by memory: the header says each at once, without waiting out the
     interval's scrape;
  3. 'q' ends it with status 0, and the terminal has echo and canonical
     input again (`stty -a` in the same pane, after it; the pane's shell
     prints the status);
  4. in a second pane, Ctrl-C ends it with 130, the terminal again restored.

Every wait has a deadline; a failure prints the pane's screen and the
daemon's log. Prints "[  SKIPPED ] ..." (CTest's SKIP_REGULAR_EXPRESSION)
where tmux is not installed.

  cli_top_tmux_test.py --cli=gpuexec --daemon=gpuexecd --driver=libgpuexec_fakecuda.so
                       --kernels=DIR_WITH_gx_kernels.cubin
"""

import argparse
import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

TOKENS = {
    "team-a": "cli-top-tmux-token-of-team-a-0123456789",
    "team-b": "cli-top-tmux-token-of-team-b-9876543210",
}
WAIT_S = 30.0


class Failed(Exception):
    pass


def wait_for(what, check, seconds=WAIT_S):
    """Calls check() until it returns something true; that, or Failed."""
    deadline = time.monotonic() + seconds
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise Failed(f"{what}: not within {seconds:.0f} s")
        time.sleep(0.05)


class Daemon:
    """gpuexecd on the double, serving on a Unix socket, metrics on loopback."""

    def __init__(self, args, directory):
        self.log = os.path.join(directory, "gpuexecd.log")
        self.socket = os.path.join(directory, "d.sock")
        tenants = os.path.join(directory, "tenants.textproto")
        with open(tenants, "w", encoding="utf-8") as f:
            for name, token in TOKENS.items():
                digest = hashlib.sha256(token.encode()).hexdigest()
                f.write(f'tenant {{\n  name: "{name}"\n  token_sha256: "{digest}"\n}}\n')
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                [args.daemon, "--listen=", f"--unix_socket={self.socket}",
                 "--metrics_listen=127.0.0.1:0", f"--driver={args.driver}",
                 f"--tenants={tenants}"],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log)

        def serving():
            if self.process.poll() is not None:
                raise Failed(f"gpuexecd ended with {self.process.returncode}")
            m = re.search(r"gpuexecd serving .* metrics on (127\.0\.0\.1:[0-9]+)/metrics",
                          self.log_text())
            return m and m.group(1)

        self.metrics = wait_for("gpuexecd serving", serving, 60)

    def log_text(self):
        with open(self.log, encoding="utf-8", errors="replace") as f:
            return f.read()

    def stop(self):
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


class Tmux:
    """A tmux server of the test's own: its socket, and panes that stay once
    their command ends (remain-on-exit, set by its configuration before any
    pane starts) so that their last screen can be read."""

    def __init__(self, directory):
        self.name = f"gpuexec-top-test-{os.getpid()}"
        self.config = os.path.join(directory, "tmux.conf")
        with open(self.config, "w", encoding="utf-8") as f:
            f.write("set-option -g remain-on-exit on\nset-option -g history-limit 0\n")
        self.started = False

    def run(self, *args, check=True):
        r = subprocess.run(["tmux", "-L", self.name, "-f", self.config, *args],
                           capture_output=True, text=True, timeout=20, check=False)
        if check and r.returncode != 0:
            raise Failed(f"tmux {' '.join(args)}: {r.returncode}: {r.stderr.strip()}")
        return r.stdout

    def start(self, session, command):
        self.started = True
        self.run("new-session", "-d", "-s", session, "-x", "160", "-y", "50", command)

    def screen(self, session):
        return self.run("capture-pane", "-p", "-t", session, check=False)

    def keys(self, session, *keys):
        self.run("send-keys", "-t", session, *keys)

    def kill(self):
        if self.started:
            self.run("kill-server", check=False)


def rows(screen, lead):
    return [line for line in screen.splitlines() if line.startswith(lead)]


def tenant_order(screen):
    names, inside = [], False
    for line in screen.splitlines():
        if line.startswith("TENANT "):
            inside = True
        elif inside and line.startswith("team-"):
            names.append(line.split()[0])
        elif inside and not line.strip():
            break
    return names


def exited(tmux, session):
    """(the tool's exit status, the screen) once the pane's shell printed it."""
    screen = tmux.screen(session)
    m = re.search(r"^gpuexec top exited ([0-9]+)$", screen, re.MULTILINE)
    return m and (int(m.group(1)), screen)


def expect_terminal_restored(screen, what):
    # stty -a, after the tool, in the same pane: echo and canonical input on.
    words = set(screen.split())
    for flag in ("icanon", "echo"):
        if flag not in words or f"-{flag}" in words:
            raise Failed(f"{what}: the terminal was left without {flag}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cli", required=True)
    parser.add_argument("--daemon", required=True)
    parser.add_argument("--driver", required=True)
    parser.add_argument("--kernels", required=True)
    args = parser.parse_args()
    if shutil.which("tmux") is None:
        print("[  SKIPPED ] tmux is not installed (scripts/setup.sh installs it)")
        return 0

    directory = tempfile.mkdtemp(prefix="gpuexec-top-tmux-")
    daemon = tmux = None
    session = ""
    try:
        daemon = Daemon(args, directory)
        tmux = Tmux(directory)
        for tenant, token in TOKENS.items():
            r = subprocess.run(
                [args.cli, f"--target=unix:{daemon.socket}", "run",
                 os.path.join(args.kernels, "gx_kernels.cubin"), "gx_spin", "--grid=1",
                 "--block=1", "u64:1000000"],
                env={**os.environ, "GPUEXEC_TOKEN": token}, capture_output=True, text=True,
                timeout=60, check=False)
            if r.returncode != 0:
                raise Failed(f"{tenant}'s run: {r.returncode}: {r.stderr.strip()}")

        # The shell outlives the tool to print its exit status and the
        # terminal's settings after it; its trap keeps it alive through the
        # Ctrl-C that is the tool's (a handler, not an ignore, which the tool
        # would inherit). The status is read from the screen, not from tmux's
        # #{pane_dead_status}: tmux 3.3a, asked for formats while the pane's
        # command ends, at times never reaps it and has no status to give.
        top = (f"trap : INT; {shlex.quote(args.cli)} top --metrics={daemon.metrics} "
               "--interval=200ms; status=$?; stty -a; echo \"gpuexec top exited $status\"; "
               "exit $status")

        # 1. The rows, the default sort, the keys.
        session = "keys"
        tmux.start(session, f"sh -c {shlex.quote(top)}")
        screen = wait_for(
            "the device and both tenants on screen",
            lambda: (lambda s: s if rows(s, "0 ") and rows(s, "team-a ") and rows(s, "team-b ")
                     else None)(tmux.screen(session)))
        header = rows(screen, "gpuexec top  ")
        if not header or not header[0].endswith("sort: GPU %, highest first"):
            raise Failed(f"the header does not name the default sort:\n{screen}")
        device = rows(screen, "0 ")[0].split()
        if "healthy" not in device:
            raise Failed(f"the device row is not healthy:\n{screen}")
        if not rows(screen, "keys: g GPU %, m memory"):
            raise Failed(f"no line naming the keys:\n{screen}")

        # 2. Each key's sort, in the header and in the rows.
        for key, shown, order in (("n", "tenant, a to z", ["team-a", "team-b"]),
                                  ("r", "tenant, z to a", ["team-b", "team-a"]),
                                  ("m", "memory, highest first", None)):
            tmux.keys(session, key)
            screen = wait_for(
                f"the header after '{key}' says '{shown}'",
                lambda: (lambda s: s if any(h.endswith(f"sort: {shown}")
                                            for h in rows(s, "gpuexec top  ")) else None)(
                                                tmux.screen(session)), 10)
            if order is not None and tenant_order(screen) != order:
                raise Failed(f"after '{key}' the tenants are not {order}:\n{screen}")

        # 3. 'q': status 0, the terminal as it was.
        tmux.keys(session, "q")
        status, screen = wait_for("gpuexec top ending after 'q'", lambda: exited(tmux, session), 10)
        if status != 0:
            raise Failed(f"'q' ended gpuexec top with {status}, not 0:\n{screen}")
        expect_terminal_restored(screen, "after 'q'")

        # 4. Ctrl-C: status 130, the terminal as it was.
        session = "interrupt"
        tmux.start(session, f"sh -c {shlex.quote(top)}")
        wait_for("the second pane's tenants",
                 lambda: rows(tmux.screen(session), "team-a "))
        tmux.keys(session, "C-c")
        status, screen = wait_for("gpuexec top ending after Ctrl-C",
                                  lambda: exited(tmux, session), 10)
        if status != 130:
            raise Failed(f"Ctrl-C ended gpuexec top with {status}, not 130:\n{screen}")
        expect_terminal_restored(screen, "after Ctrl-C")
    except (Failed, subprocess.TimeoutExpired) as e:
        print(f"FAILED: {e}", file=sys.stderr)
        if tmux is not None and session:
            print(f"--- pane '{session}':\n{tmux.screen(session)}", file=sys.stderr)
        if daemon is not None:
            print(f"--- gpuexecd's log:\n{daemon.log_text()[-4000:]}", file=sys.stderr)
        return 1
    finally:
        if tmux is not None:
            tmux.kill()
        if daemon is not None:
            daemon.stop()
        shutil.rmtree(directory, ignore_errors=True)
    print("gpuexec top under tmux: rows, sort keys, 'q' (0) and Ctrl-C (130), terminal restored")
    return 0


if __name__ == "__main__":
    sys.exit(main())
