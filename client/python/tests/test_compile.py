"""Kernels from source: Session.compile, AsyncSession.compile and
gpuexec.RawKernel against a real gpuexecd that compiles with the NVRTC
named by GPUEXEC_TEST_NVRTC (the build names the NVRTC double, whose
"compiles" the driver double loads and runs for the kernels it models:
gx_saxpy, gx_fill_u32). Results are checked with numpy.

The daemon's compile cache outlives a test: each test compiles source of
its own (a tag in a comment) where it checks what the cache answers.
"""

import asyncio
import gc
import hashlib
import pathlib
import threading
import uuid
import weakref

import grpc
import numpy as np
import pytest

import gpuexec
import gpuexec.aio
from conftest import start_daemon, stop_daemon

# tests/kernels/gx_nvrtc_kernels.cu's kernels: extern "C" ones with the
# names and layouts of the driver double's models, and a template.
KERNELS = r'''
extern "C" {
__global__ void gx_saxpy(float a, const float* x, float* y, unsigned long long n) {
  unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
  unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  for (; i < n; i += stride) y[i] = a * x[i] + y[i];
}
__global__ void gx_fill_u32(unsigned int* out, unsigned int value, unsigned long long n) {
  unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
  unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  for (; i < n; i += stride) out[i] = value;
}
}
template <typename T>
__global__ void gx_axpy(T a, const T* x, T* y, unsigned long long n) {
  unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}
'''
AXPY_DOUBLE = "_Z7gx_axpyIdEvT_PKS0_PS0_y"
AXPY_FLOAT = "_Z7gx_axpyIfEvT_PKS0_PS0_y"


def fresh(source=KERNELS):
    """``source`` that no compile has seen yet (the daemon's cache is keyed
    by the text)."""
    return f"// test {uuid.uuid4().hex}\n{source}"


@pytest.fixture
def compiling(daemon):
    """The daemon, once it is known to compile kernels from source."""
    if not daemon.nvrtc:
        pytest.skip("kernels from source: GPUEXEC_TEST_NVRTC is not set (the NVRTC library "
                    "for the daemon's --nvrtc; the build sets it to the NVRTC double)")
    with gpuexec.connect(daemon.target) as client:
        answer = client.stub.ListDevices(gpuexec.v1.gpuexec_pb2.ListDevicesRequest())
    if not answer.nvrtc_version:
        pytest.skip(f"kernels from source: the daemon cannot compile with {daemon.nvrtc}: "
                    f"{answer.compile_unavailable}")
    return daemon


def saxpy_args(session, n, a=2.0):
    x = np.arange(n, dtype=np.float32)
    y = np.full(n, 0.5, dtype=np.float32)
    return x, y, session.upload(x), session.upload(y), a


