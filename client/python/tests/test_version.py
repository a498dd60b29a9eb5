"""The package's version, and a daemon of another MAJOR.MINOR told once per
client with a gpuexec.VersionWarning (an older daemon, telling none, and one
of this client's release say nothing)."""

import os
import re
import warnings

import pytest

import gpuexec
from gpuexec._version_check import version_warning
from conftest import start_daemon, stop_daemon

ADVICE = ("a call or field that one of them added since the other's release may be refused "
          "or ignored; ")


def test_the_package_version_is_the_projects():
    # gpuexec/_version.py holds project(VERSION) of the top-level
    # CMakeLists.txt (the test python_version_current checks it), and the
    # pyproject takes its version from there.
    assert re.fullmatch(r"[0-9]+\.[0-9]+\.[0-9]+", gpuexec.__version__)
    pyproject = os.path.join(os.path.dirname(gpuexec.__file__), os.pardir, "pyproject.toml")
    with open(pyproject) as f:
        assert 'version = { attr = "gpuexec._version.__version__" }' in f.read()
    assert issubclass(gpuexec.VersionWarning, UserWarning)


@pytest.mark.parametrize("daemon_version, client_version, expected", [
    ("", "0.1.0", ""),  # an older daemon tells none
    ("0.1.0", "0.1.0", ""),
    ("0.1.7", "0.1.0", ""),  # PATCH releases are not told
    ("0.1", "0.1.0", ""),
    ("0.1.0-rc1", "0.1.0", ""),
    ("0.2.0", "0.1.0", "the daemon at host:1 runs gpuexecd 0.2.0, this client is 0.1.0: "
                       + ADVICE + "use a client of release 0.2, or a daemon of this client's"),
    ("1.1.0", "0.1.0", "the daemon at host:1 runs gpuexecd 1.1.0, this client is 0.1.0: "
                       + ADVICE + "use a client of release 1.1, or a daemon of this client's"),
    ("0.10.0", "0.1.0", "the daemon at host:1 runs gpuexecd 0.10.0, this client is 0.1.0: "
                        + ADVICE + "use a client of release 0.10, or a daemon of this client's"),
    ("banana", "0.1.0", 'the daemon at host:1 reports version "banana" (not MAJOR.MINOR.PATCH), '
                        "this client is 0.1.0: " + ADVICE + "use a client of the daemon's release"),
])
def test_version_warning_table(daemon_version, client_version, expected):
    assert version_warning("host:1", daemon_version, client_version) == expected


def test_the_daemons_text_is_bounded_and_escaped():
    told = version_warning("host:1", "0.2.0\n\x1b[31m" + "x" * 1000, "0.1.0")
    assert "runs gpuexecd 0.2.0\\x0a\\x1b[31mxxx" in told
    assert "xxx..., this client is 0.1.0" in told
    assert "\n" not in told and len(told) < 400
    junk = version_warning("host:1", "\x01" + "y" * 500, "0.1.0")
    assert 'reports version "\\x01yyy' in junk and '..." (not MAJOR.MINOR.PATCH)' in junk
    assert len(junk) < 400


def test_a_daemon_of_this_release_says_nothing(client):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        client.devices()
        with client.session():
            pass


@pytest.fixture(scope="module")
def newer_daemon(daemon, tmp_path_factory):
    """A daemon that reports another MAJOR.MINOR (the tests' variable of
    gpuexecd, kept out of its flags)."""
    major, minor = (int(p) for p in gpuexec.__version__.split(".")[:2])
    other = f"{major}.{minor + 1}.0"
    tmp = tmp_path_factory.mktemp("newer")
    socket = tmp / "d.sock"
    process, _ = start_daemon(daemon.binary, [f"--driver={daemon.driver}", "--listen=",
                                              f"--unix_socket={socket}"],
                              str(tmp / "gpuexecd.log"),
                              env={"GPUEXECD_TEST_REPORTED_VERSION": other})
    try:
        yield f"unix:{socket}", other
    finally:
        stop_daemon(process)


def test_another_minor_is_a_warning_once_per_client(newer_daemon):
    target, other = newer_daemon
    expected = (f"the daemon at {target} runs gpuexecd {other}, this client is "
                f"{gpuexec.__version__}: ")
    with gpuexec.connect(target) as client:
        with pytest.warns(gpuexec.VersionWarning) as told:
            devices = client.devices()
        assert devices  # the call goes on as usual
        assert len(told) == 1
        assert str(told[0].message).startswith(expected)
        # Pointed at the caller's line, not the package's.
        assert told[0].filename == __file__
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with client.session():
                pass
            client.devices()
    # A new client warns again, here at its first session.
    with gpuexec.connect(target) as client:
        with pytest.warns(gpuexec.VersionWarning, match=re.escape(expected)):
            with client.session():
                pass
