#!/usr/bin/python3
"""Runs the README's commands, so that the docs and the behaviour cannot drift.

    readme_test.py README.md --build BUILD_DIR [--gpu] [--list]

Every fenced block of the README is one of:

  ```sh       commands. Each is run, in order, in a scratch folder that links to
              the checkout (so `client/...`, `./build/...` and `$PWD/build` work
              there and the files a command writes stay out of the tree), with
              the variables earlier commands exported. A command ends at a line
              without a trailing backslash; the `# ...` lines after it are the
              output it must print, word for word and number for number, but
              that a measured time ("0.035 ms") matches any time in that unit,
              127.0.0.1:PORT any port, a run of blanks any run, and `...`
              anything: a GPU time may differ, a result may not.
              A command that fails, or misses an output line, fails the test.
  python, cpp, cuda
              code shown from a file of the checkout: the marker
              `<!-- readme-test: same-as PATH -->` above it names the file, and
              every non-blank line of the block must be a line of that file.
  anything else (text, yaml, ...)
              not a command; not checked here.

A marker comment on the line before a block changes what is done with it:

  <!-- readme-test: daemon -->        the block's first command starts the daemon:
                                      `./scripts/run.sh ARGS` runs BUILD/server/gpuexecd
                                      ARGS (run.sh only adds the install and the build,
                                      which the test's build already is) on a port of
                                      its own; later commands find it through
                                      $GPUEXEC_TARGET, which every client honours.
  <!-- readme-test: skip: REASON -->  not run here, for the reason given (it needs
                                      a GPU host, root, a cluster, ...). A block of
                                      commands or code without a marker or a reason
                                      is a failure, so nothing is left unchecked by
                                      oversight.

By default the daemon runs the simulator (`--simulator`, whatever the README
passes) and output lines are checked; with --gpu it runs on the real driver
(without `--simulator`, whatever the README passes) and only the commands' exit
status is checked (device names and figures differ from the simulator's).
"""

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

FENCE = re.compile(r"^```(\S*)\s*$")
MARKER = re.compile(r"^<!--\s*readme-test:\s*(daemon|skip|same-as)\s*(?::\s*)?(.*?)\s*-->\s*$")
COMMAND_LANGS = {"sh", "bash", "shell", "console"}
CODE_LANGS = {"python", "py", "cpp", "c++", "cuda", "cu"}
# In an output line: "...", a run of blanks, a measured time ("0.035 ms"), a
# loopback address with its port, or a number.
TIME = r"[0-9]+(?:\.[0-9]+)?(?:e[-+]?[0-9]+)? (?:ms|us|s)\b"
ADDRESS = r"127\.0\.0\.1:[0-9]+"
NUMBER = r"[-+]?[0-9]+(?:\.[0-9]+)?(?:e[-+]?[0-9]+)?"
TOKEN = re.compile(f"(\\.\\.\\.|\\s+|{TIME}|{ADDRESS}|{NUMBER})")
COMMAND_TIMEOUT_S = 300


class Block:
    def __init__(self, lang, lines, line_no, marker):
        self.lang, self.lines, self.line_no, self.marker = lang, lines, line_no, marker

    def where(self):
        return f"README line {self.line_no}"


def parse_blocks(text):
    blocks, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start, lang = i, m.group(1).lower()
        j = i + 1
        while j < len(lines) and not lines[j].startswith("```"):
            j += 1
        prev = start - 1
        while prev >= 0 and not lines[prev].strip():
            prev -= 1
        mm = MARKER.match(lines[prev].strip()) if prev >= 0 else None
        marker = (mm.group(1), mm.group(2)) if mm else None
        blocks.append(Block(lang, lines[start + 1:j], start + 1, marker))
        i = j + 1
    return blocks


def commands_of(block):
    """[(command, [expected output lines])] of a block of commands."""
    out, pending = [], ""
    for raw in block.lines:
        line = raw.rstrip()
        if pending:
            pending += "\n" + line
            if not line.endswith("\\"):
                out.append([pending, []])
                pending = ""
            continue
        stripped = line.strip()
        if not stripped:
            continue
        if stripped.startswith("#"):
            if out:
                out[-1][1].append(stripped[1:].strip())
            continue
        if line.endswith("\\"):
            pending = line
        else:
            out.append([line, []])
    if pending:
        out.append([pending, []])
    return out


def pattern(expected):
    parts = []
    for tok in TOKEN.split(expected):
        if not tok:
            continue
        if tok == "...":
            parts.append(".*?")
        elif tok.isspace():
            parts.append(r"\s+")
        elif re.fullmatch(TIME, tok):
            parts.append(r"[0-9][0-9.e+-]* " + re.escape(tok.split()[-1]))
        elif re.fullmatch(ADDRESS, tok):
            parts.append(ADDRESS)
        else:
            parts.append(re.escape(tok))
    return re.compile("".join(parts))


def check_output(cmd, expected, output, failures, where):
    for line in expected:
        if not line or line == "...":
            continue
        if not pattern(line).search(output):
            failures.append(f"{where}: `{first_line(cmd)}` did not print a line like\n"
                            f"    {line}\n  it printed:\n{indent(output)}")


def first_line(cmd):
    return cmd.splitlines()[0].rstrip("\\ ")


def indent(text, limit=3000):
    text = text[-limit:]
    return "\n".join("    " + l for l in text.splitlines())


