"""The command stream's hand-written messages against protobuf's own bytes
(no daemon needed): every argument kind, tensor maps, and launches with
their attributes through Function.launch on a session that only records."""

import math

import grpc
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


# ------------------------------------------------ tensor maps, launch attributes

_BUFFER = gpuexec.Buffer(None, 0x7F0000002000, 1 << 20)

_TENSOR_MAPS = [
    gpuexec.TensorMap(_BUFFER, "float32", [64, 32], [256], [16, 8]),
    gpuexec.TensorMap(gpuexec.Buffer(None, 0, 16), "uint8", [16], [], [16]),
    gpuexec.TensorMap(_BUFFER, "bfloat16", [512, 1000, 3], [1024, 1024000], [64, 128, 1],
                      [1, 1, 1], offset=4096, swizzle="128b", l2_promotion="128b",
                      oob_fill="nan"),
    gpuexec.TensorMap(_BUFFER, "TFLOAT32_FTZ", [1 << 32, 2, 3, 4, 5],
                      [(1 << 40) - 16, 16, 32, 48], [256, 1, 2, 3, 4], [8, 1, 2, 3, 4],
                      offset=(1 << 40), interleave="32b", swizzle=32, l2_promotion=256),
    gpuexec.TensorMap(_BUFFER, "int64", [3, 5], [32], [3, 5], interleave="16b",
                      swizzle="SWIZZLE_64B", l2_promotion="L2_PROMOTION_64B"),
]


@pytest.mark.parametrize("tensor_map", _TENSOR_MAPS, ids=repr)
def test_a_tensor_map_is_written_as_protobuf_writes_it(tensor_map):
    arg = tensor_map._as_kernel_arg()
    assert arg.kind == "tensor_map" and arg.size == 128
    assert _wire.arg_bytes(arg) == arg.to_proto().SerializeToString()
    assert _wire.launch_arg_field(arg) == pb.LaunchRequest(
        args=[arg.to_proto()]).SerializeToString()
    assert tensor_map._launch_field == _wire.launch_arg_field(arg)


def test_a_tensor_map_carries_every_field():
    m = pb.Arg.FromString(_wire.arg_bytes(_TENSOR_MAPS[2]._as_kernel_arg())).tensor_map
    T = pb.TensorMapArg
    assert (getattr(m, "global").buffer, getattr(m, "global").offset) == (0x7F0000002000, 4096)
    assert m.data_type == T.BFLOAT16
    assert list(m.global_dims) == [512, 1000, 3]
    assert list(m.global_strides) == [1024, 1024000]
    assert list(m.box_dims) == [64, 128, 1]
    assert list(m.element_strides) == [1, 1, 1]
    assert (m.interleave, m.swizzle, m.l2_promotion, m.oob_fill) == (
        T.INTERLEAVE_NONE, T.SWIZZLE_128B, T.L2_PROMOTION_128B, T.OOB_FILL_NAN_REQUEST_ZERO_FMA)
    m = pb.Arg.FromString(_wire.arg_bytes(_TENSOR_MAPS[0]._as_kernel_arg())).tensor_map
    assert m.data_type == T.FLOAT32 and list(m.element_strides) == []
    assert (m.interleave, m.swizzle, m.l2_promotion, m.oob_fill) == (0, 0, 0, 0)


class _Commands:
    """A session's command stream that keeps what it is given."""

    def __init__(self):
        self.ops = []

    def submit(self, op, wait):
        self.ops.append((op, wait))
        return pb.CommandResult(gpu_time_ns=2000) if wait else None

    def ring(self):
        return None  # no command ring: every command as the stream's bytes


def _offline_function(params=((0, 8), (8, 4))):
    """A Function of a Session that only records its launches."""
    session = gpuexec.Session.__new__(gpuexec.Session)
    session._commands = _Commands()
    module = type("M", (), {"session": session})()
    response = pb.GetFunctionResponse(
        function=0x1234, params=[pb.ParamInfo(offset=o, size=s) for o, s in params])
    return gpuexec.Function(module, "k", response), session._commands


