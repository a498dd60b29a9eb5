#!/usr/bin/python3
"""The package's version is the project's: gpuexec/_version.py's __version__
equals project(gpuexec VERSION ...) of the top-level CMakeLists.txt, as a
plain string setuptools reads without importing the package (so a pip
install needs neither grpcio nor protobuf to build), and pyproject.toml
takes its version from there.

    version_current.py PROJECT_VERSION
"""

import ast
import os
import sys

import pkgtest

try:
    import tomllib
except ImportError:  # Python < 3.11
    tomllib = None

if len(sys.argv) != 2:
    sys.exit(__doc__)
project_version = sys.argv[1]
version_py = os.path.join(pkgtest.PACKAGE_SOURCE, "gpuexec", "_version.py")
pyproject = os.path.join(pkgtest.PACKAGE_SOURCE, "pyproject.toml")

with open(version_py) as f:
    tree = ast.parse(f.read(), version_py)
versions = [node.value.value for node in tree.body
            if isinstance(node, ast.Assign) and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name) and node.targets[0].id == "__version__"
            and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)]
if len(versions) != 1:
    pkgtest.fail(f"client/python/gpuexec/_version.py has no single `__version__ = \"X.Y.Z\"` "
                 f"(a string literal): write `__version__ = \"{project_version}\"` there")
if versions[0] != project_version:
    pkgtest.fail(f"client/python/gpuexec/_version.py says {versions[0]!r}, the project "
                 f"(CMakeLists.txt project(VERSION)) {project_version!r}: change them together")

if tomllib is None:
    pkgtest.skip("this Python has no tomllib (3.11 or newer) to read pyproject.toml; "
                 f"_version.py agrees ({project_version})")
with open(pyproject, "rb") as f:
    project = tomllib.load(f)
static = project["project"].get("version")
if static is not None:
    if static != project_version:
        pkgtest.fail(f"client/python/pyproject.toml's version is {static!r}, the project's "
                     f"{project_version!r}: change them together")
else:
    attr = (project["project"].get("dynamic", []) and project.get("tool", {})
            .get("setuptools", {}).get("dynamic", {}).get("version", {}).get("attr"))
    if attr != "gpuexec._version.__version__":
        pkgtest.fail("client/python/pyproject.toml neither states a version nor takes it from "
                     "gpuexec._version.__version__ ([tool.setuptools.dynamic] version = "
                     f"{{attr = ...}}; it has {attr!r})")
pkgtest.ok(f"_version.py and pyproject.toml give the project's version {project_version}")
