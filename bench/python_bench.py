#!/usr/bin/env python3
"""gpuexec's Python package measured as a user would use it, beside a bare
Python gRPC client of the benchmark's echo server; prints one JSON object.

gpuexec_bench runs it (over TCP and over the Unix socket) with the daemon
and echo server it started, and prints its figures beside the C++ client's:

    python_bench.py --target=ADDR --echo=ADDR --image=gx_kernels.cubin [--quick]

The figures (latencies in microseconds, rates per second, GB/s of 1e9):

  launch_sync_p50/p99   Function.launch(1, 1, sync=True) of the empty kernel
  unary_launch_p50/p99  the same as a bare unary Launch call (client.stub),
                        what the package's waiting launch was before it went
                        on the command stream
  async_rate            Function.launch_async, a synchronize() after each 8000
  write_gbps/read_gbps  Buffer.write from a host array, Buffer.read_into one
                        (median of --copy_trials)
  bare_stream_p50/p99   a round trip of a 16-byte message on an open Echo.Bidi
                        stream, its requests fed from a queue (as a client
                        that sends when it has something to send must)
  bare_core_stream_p50  the same round trip on grpcio's core call, polled by
                        the caller (how the package's command stream runs)
  bare_unary_p50/p99    Echo.Unary of an empty message

With --ring_only (a daemon serving command rings, gpuexecd --command_rings,
on its Unix socket) only launch_sync_p50/p99 and async_rate are measured,
through the session's command ring; ``on_ring`` is 1 when the ring carried
them (else ``ring_why`` says why not); with --untimed as well, on a session
opened with gpu_time=False (its work untimed).

Where grpcio (or the package) cannot be imported, it prints {"missing": why}
and exits 0: the benchmark then says so in its rows.
"""

import argparse
import json
import platform
import queue
import sys
import time

ASYNC_ROUND = 8000


def percentiles(samples):
    samples = sorted(samples)

    def at(q):
        return samples[min(len(samples) - 1, int(q * len(samples)))]

    return at(0.50), at(0.99)