def test_compile_then_launch_gives_numpys_saxpy(compiling, session):
    compiled = session.compile(fresh(), name="gx_nvrtc_kernels.cu")
    assert isinstance(compiled, gpuexec.CompiledModule)
    assert isinstance(compiled.module, gpuexec.Module)
    assert compiled.cached is False
    assert compiled.module.uploaded is True
    assert {"gx_saxpy", "gx_fill_u32"} <= set(compiled.kernels)
    assert compiled.arch.startswith("sm_") and compiled.arch[3:].isdigit()
    assert compiled.nvrtc_version == "13.0"
    assert compiled.compile_time > 0
    assert compiled.lowered_names == {}
    assert compiled.log == "" and compiled.log_bytes == 0

    saxpy = compiled.function("gx_saxpy")
    assert saxpy.name == "gx_saxpy"
    assert [tuple(p) for p in saxpy.params] == [(0, 4), (8, 8), (16, 8), (24, 8)]
    n = 3000
    x, y, xb, yb, a = saxpy_args(session, n)
    saxpy.launch((n + 255) // 256, 256, gpuexec.f32(a), xb, yb, gpuexec.u64(n))
    np.testing.assert_array_equal(yb.read_array(), (a * x + y).astype(np.float32))

    fill = compiled.module.function("gx_fill_u32")
    out = session.zeros(777, "uint32")
    fill(4, 128, (out, np.uint32(0xC0FFEE), np.uint64(777)))
    np.testing.assert_array_equal(out.get(), np.full(777, 0xC0FFEE, dtype=np.uint32))


def test_the_same_source_is_compiled_once_for_every_session(compiling, client):
    source = fresh()
    with client.session() as first, client.session() as second:
        a = first.compile(source)
        again = first.compile(source)
        b = second.compile(source)
        assert (a.cached, again.cached, b.cached) == (False, True, True)
        assert a.module.sha256 == again.module.sha256 == b.module.sha256
        assert len(a.module.sha256) == 64
        assert (again.module.uploaded, b.module.uploaded) == (False, False)
        # The time of the compile that filled the cache.
        assert b.compile_time == a.compile_time
        assert b.kernels == a.kernels
        # The cached module runs in the second session.
        out = second.zeros(64, "uint32")
        b.function("gx_fill_u32")(1, 64, (out, np.uint32(9), np.uint64(64)), sync=True)
        np.testing.assert_array_equal(out.get(), np.full(64, 9, dtype=np.uint32))
        # Other options are another compile.
        c = second.compile(source, options=["-std=c++17"])
        assert c.cached is False


def test_the_image_comes_back_when_asked_and_loads_in_another_session(compiling, client):
    source = fresh()
    with client.session() as first, client.session() as second:
        plain = first.compile(source)
        assert plain.image == b"" and plain.image_is_ptx is False
        kept = first.compile(source, return_image=True)
        assert kept.cached is True
        assert kept.image[:4] == b"\x7fELF"  # a cubin
        assert hashlib.sha256(kept.image).hexdigest() == kept.module.sha256
        loaded = second.load_module(kept.image)
        assert loaded.sha256 == kept.module.sha256
        out = second.zeros(64, "uint32")
        loaded.function("gx_fill_u32")(1, 64, (out, np.uint32(5), np.uint64(64)), sync=True)
        np.testing.assert_array_equal(out.get(), np.full(64, 5, dtype=np.uint32))


def test_name_expressions_give_the_kernels_of_a_template(compiling, session):
    compiled = session.compile(fresh(), name_expressions=["gx_axpy<float>", "gx_axpy<double>"])
    assert compiled.lowered_names == {"gx_axpy<float>": AXPY_FLOAT,
                                      "gx_axpy<double>": AXPY_DOUBLE}
    assert {AXPY_FLOAT, AXPY_DOUBLE, "gx_saxpy"} <= set(compiled.kernels)
    axpy = compiled.function("gx_axpy<double>")
    assert axpy.name == AXPY_DOUBLE
    assert [tuple(p) for p in axpy.params] == [(0, 8), (8, 8), (16, 8), (24, 8)]
    # By its lowered name too: the same Function.
    assert compiled.function(AXPY_DOUBLE) is axpy
    assert [tuple(p) for p in compiled.function("gx_axpy<float>").params] == [
        (0, 4), (8, 8), (16, 8), (24, 8)]
    # An instantiation the compile was not asked for: said here, before any call.
    with pytest.raises(gpuexec.Error) as e:
        compiled.function("gx_axpy<int>")
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "name_expressions=['gx_axpy<int>']" in e.value.message
    assert e.value.message.startswith("gpuexec client: ")


def test_a_name_expression_of_an_extern_c_kernel_names_it(compiling, session):
    compiled = session.compile(fresh(), name_expressions=("gx_fill_u32",))
    assert compiled.lowered_names == {"gx_fill_u32": "gx_fill_u32"}
    out = session.zeros(100, "uint32")
    compiled.function("gx_fill_u32")(1, 128, (out, np.uint32(77), np.uint64(100)))
    np.testing.assert_array_equal(out.get(), np.full(100, 77, dtype=np.uint32))


def test_a_compile_error_raises_with_nvrtcs_log(compiling, session):
    source = ("// a kernel of an unknown type\n"
              "extern \"C\" __global__ void broken(mystery_t x, float* y) {}\n")
    with pytest.raises(gpuexec.Error) as e:
        session.compile(source, name="broken.cu")
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "NVRTC's log" in e.value.message
    assert 'broken.cu(2): error: identifier "mystery_t" is undefined' in e.value.message
    assert 'error detected in the compilation of "broken.cu"' in e.value.message
    # What the user sees printed.
    assert 'identifier "mystery_t" is undefined' in str(e.value)
    # The session goes on.
    assert session.compile(fresh(), name="fine.cu").function("gx_saxpy").name == "gx_saxpy"


def test_an_error_directive_is_in_the_log(compiling, session):
    with pytest.raises(gpuexec.Error) as e:
        session.compile(fresh("#ifndef WIDTH\n#error define WIDTH with -DWIDTH=N\n#endif\n"),
                        name="needs_width.cu")
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "#error directive: define WIDTH with -DWIDTH=N" in e.value.message
    # With the option, it compiles (to a module with no kernel).
    compiled = session.compile(
        fresh("#ifndef WIDTH\n#error define WIDTH with -DWIDTH=N\n#endif\n"),
        options=["-DWIDTH=4"])
    assert compiled.kernels == []


def test_headers_and_options_select_what_is_compiled(compiling, session):
    header = ('#pragma once\n'
              '#if defined(WITH_FILL)\n'
              'extern "C" __global__ void gx_fill_u32(unsigned int* out, unsigned int value,\n'
              '                                       unsigned long long n) {\n'
              '  unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;\n'
              '  if (i < n) out[i] = value;\n'
              '}\n'
              '#endif\n')
    source = fresh('#include "fill.cuh"\n')
    with_fill = session.compile(source, headers={"fill.cuh": header}, options=["-DWITH_FILL"])
    assert with_fill.kernels == ["gx_fill_u32"]
    out = session.zeros(300, "uint32")
    with_fill.function("gx_fill_u32")(3, 128, (out, np.uint32(5), np.uint64(300)))
    np.testing.assert_array_equal(out.get(), np.full(300, 5, dtype=np.uint32))
    # Headers as pairs, their text as UTF-8 bytes, and without the define.
    without = session.compile(source.encode(), headers=[("fill.cuh", header.encode())])
    assert without.kernels == []
    assert without.module.sha256 != with_fill.module.sha256
    # A header that is not given: NVRTC's words.
    with pytest.raises(gpuexec.Error) as e:
        session.compile(source, name="lonely.cu")
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert 'cannot open source file "fill.cuh"' in e.value.message


def test_a_successful_compiles_warnings_are_its_log(compiling, session):
    # An unused variable: NVRTC's warning #177-D, which the double gives
    # on its marker's line.
    source = KERNELS + 'extern "C" __global__ void gx_warn() { int x; }  // GXFAKE_COMPILE_WARN\n'
    compiled = session.compile(fresh(source), name="warn.cu")
    assert "warning #177-D" in compiled.log
    assert compiled.log.startswith("warn.cu(")
    # NVRTC's whole log, of which the daemon sends the printable text
    # (trailing whitespace dropped); not cut short.
    assert len(compiled.log.encode()) <= compiled.log_bytes <= len(compiled.log.encode()) + 4
    assert not compiled.log.endswith("...")
    assert "cached" not in repr(compiled) and compiled.arch in repr(compiled)


def test_the_daemon_refuses_options_off_its_allow_list(compiling, session):
    with pytest.raises(gpuexec.Error) as e:
        session.compile(fresh(), options=["-arch=sm_80"])
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "-arch" in e.value.message
    assert not e.value.message.startswith("gpuexec client:")


def test_arguments_of_the_wrong_type_are_refused_before_any_call(session):
    # No compiling daemon is needed: nothing is sent.
    cases = [
        (lambda: session.compile(1234), "source must be a str"),
        (lambda: session.compile(pathlib.Path("k.cu")), "pathlib.Path(path).read_text()"),
        (lambda: session.compile(b"\xff\xfe kernel"), "not UTF-8"),
        (lambda: session.compile("", name=3), "name (the source's file name"),
        (lambda: session.compile("", options=["-DX", 4]), "options[1] must be a str"),
        (lambda: session.compile("", options=4), "options must be a str or a sequence"),
        (lambda: session.compile("", name_expressions=[None]), "name_expressions[0]"),
        (lambda: session.compile("", headers="util.cuh"), "headers must map"),
        (lambda: session.compile("", headers={"a.cuh": 1}), "header 'a.cuh'"),
        (lambda: session.compile("", headers=[("a.cuh",)]), "headers must map"),
        (lambda: gpuexec.RawKernel("", ""), "RawKernel's name"),
        (lambda: gpuexec.RawKernel(None, "k"), "source must be a str"),
    ]
    for call, words in cases:
        with pytest.raises(gpuexec.Error) as e:
            call()
        assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT, words
        assert e.value.message.startswith("gpuexec client: "), e.value.message
        assert words in e.value.message, (words, e.value.message)


def test_a_daemon_that_cannot_compile_says_why(daemon, tmp_path_factory):
    d = tmp_path_factory.mktemp("nocc")  # short: a Unix socket's path is
    log_path, socket = d / "gpuexecd.log", d / "d.sock"
    process, _ = start_daemon(
        daemon.binary, [f"--driver={daemon.driver}", "--listen=", f"--unix_socket={socket}",
                        "--compile=false"], str(log_path))
    try:
        with gpuexec.connect(f"unix:{socket}") as client, client.session() as s:
            with pytest.raises(gpuexec.Error) as e:
                s.compile(KERNELS)
            assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
            assert "cannot compile kernels from source" in e.value.message
            assert "LoadModule" in e.value.message
    finally:
        stop_daemon(process)


class CountingCompiles:
    """Session.compile, counted per session."""

    def __init__(self, monkeypatch):
        self.calls = []
        compile_ = gpuexec.Session.compile

        def counted(session, *args, **kwargs):
            self.calls.append(session)
            return compile_(session, *args, **kwargs)
        monkeypatch.setattr(gpuexec.Session, "compile", counted)


def test_raw_kernel_compiles_once_per_session_and_launches(compiling, client, monkeypatch):
    counting = CountingCompiles(monkeypatch)
    saxpy = gpuexec.RawKernel(fresh(), "gx_saxpy", name_expressions=())
    assert counting.calls == []  # nothing is compiled before its first use
    n = 2048
    with client.session() as s1, client.session() as s2:
        x, y, xb, yb, a = saxpy_args(s1, n)
        # CuPy's call, the session first.
        assert saxpy(s1, (n // 256,), (256,), (np.float32(a), xb, yb, np.uint64(n))) is None
        expected = (a * x + y).astype(np.float32)
        np.testing.assert_array_equal(yb.read_array(), expected)
        # Numba's configuration: the same compile, the same Function.
        saxpy[n // 256, 256](s1, np.float32(a), xb, yb, np.uint64(n))
        np.testing.assert_array_equal(yb.read_array(), (a * x + expected).astype(np.float32))
        gpu_s = saxpy(s1, 1, 256, (np.float32(0.0), xb, yb, np.uint64(n)), sync=True)
        assert isinstance(gpu_s, float) and gpu_s >= 0
        assert counting.calls == [s1]
        first = saxpy.compile(s1)
        assert first.cached is False
        assert saxpy.function(s1) is first.function("gx_saxpy")

        # Another session compiles once too, answered by the daemon's cache.
        x2, y2, xb2, yb2, _ = saxpy_args(s2, 100)
        saxpy(s2, 1, 128, (np.float32(3.0), xb2, yb2, np.uint64(100)))
        saxpy.function(s2).launch(1, 128, gpuexec.f32(1.0), xb2, yb2, gpuexec.u64(100))
        np.testing.assert_array_equal(yb2.read_array(),
                                      (x2 + (3.0 * x2 + y2)).astype(np.float32))
        assert counting.calls == [s1, s2]
        assert saxpy.compile(s2).cached is True
        assert saxpy.compile(s2).module.session is s2
        assert saxpy.compile(s1) is first


def test_raw_kernel_compiles_once_when_threads_race(compiling, session, monkeypatch):
    counting = CountingCompiles(monkeypatch)
    fill = gpuexec.RawKernel(fresh(), "gx_fill_u32")
    outs = [session.zeros(256, "uint32") for _ in range(8)]
    errors = []

    def launch(i):
        try:
            fill(session, 1, 256, (outs[i], np.uint32(i + 1), np.uint64(256)), sync=True)
        except Exception as e:  # pylint: disable=broad-except
            errors.append(e)
    threads = [threading.Thread(target=launch, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert counting.calls == [session]
    for i, out in enumerate(outs):
        np.testing.assert_array_equal(out.get(), np.full(256, i + 1, dtype=np.uint32))


def test_raw_kernel_of_a_template_and_what_it_refuses(compiling, session):
    axpy = gpuexec.RawKernel(fresh(), "gx_axpy<double>")
    assert axpy.name_expressions == ("gx_axpy<double>",)
    assert axpy.function(session).name == AXPY_DOUBLE
    assert axpy.compile(session).lowered_names == {"gx_axpy<double>": AXPY_DOUBLE}
    with pytest.raises(gpuexec.Error) as e:
        axpy(None, 1, 1, ())
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "the first argument must be a gpuexec.Session" in e.value.message
    with pytest.raises(gpuexec.Error) as e:
        axpy[1](session)
    assert "k[grid, block]" in e.value.message
    # A kernel the source does not have: the daemon's NOT_FOUND, at first use.
    missing = gpuexec.RawKernel(fresh(), "gx_nothere")
    with pytest.raises(gpuexec.Error) as e:
        missing(session, 1, 1, ())
    assert e.value.code == grpc.StatusCode.NOT_FOUND
    assert "gx_nothere" in e.value.message


def test_raw_kernel_keeps_no_session_alive(compiling, client):
    fill = gpuexec.RawKernel(fresh(), "gx_fill_u32")
    with client.session() as s:
        out = s.zeros(10, "uint32")
        fill(s, 1, 32, (out, np.uint32(4), np.uint64(10)))
        np.testing.assert_array_equal(out.get(), np.full(10, 4, dtype=np.uint32))
    gone = weakref.ref(s)
    del s, out
    gc.collect()
    assert gone() is None


def test_aio_compile_launch_and_errors(compiling):
    source = fresh()
    n = 1000

    async def main():
        async with gpuexec.aio.connect(compiling.target) as client, client.session() as s:
            compiled = await s.compile(source, name_expressions=["gx_axpy<double>"])
            assert isinstance(compiled, gpuexec.aio.AsyncCompiledModule)
            assert isinstance(compiled.module, gpuexec.aio.AsyncModule)
            assert compiled.cached is False
            assert compiled.lowered_names == {"gx_axpy<double>": AXPY_DOUBLE}
            assert (await compiled.function("gx_axpy<double>")).name == AXPY_DOUBLE
            saxpy = await compiled.function("gx_saxpy")
            x = np.arange(n, dtype=np.float32)
            y = np.ones(n, dtype=np.float32)
            xb, yb = await s.upload(x), await s.upload(y)
            await saxpy.launch(4, 256, gpuexec.f32(2.0), xb, yb, gpuexec.u64(n))
            np.testing.assert_array_equal(await yb.get(), (2.0 * x + y).astype(np.float32))
            again = await s.compile(source, name_expressions=["gx_axpy<double>"])
            assert again.cached is True and again.module.sha256 == compiled.module.sha256
            try:
                await s.compile("extern \"C\" __global__ void k(nope_t x) {}\n", name="aio.cu")
            except gpuexec.Error as e:
                return e
            return None

    error = asyncio.run(main())
    assert error is not None, "the broken source compiled"
    assert error.code == grpc.StatusCode.INVALID_ARGUMENT
    assert 'aio.cu(1): error: identifier "nope_t" is undefined' in error.message
