"""gpuexec's Triton driver without Triton: its launcher, timing and errors,
against the driver double.

Triton is not installed here (the GPU tier runs unchanged Triton programs
through the driver: test_triton_driver_gpu.py). What Triton hands the
driver is built here as Triton 3.6 builds it: the launcher gets the
ASTSource's signature (every parameter, constexprs as "constexpr") and the
compiled kernel's metadata (a namedtuple of the JSON next to the cubin),
then each launch's grid, stream, function, the packed metadata, the launch
metadata, the two hooks and every argument of the @triton.jit function.
The kernel is gx_add_scratch (tests/kernels), shaped as Triton 3.x output:
(x, y, out, n, global scratch, profile scratch).
"""

import collections
import json
import os
import sys
import time
import types

import grpc
import numpy as np

import pytest

import gpuexec
import gpuexec.triton
from gpuexec import _triton_driver as td
from gpuexec._triton_launcher import Launcher

METADATA = os.path.join(os.path.dirname(__file__), "data", "gx_add_scratch.json")
SIGNATURE = {"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32",
             "BLOCK": "constexpr"}


def _metadata(**changes):
    with open(METADATA) as f:
        md = json.load(f)
    md.update(changes)
    return collections.namedtuple("KernelMetadata", sorted(md))(**md)


def _source(signature=None):
    signature = dict(signature or SIGNATURE)
    return types.SimpleNamespace(signature=signature,
                                 fn=types.SimpleNamespace(arg_names=list(signature)))


@pytest.fixture
def driver(session):
    return td.DriverMethods(session)


def _kernel(driver, daemon, **md_changes):
    """(launcher, function) as Triton's CompiledKernel._init_handles makes them."""
    with open(daemon.cubin, "rb") as f:
        image = f.read()
    module, function, n_regs, n_spills, n_max_threads = driver.utils.load_binary(
        "gx_add_scratch", image, 0, driver.get_current_device())
    assert n_regs > 0 and n_spills >= 0 and n_max_threads >= 128
    return driver.launcher_cls(_source(), _metadata(**md_changes)), function


def _inputs(session, n):
    rng = np.random.default_rng(7)
    x = rng.standard_normal(n, dtype=np.float32)
    y = rng.standard_normal(n, dtype=np.float32)
    return x, y, session.asarray(x), session.asarray(y), session.empty(n, "float32")


def test_a_launch_as_triton_makes_it(session, daemon, driver):
    launcher, function = _kernel(driver, daemon)
    n = 100003
    x, y, xb, yb, out = _inputs(session, n)
    hooks = []
    launcher((n + 1023) // 1024, 1, 1, 0, function, None, {"name": "gx"},
             lambda md: hooks.append(("enter", md["name"])),
             lambda md: hooks.append(("exit", md["name"])), xb, yb, out, n, 1024)
    np.testing.assert_array_equal(out.get(), x + y)
    assert hooks == [("enter", "gx"), ("exit", "gx")]


def test_views_are_pointers_at_their_offset(session, daemon, driver):
    launcher, function = _kernel(driver, daemon)
    n = 4096
    x, y, xb, yb, out = _inputs(session, n)
    out.memset(0)
    half = n // 2
    launcher(2, 1, 1, 0, function, None, None, None, None, xb[half:], yb[half:], out[half:],
             half, 1024)
    got = out.get()
    np.testing.assert_array_equal(got[half:], (x + y)[half:])
    assert not got[:half].any()


def test_scratch_and_clusters(session, daemon, driver):
    launcher, function = _kernel(driver, daemon, num_ctas=2, global_scratch_size=40,
                                 global_scratch_align=128, profile_scratch_size=12,
                                 profile_scratch_align=8)
    n = 5000
    x, y, xb, yb, out = _inputs(session, n)
    launcher(3, 1, 1, 0, function, None, None, None, None, xb, yb, out, n, 1024)
    np.testing.assert_array_equal(out.get(), x + y)
    # 6 CTAs: 40 * 6 = 240 bytes, rounded up to 256; 12 * 6 = 72.
    assert launcher._scratch["global"].nbytes == 256
    assert launcher._scratch["profile"].nbytes == 72


def test_an_empty_grid_launches_nothing(session, daemon, driver):
    launcher, function = _kernel(driver, daemon)
    x, y, xb, yb, out = _inputs(session, 16)
    assert launcher.launch((0, 1, 1), function, (xb, yb, out, 16, 1024), sync=True) == 0.0


@pytest.mark.parametrize("bad, words", [
    (np.zeros(4, np.float32), "is a numpy array: host memory"),
    (12345, "is an int where the kernel takes a pointer"),
    (types.SimpleNamespace(data_ptr=lambda: 0, dtype="float32"), "not gpuexec memory"),
    ("text", "the kernel takes a pointer"),
])
def test_what_is_no_pointer_is_refused(session, daemon, driver, bad, words):
    launcher, function = _kernel(driver, daemon)
    _, _, xb, yb, out = _inputs(session, 16)
    with pytest.raises(gpuexec.Error) as e:
        launcher(1, 1, 1, 0, function, None, None, None, None, bad, yb, out, 16, 1024)
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "argument 'x_ptr' of Triton kernel 'gx_add_scratch'" in e.value.message
    assert words in e.value.message