def measure(n, ops, rounds=4):
    """Each of ``ops`` (name: function) n times after n/10 warm-up runs, in
    turn in ``rounds`` rounds, so that a drift of the host's speed weighs
    on all alike: {name: (p50, p99)} in microseconds."""
    clock = time.perf_counter
    samples = {name: [] for name in ops}
    for name, op in ops.items():
        for _ in range(max(1, n // 10)):
            op()
    for r in range(rounds):
        k = n // rounds + (1 if r < n % rounds else 0)
        for name, op in ops.items():
            us = samples[name]
            for _ in range(k):
                t0 = clock()
                op()
                us.append((clock() - t0) * 1e6)
    return {name: percentiles(us) for name, us in samples.items()}


def median(values):
    values = sorted(values)
    return values[len(values) // 2]


def host_array(size):
    """``size`` bytes with every page touched (first-touch faults untimed)."""
    try:
        import numpy as np
        data = np.empty(size, dtype=np.uint8)
        data[::4096] = 1
        return data
    except ImportError:
        data = bytearray(size)
        view = memoryview(data)
        for i in range(0, size, 4096):
            view[i] = 1
        return data


def bare(grpc, target, iters):
    """The bare Python gRPC round trips against the echo server."""
    out = {}
    options = [("grpc.max_receive_message_length", 64 << 20),
               ("grpc.max_send_message_length", 64 << 20)]
    with grpc.insecure_channel(target, options=options) as channel:
        grpc.channel_ready_future(channel).result(timeout=10)
        unary = channel.unary_unary("/gpuexec.bench.Echo/Unary", request_serializer=None,
                                    response_deserializer=None)
        bidi = channel.stream_stream("/gpuexec.bench.Echo/Bidi", request_serializer=None,
                                     response_deserializer=None)
        # A Blob of 16 bytes (about a launch message's size), encoded by hand:
        # field 1, length-delimited.
        message = b"\x0a\x10" + b"x" * 16
        requests = queue.SimpleQueue()

        def feed():
            while True:
                m = requests.get()
                if m is None:
                    return
                yield m

        responses = bidi(feed())

        def round_trip():
            requests.put(message)
            next(responses)

        ops = {"bare_unary": lambda: unary(b""), "bare_stream": round_trip}
        core = core_stream(channel, message)
        if core is not None:
            ops["bare_core_stream"] = core[0]
        try:
            for name, (p50, p99) in measure(iters, ops).items():
                out[name + "_p50"], out[name + "_p99"] = p50, p99
        finally:
            requests.put(None)
            for _ in responses:
                pass
            if core is not None:
                core[1]()  # before the channel closes: its close waits for the call
    return out


def core_stream(channel, message):
    """A round trip on an Echo.Bidi call of grpcio's core, polled by the
    caller (as the package's command stream runs), or None where grpcio
    lacks it."""
    try:
        from grpc._cython import cygrpc
        c = cygrpc
        operations = (((c.SendInitialMetadataOperation(None, 0),
                        c.ReceiveStatusOnClientOperation(0)), "status"),
                      ((c.ReceiveInitialMetadataOperation(0),), "initial"))
        args = (c.PropagationConstants.GRPC_PROPAGATE_DEFAULTS, b"/gpuexec.bench.Echo/Bidi", None,
                None, None, None, operations, c.build_census_context())
        try:
            call = channel._channel.segregated_call(*args)
        except TypeError:
            call = channel._channel.segregated_call(*args, None)
    except Exception:  # pylint: disable=broad-except
        return None
    batch = (c.SendMessageOperation(message, 0), c.ReceiveMessageOperation(0))
    left = {"status", "initial"}  # the call's events still to come

    def round_trip():
        call.operate(batch, "echo")
        while True:
            tag = call.next_event().tag
            if tag == "echo":
                return
            left.discard(tag)

    def end():
        call.cancel(c.StatusCode.cancelled, "done")
        while left:
            left.discard(call.next_event().tag)

    return round_trip, end


def async_launches(launch_async, synchronize, n):
    """Launches per second of ``n`` launch_async, in rounds of at most
    ASYNC_ROUND each ended by a synchronize: the daemon refuses launches
    beyond 8192 waiting behind a session's stream (RESOURCE_EXHAUSTED), and
    on the driver test double a client can outrun the device."""
    def launches(n):
        while n > 0:
            k = min(n, ASYNC_ROUND)
            for _ in range(k):
                launch_async(1, 1)
            synchronize()
            n -= k

    launches(max(1, n // 10))
    t0 = time.perf_counter()
    launches(n)
    return n / (time.perf_counter() - t0)


def ring(gpuexec, args):
    """The launch figures through the session's command ring."""
    out = {}
    with gpuexec.connect(args.target) as client, \
            client.session(gpu_time=not args.untimed) as session:
        empty = session.load_module(args.image).function(args.kernel)
        empty.launch(1, 1, sync=True)
        out["untimed"] = int(not session.gpu_time)
        commands = session._commands
        if getattr(commands, "_ring", None) is None:
            return {"missing": "a command ring: the daemon served none to this session"}
        got = measure(args.iters, {"launch_sync": lambda: empty.launch(1, 1, sync=True)})
        for name, (p50, p99) in got.items():
            out[name + "_p50"], out[name + "_p99"] = p50, p99
        out["async_rate"] = async_launches(empty.launch_async, session.synchronize,
                                           args.async_launches)
        out["async_launches"] = args.async_launches
        # Nothing went on the Execute stream.
        out["on_ring"] = int(commands._ring is not None and commands._stream._call is None)
    out["iters"] = args.iters
    return out


def run(args):
    version = platform.python_version()
    try:
        import grpc
    except ImportError as e:
        return {"missing": f"grpcio: {e}", "python": version}
    try:
        import gpuexec
        from gpuexec.v1 import gpuexec_pb2 as pb
    except ImportError as e:
        return {"missing": f"the gpuexec package: {e}", "python": version}
    try:
        from google.protobuf.internal import api_implementation
        protobuf_impl = api_implementation.Type()
    except ImportError:
        protobuf_impl = "?"
    import google.protobuf
    out = {"python": version, "grpcio": grpc.__version__,
           "protobuf": f"{google.protobuf.__version__} ({protobuf_impl})"}
    iters = args.iters
    if args.ring_only:
        return dict(out, **ring(gpuexec, args))
    with gpuexec.connect(args.target) as client, client.session() as session:
        out["command_stream"] = getattr(client, "command_stream", "iterator")
        empty = session.load_module(args.image).function(args.kernel)
        launch = empty.launch
        # The unary call, for comparison (in turn with the package's): what
        # Function.launch(sync=True) was before it went on the command
        # stream.
        request = pb.LaunchRequest(session=session.token, function=empty.handle,
                                   grid=pb.Dim3(x=1, y=1, z=1), block=pb.Dim3(x=1, y=1, z=1),
                                   synchronize=True)
        stub_launch = client.stub.Launch
        got = measure(iters, {"launch_sync": lambda: launch(1, 1, sync=True),
                              "unary_launch": lambda: stub_launch(request)})
        for name, (p50, p99) in got.items():
            out[name + "_p50"], out[name + "_p99"] = p50, p99

        out["async_rate"] = async_launches(empty.launch_async, session.synchronize,
                                           args.async_launches)
        out["async_launches"] = args.async_launches

        data = host_array(args.copy_bytes)
        with session.alloc(args.copy_bytes) as buf:
            def timed(op):
                t0 = time.perf_counter()
                op()
                return args.copy_bytes / (time.perf_counter() - t0) / 1e9

            out["write_gbps"] = median([timed(lambda: buf.write(data))
                                        for _ in range(args.copy_trials)])
            out["read_gbps"] = median([timed(lambda: buf.read_into(data))
                                       for _ in range(args.copy_trials)])
        out["copy_bytes"] = args.copy_bytes
    if args.echo:
        out.update(bare(grpc, args.echo, iters))
    out["iters"] = iters
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", required=True, help="the daemon: host:port or unix:PATH")
    parser.add_argument("--echo", default="", help="the benchmark's echo server (optional)")
    parser.add_argument("--image", required=True, help="the module with the empty kernel")
    parser.add_argument("--kernel", default="gx_empty")
    parser.add_argument("--quick", action="store_true",
                        help="few iterations and small copies: a smoke test")
    parser.add_argument("--iters", type=int, default=None)
    parser.add_argument("--async_launches", type=int, default=None)
    parser.add_argument("--copy_bytes", type=int, default=None)
    parser.add_argument("--copy_trials", type=int, default=None)
    parser.add_argument("--ring_only", action="store_true",
                        help="only the launch figures, through a command ring")
    parser.add_argument("--untimed", action="store_true",
                        help="with --ring_only: on an untimed session (gpu_time=False)")
    args = parser.parse_args()
    defaults = (50, 500, 32 << 20, 1) if args.quick else (2000, 100000, 1 << 30, 3)
    for name, value in zip(("iters", "async_launches", "copy_bytes", "copy_trials"), defaults):
        if getattr(args, name) is None:
            setattr(args, name, value)
    out = run(args)
    json.dump(out, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
