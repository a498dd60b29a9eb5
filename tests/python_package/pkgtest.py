"""What the package tests share: where the source is, and how a test says
it passed, failed or could not run here (SKIP, which ctest reports as
skipped through SKIP_REGULAR_EXPRESSION)."""

import os
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
PACKAGE_SOURCE = os.path.join(ROOT, "client", "python")
SKIP = "GPUEXEC PYTHON PACKAGE TEST SKIPPED"


def name():
    return os.path.splitext(os.path.basename(sys.argv[0]))[0]


def skip(reason):
    print(f"{SKIP}: {name()}: {reason}")
    sys.exit(0)


def fail(message):
    print(f"{name()}: FAILED: {message}")
    sys.exit(1)


def ok(message):
    print(f"{name()}: ok: {message}")