def test_another_sessions_buffer_is_refused(client, session, daemon, driver):
    launcher, function = _kernel(driver, daemon)
    _, _, xb, yb, out = _inputs(session, 16)
    with client.session() as other:
        foreign = other.empty(16, "float32")
        with pytest.raises(gpuexec.Error) as e:
            launcher(1, 1, 1, 0, function, None, None, None, None, xb, foreign, out, 16, 1024)
    assert "argument 'y_ptr'" in e.value.message
    assert f"is a buffer of session {other.token[:8]}" in e.value.message


def test_argument_count_and_scalar_range(session, daemon, driver):
    launcher, function = _kernel(driver, daemon)
    _, _, xb, yb, out = _inputs(session, 16)
    with pytest.raises(gpuexec.Error) as e:
        launcher(1, 1, 1, 0, function, None, None, None, None, xb, yb, out, 16)
    assert "takes 5 arguments (constexprs included), got 4" in e.value.message
    with pytest.raises(gpuexec.Error) as e:
        launcher(1, 1, 1, 0, function, None, None, None, None, xb, yb, out, 1 << 40, 1024)
    assert "argument 'n' of Triton kernel 'gx_add_scratch' (type i32)" in e.value.message


def test_tuple_parameters_are_flattened(session, daemon, driver):
    """A tuple parameter (Triton's signature gives its items' types) is
    passed item by item, as Triton's launcher flattens it."""
    with open(daemon.cubin, "rb") as f:
        _, function, *_ = driver.utils.load_binary("gx_add_scratch", f.read(), 0, 0)
    src = _source({"ptrs": ("*fp32", "*fp32"), "out_ptr": "*fp32", "n": "i32",
                   "BLOCK": "constexpr"})
    launcher = Launcher(session, src, _metadata())
    n = 3000
    x, y, xb, yb, out = _inputs(session, n)
    launcher(3, 1, 1, 0, function, None, None, None, None, (xb, yb), out, n, 1024)
    np.testing.assert_array_equal(out.get(), x + y)


def test_a_type_the_driver_cannot_pass_is_named(session):
    with pytest.raises(gpuexec.Error) as e:
        Launcher(session, _source({"x": "*fp32", "weird": "v4f32"}), _metadata())
    assert "parameter 1 has type 'v4f32'" in e.value.message


def test_modules_are_loaded_once_per_image(session, daemon, driver):
    with open(daemon.cubin, "rb") as f:
        image = f.read()
    first = driver.utils.load_binary("gx_add_scratch", image, 0, 0)
    second = driver.utils.load_binary("gx_add_scratch", image, 0, 0)
    assert first[0] is second[0] and first[1] is second[1]
    assert len(driver.state.modules) == 1