class Daemon:
    """The walk-through's gpuexecd, on a port of its own."""

    def __init__(self, build, args, workdir, env):
        self.log_path = os.path.join(workdir, "gpuexecd.log")
        self.log = open(self.log_path, "w")
        argv = [os.path.join(build, "server", "gpuexecd")] + [
            a for a in args if not a.startswith("--listen")] + ["--listen=127.0.0.1:0"]
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT,
                                     cwd=workdir, env=env)
        self.target = None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and self.proc.poll() is None:
            m = re.search(r"serving gpuexec\.v1 on (127\.0\.0\.1:[0-9]+)", self.output())
            if m:
                self.target = m.group(1)
                return
            time.sleep(0.05)
        raise RuntimeError(f"gpuexecd did not start:\n{indent(self.output())}")

    def output(self):
        with open(self.log_path) as f:
            return f.read()

    def stop(self):
        self.proc.terminate()
        try:
            return self.proc.wait(timeout=20)
        finally:
            self.log.close()


def scratch_folder(root, build):
    work = tempfile.mkdtemp(prefix="readme-test-")
    for name in os.listdir(root):
        if name in ("build", ".git") or name.startswith("build-"):
            continue
        os.symlink(os.path.join(root, name), os.path.join(work, name))
    os.symlink(build, os.path.join(work, "build"))
    return work


def run_command(cmd, workdir, envfile, env):
    script = (f"source {shlex.quote(envfile)}\nset -o pipefail\n{cmd}\nstatus=$?\n"
              f"export -p > {shlex.quote(envfile)}\nexit $status\n")
    p = subprocess.run(["bash", "-c", script], cwd=workdir, env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=COMMAND_TIMEOUT_S)
    return p.returncode, p.stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("readme")
    ap.add_argument("--build", required=True)
    ap.add_argument("--gpu", action="store_true")
    ap.add_argument("--list", action="store_true", help="print what would be done, run nothing")
    args = ap.parse_args()
    readme = os.path.abspath(args.readme)
    root, build = os.path.dirname(readme), os.path.abspath(args.build)
    with open(readme) as f:
        blocks = parse_blocks(f.read())

    failures, skipped, ran, compared = [], [], 0, 0
    for b in blocks:
        kind = b.marker[0] if b.marker else None
        if b.lang not in COMMAND_LANGS | CODE_LANGS:
            continue
        if kind == "skip":
            if not b.marker[1]:
                failures.append(f"{b.where()}: a skipped block must say why")
            skipped.append(f"{b.where()} ({b.lang}): {b.marker[1]}")
        elif b.lang in CODE_LANGS:
            if kind != "same-as" or not b.marker[1]:
                failures.append(f"{b.where()}: a {b.lang} block needs "
                                "<!-- readme-test: same-as PATH --> or a skip with a reason")
                continue
            with open(os.path.join(root, b.marker[1])) as f:
                source = {l.strip() for l in f.read().splitlines()}
            for l in b.lines:
                if l.strip() and l.strip() not in source:
                    failures.append(f"{b.where()}: this line is not in {b.marker[1]}:\n    {l}")
            compared += 1
    if args.list:
        for b in blocks:
            if b.lang in COMMAND_LANGS and not (b.marker and b.marker[0] == "skip"):
                for cmd, exp in commands_of(b):
                    print(f"{b.where()}: {first_line(cmd)}  ({len(exp)} output lines)")
        print("\n".join("skip " + s for s in skipped))
        return 0

    work = scratch_folder(root, build)
    envfile = os.path.join(work, ".readme-env")
    env = dict(os.environ)
    # The README's `python3` is Debian's, which has grpcio, protobuf and numpy;
    # a GPU host's own python3 (on its PATH) has them too.
    if not args.gpu:
        env["PATH"] = "/usr/bin:" + env.get("PATH", "")
    env.pop("GPUEXEC_TARGET", None)
    open(envfile, "w").close()
    daemon = None
    try:
        for b in blocks:
            if b.lang not in COMMAND_LANGS or (b.marker and b.marker[0] == "skip"):
                continue
            cmds = commands_of(b)
            if b.marker and b.marker[0] == "daemon":
                cmd, expected = cmds.pop(0)
                argv = shlex.split(cmd.replace("\\\n", " "), comments=True)
                if argv[:1] != ["./scripts/run.sh"]:
                    failures.append(f"{b.where()}: the daemon block must start with ./scripts/run.sh")
                    continue
                # The simulator here, the real driver with --gpu, whichever
                # the README shows.
                daemon_args = [a for a in argv[1:] if a != "--simulator"]
                if not args.gpu:
                    daemon_args.append("--simulator")
                daemon = Daemon(build, daemon_args, work, env)
                with open(envfile, "a") as f:
                    f.write(f"export GPUEXEC_TARGET={daemon.target}\n")
                ran += 1
                if not args.gpu:
                    check_output(cmd, expected, daemon.output(), failures, b.where())
            for cmd, expected in cmds:
                rc, output = run_command(cmd, work, envfile, env)
                ran += 1
                print(f"$ {first_line(cmd)}\n{output}", end="" if output.endswith("\n") else "\n")
                if rc != 0:
                    failures.append(f"{b.where()}: `{first_line(cmd)}` exited {rc}:\n{indent(output)}")
                elif not args.gpu:
                    check_output(cmd, expected, output, failures, b.where())
    finally:
        if daemon is not None:
            rc = daemon.stop()
            if rc != 0:
                failures.append(f"gpuexecd exited {rc} on SIGTERM:\n{indent(daemon.output())}")
        shutil.rmtree(work, ignore_errors=True)

    print(f"readme_test: ran {ran} commands, compared {compared} code blocks with their files, "
          f"skipped {len(skipped)} blocks:")
    for s in skipped:
        print("  " + s)
    if failures:
        print(f"readme_test: FAILED ({len(failures)}):", file=sys.stderr)
        for f in failures:
            print("- " + f, file=sys.stderr)
        return 1
    print("readme_test: PASSED")
    return 0


if __name__ == "__main__":
    sys.exit(main())