_ATTRIBUTES = [
    ({}, {}),
    ({"cooperative": True}, {"cooperative": True}),
    ({"pdl": True}, {"programmatic_dependent_launch": True}),
    ({"non_portable_cluster": True, "cluster_policy": "spread"},
     {"non_portable_cluster": True,
      "cluster_scheduling_policy": pb.CLUSTER_SCHEDULING_POLICY_SPREAD}),
    ({"cluster_policy": "load_balancing"},
     {"cluster_scheduling_policy": pb.CLUSTER_SCHEDULING_POLICY_LOAD_BALANCING}),
    ({"cluster_policy": "default", "cooperative": 1, "pdl": 0}, {"cooperative": True}),
    ({"cluster_policy": "CLUSTER_SCHEDULING_POLICY_SPREAD", "cooperative": True, "pdl": True,
      "non_portable_cluster": True},
     {"cooperative": True, "programmatic_dependent_launch": True, "non_portable_cluster": True,
      "cluster_scheduling_policy": pb.CLUSTER_SCHEDULING_POLICY_SPREAD}),
]


@pytest.mark.parametrize("kwargs,fields", _ATTRIBUTES, ids=repr)
@pytest.mark.parametrize("how", ["launch", "launch sync", "launch_async"])
def test_launch_attributes_are_written_as_protobuf_writes_them(kwargs, fields, how):
    sync, use_async = how == "launch sync", how == "launch_async"
    function, commands = _offline_function([(0, 8), (8, 4), (16, 128)])
    args = (_BUFFER, gpuexec.i32(7), _TENSOR_MAPS[0])
    cluster = (2, 1, 1) if "cluster_policy" in kwargs else None
    for _ in range(2):  # the second from the cached fixed parts
        if use_async:
            function.launch_async(3, 128, *args, cluster=cluster, **kwargs)
        else:
            function.launch(3, 128, *args, cluster=cluster, sync=sync, **kwargs)
    expected = pb.LaunchRequest(
        function=0x1234, grid=pb.Dim3(x=3, y=1, z=1), block=pb.Dim3(x=128, y=1, z=1),
        args=[_BUFFER.ptr().to_proto(), gpuexec.i32(7).to_proto(),
              _TENSOR_MAPS[0]._as_kernel_arg().to_proto()],
        synchronize=sync, **fields)
    if cluster:
        expected.cluster.CopyFrom(pb.Dim3(x=2, y=1, z=1))
    for op, wait in commands.ops:
        assert wait == (not use_async)
        assert op == _wire.launch_op(expected.SerializeToString())
        assert pb.Command.FromString(op).launch == expected


def test_launch_attributes_without_arguments():
    function, commands = _offline_function([])
    function.launch_async(1, 32, cooperative=True, pdl=True)
    expected = pb.LaunchRequest(function=0x1234, grid=pb.Dim3(x=1, y=1, z=1),
                                block=pb.Dim3(x=32, y=1, z=1), cooperative=True,
                                programmatic_dependent_launch=True)
    assert commands.ops == [(_wire.launch_op(expected.SerializeToString()), False)]


@pytest.mark.parametrize("kwargs,needle", [
    ({"cooperative": "yes"}, "cooperative"),
    ({"cooperative": 2}, "cooperative"),
    ({"pdl": None}, "pdl"),
    ({"pdl": 1.0}, "pdl"),
    ({"non_portable_cluster": "True"}, "non_portable_cluster"),
    ({"cluster_policy": "round_robin"}, "cluster_policy"),
    ({"cluster_policy": 1}, "cluster_policy"),
    ({"cluster_policy": True}, "cluster_policy"),
])
def test_bad_launch_attributes_are_refused_before_any_call(kwargs, needle):
    function, commands = _offline_function()
    for launch in (function.launch, function.launch_async):
        with pytest.raises(gpuexec.Error) as e:
            launch(1, 32, _BUFFER, 1, **kwargs)
        assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert needle in e.value.message and e.value.message.startswith("gpuexec client:")
    assert commands.ops == []