def test_events_time_the_work_between_two_records(session, daemon, driver):
    launcher, function = _kernel(driver, daemon)
    n = 1 << 16
    _, _, xb, yb, out = _inputs(session, n)
    interface = driver.get_device_interface()
    start, end = interface.Event(enable_timing=True), interface.Event(enable_timing=True)
    session.synchronize()
    before = time.perf_counter()
    start.record()
    for _ in range(10):
        launcher(n // 1024, 1, 1, 0, function, None, None, None, None, xb, yb, out, n, 1024)
    end.record()
    interface.synchronize()
    wall_ms = (time.perf_counter() - before) * 1e3
    ms = start.elapsed_time(end)
    # The events span the device's time between the two records, host gaps between the
    # launches included (so no ratio to the kernels' own time holds on a loaded host); it
    # cannot exceed the wall time around them, which catches a unit slip (s, us for ms).
    assert 0.0 < ms <= wall_ms * 1.01 + 0.05
    with pytest.raises(gpuexec.Error, match="recorded before the start"):
        end.elapsed_time(start)


def test_do_bench_reports_gpu_milliseconds(session, daemon, driver):
    launcher, function = _kernel(driver, daemon)
    n = 1 << 16
    _, _, xb, yb, out = _inputs(session, n)

    def run():
        launcher(n // 1024, 1, 1, 0, function, None, None, None, None, xb, yb, out, n, 1024)

    median, low, high = driver.get_benchmarker()(run, quantiles=(0.5, 0.2, 0.8))
    assert 0.0 < low <= median <= high
    mean = td.do_bench(run, rep=5, driver=driver)
    assert mean > 0.0
    every = td.do_bench(run, rep=5, return_mode="all", driver=driver)
    assert len(every) >= 1 and all(t > 0.0 for t in every)
    with pytest.raises(gpuexec.Error, match="return_mode"):
        td.do_bench(run, return_mode="p99", driver=driver)


def test_the_driver_answers_as_triton_asks(session, driver):
    assert driver.is_active() is False
    assert driver.map_python_to_cpp_type("*fp16") == "CUdeviceptr"
    assert driver.map_python_to_cpp_type("i1") == "int8_t"
    props = driver.utils.get_device_properties(driver.get_current_device())
    assert props["max_shared_mem"] >= 49152 and props["multiprocessor_count"] > 0
    assert driver.get_current_stream(driver.get_current_device()) == 0
    with pytest.raises(gpuexec.Error, match="no torch device"):
        driver.get_active_torch_device()
    with pytest.raises(gpuexec.Error, match="switch sessions"):
        driver.set_current_device(0)
    assert td.DriverMethods(session).get_current_device() != driver.get_current_device()


def test_without_triton_activate_says_what_to_install(session, monkeypatch):
    monkeypatch.setitem(sys.modules, "triton", None)  # "import triton" fails
    with pytest.raises(gpuexec.Error) as e:
        gpuexec.triton.activate(session)
    assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert "needs Triton" in e.value.message and "pip install triton" in e.value.message


def test_an_unsupported_triton_is_named(session, monkeypatch):
    monkeypatch.setitem(sys.modules, "triton", types.SimpleNamespace(__version__="3.1.0"))
    monkeypatch.delenv(td._ANY_VERSION_ENV, raising=False)
    with pytest.raises(gpuexec.Error) as e:
        gpuexec.triton.activate(session)
    assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert "Triton 3.1.0 is not supported" in e.value.message
    assert "supported are 3.6" in e.value.message


def test_repeated_launches_reuse_their_bytes_until_scratch_moves(session, daemon, driver):
    launcher, function = _kernel(driver, daemon, global_scratch_size=64, global_scratch_align=64)
    n = 3000
    x, y, xb, yb, out = _inputs(session, n)
    for _ in range(3):
        launcher(1, 1, 1, 0, function, None, None, None, None, xb, yb, out, 1024, 1024)
    assert len(launcher._ops) == 1
    first = launcher._scratch["global"]
    # A larger grid needs a larger scratch buffer: the old one is freed, and
    # no kept launch may name it any more.
    launcher(3, 1, 1, 0, function, None, None, None, None, xb, yb, out, n, 1024)
    assert launcher._scratch["global"] is not first and len(launcher._ops) == 1
    launcher(1, 1, 1, 0, function, None, None, None, None, xb, yb, out, 1024, 1024)
    session.synchronize()  # a launch naming the freed buffer would fail here
    np.testing.assert_array_equal(out.get(), x + y)
    # Only buffers, ints and None make keys: a numpy scalar (or a float,
    # whose -0.0 == 0.0) is converted at each launch.
    kept = len(launcher._ops)
    launcher(1, 1, 1, 0, function, None, None, None, None, xb, yb, out, np.int32(16), 1024)
    assert len(launcher._ops) == kept


def test_a_freed_buffer_drops_the_kept_launches(session, daemon, driver):
    launcher, function = _kernel(driver, daemon)
    n = 2048
    x, y, xb, yb, out = _inputs(session, n)
    launcher(2, 1, 1, 0, function, None, None, None, None, xb, yb, out, n, 1024)
    assert len(launcher._ops) == 1
    spare = session.empty(16, "float32")
    spare.free()
    launcher(2, 1, 1, 0, function, None, None, None, None, xb, yb, out, n, 1024)
    assert len(launcher._ops) == 1  # made again after the free
    np.testing.assert_array_equal(out.get(), x + y)


def test_a_kernel_of_another_session_is_named(client, session, daemon, driver):
    launcher, _ = _kernel(driver, daemon)
    _, _, xb, yb, out = _inputs(session, 16)
    with client.session() as other:
        with open(daemon.cubin, "rb") as f:
            _, foreign, *_ = td.DriverMethods(other).utils.load_binary(
                "gx_add_scratch", f.read(), 0, 0)
        with pytest.raises(gpuexec.Error) as e:
            launcher(1, 1, 1, 0, foreign, None, None, None, None, xb, yb, out, 16, 1024)
    assert f"was loaded in session {other.token[:8]}" in e.value.message


def test_an_answer_is_collected_once_and_a_lost_one_is_an_error(session):
    later = session._commands.submit_later(gpuexec._wire.SYNCHRONIZE_OP)
    first = later.result()
    assert later.result() is first  # kept, not asked for again
    lost = session._commands.submit_later(gpuexec._wire.SYNCHRONIZE_OP)
    lost.result()
    with pytest.raises(gpuexec.Error, match="no longer held"):
        session._commands._stream._result_of(lost._id)  # as after an interrupted wait


def test_a_long_name_from_the_metadata_is_bounded_in_messages(session, daemon, driver):
    with open(daemon.cubin, "rb") as f:
        _, function, *_ = driver.utils.load_binary("gx_add_scratch", f.read(), 0, 0)
    launcher = Launcher(session, _source(), _metadata(name="k" * 5000))
    with pytest.raises(gpuexec.Error) as e:
        launcher(1, 1, 1, 0, function, None, None, None, None, "x", None, None, 1, 1024)
    assert len(e.value.message) < 600
