"""The package's version: the project's (top-level CMakeLists.txt's
``project(gpuexec VERSION ...)``), which the test python_version_current
checks; pyproject.toml reads it from here."""

__version__ = "0.1.0"
