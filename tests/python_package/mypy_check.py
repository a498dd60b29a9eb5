#!/usr/bin/python3
"""mypy over the Python package's source (client/python, with its committed
stubs), as its pyproject.toml's [tool.mypy] configures it: Python 3.9, the
generated stubs not checked, and every function typed in the modules listed
there with disallow_untyped_defs.

    mypy_check.py CACHE_DIR

Without mypy (Debian: mypy, which scripts/setup.sh installs) the test
reports SKIPPED.
"""

import importlib.util
import os
import subprocess
import sys

import pkgtest

if len(sys.argv) != 2:
    sys.exit(__doc__)
if importlib.util.find_spec("mypy") is None:
    pkgtest.skip(f"mypy is not installed for {sys.executable} (Debian: mypy, which "
                 "scripts/setup.sh installs)")
version = subprocess.run([sys.executable, "-m", "mypy", "--version"], capture_output=True,
                         text=True).stdout.strip()
# From the package's directory, so that its pyproject.toml configures mypy;
# the cache goes to the build tree, not the source.
cmd = [sys.executable, "-m", "mypy", "--config-file", "pyproject.toml", "--cache-dir",
       sys.argv[1]]
print("+", " ".join(cmd), f"({version}, in client/python)", flush=True)
p = subprocess.run(cmd, cwd=pkgtest.PACKAGE_SOURCE, env=dict(os.environ, MYPY_FORCE_COLOR="0"),
                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
print(p.stdout, end="")
if p.returncode != 0:
    pkgtest.fail("mypy found type errors in the package (above): fix them, or type the "
                 "functions it names")
pkgtest.ok(f"{version}: no type errors in client/python/gpuexec")
