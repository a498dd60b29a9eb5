"""The command stream's hand-written messages against protobuf's own bytes
(no daemon needed)."""

import math

import pytest

import gpuexec
from gpuexec import _wire
from gpuexec._args import Arg
from gpuexec.v1 import gpuexec_pb2 as pb

_ARGS = [
    gpuexec.i8(0), gpuexec.i8(-128), gpuexec.i8(127), gpuexec.i16(-300), gpuexec.i16(32767),
    gpuexec.i32(-1), gpuexec.i32(0), gpuexec.i32(-(1 << 31)), gpuexec.i32((1 << 31) - 1),
    gpuexec.i64(-(1 << 63)), gpuexec.i64((1 << 63) - 1), gpuexec.i64(-(1 << 40)),
    gpuexec.u8(0), gpuexec.u8(255), gpuexec.u16(65535), gpuexec.u32(0xFEDCBA98),
    gpuexec.u64(0), gpuexec.u64((1 << 64) - 1), gpuexec.u64(300),
    gpuexec.f16(1.5), gpuexec.bf16(-2.75), gpuexec.f16(1 + 2**-11 + 2**-40), gpuexec.f16(0.0),
    Arg("f16_bits", 0x3C01), Arg("bf16_bits", 65535), Arg("f16_bits", 0),
    gpuexec.f32(3.25), gpuexec.f32(0.0),
    gpuexec.f32(-0.0), gpuexec.f32(1e-50), gpuexec.f32(3.4e38), gpuexec.f32(1e40),
    gpuexec.f32(-1e40), gpuexec.f32(math.inf), gpuexec.f64(-1e300), gpuexec.f64(0.0),
    gpuexec.f64(math.inf), gpuexec.raw(b""), gpuexec.raw(b"\x00" * 128), gpuexec.raw(b"ab"),
    gpuexec.null(), Arg("buffer", 0x7F0000001000, 0), Arg("buffer", 5, 8),
    Arg("buffer", (1 << 64) - 1, (1 << 40)), Arg("buffer", 0, 0),
]


@pytest.mark.parametrize("arg", _ARGS, ids=repr)
def test_each_argument_is_written_as_protobuf_writes_it(arg):
    assert _wire.arg_bytes(arg) == arg.to_proto().SerializeToString()


def test_nan_arguments_stay_nan():
    for arg in (gpuexec.f32(math.nan), gpuexec.f64(math.nan)):
        value = getattr(pb.Arg.FromString(_wire.arg_bytes(arg)), arg.kind)
        assert math.isnan(value)


@pytest.mark.parametrize("value", [0, 1, 127, 128, 300, 16383, 16384, (1 << 63), (1 << 64) - 1])
def test_varints(value):
    assert pb.Command.FromString(b"\x08" + _wire.varint(value)).id == value


def test_a_command_parses_as_protobuf_reads_it():
    head = _wire.launch_head(7, pb.Dim3(x=4, y=1, z=1), pb.Dim3(x=256, y=1, z=1), 1024,
                             pb.Dim3(x=2, y=1, z=1))
    args = [gpuexec.f32(2.0), Arg("buffer", 0x1000, 16), gpuexec.u64(1 << 20)]
    launch = head + b"".join(_wire.launch_arg_field(a) for a in args) + _wire.LAUNCH_SYNCHRONIZE
    message = (_wire.session_field("tok") + _wire.command_field(5, True, _wire.launch_op(launch))
               + _wire.command_field(6, False, _wire.SYNCHRONIZE_OP)
               + _wire.command_field(1 << 40, True, _wire.BARRIER_OP))
    request = pb.ExecuteRequest.FromString(message)
    assert request.session == "tok"
    first, second, third = request.commands
    assert (first.id, first.reply, first.WhichOneof("op")) == (5, True, "launch")
    expected = pb.LaunchRequest(function=7, grid=pb.Dim3(x=4, y=1, z=1),
                                block=pb.Dim3(x=256, y=1, z=1), shared_memory_bytes=1024,
                                cluster=pb.Dim3(x=2, y=1, z=1),
                                args=[a.to_proto() for a in args], synchronize=True)
    assert first.launch == expected
    assert (second.id, second.reply, second.WhichOneof("op")) == (6, False, "synchronize")
    assert (third.id, third.reply, third.WhichOneof("op")) == (1 << 40, True, None)
