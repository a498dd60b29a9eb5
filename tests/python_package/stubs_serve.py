#!/usr/bin/env python3
"""The committed stubs serve and are served with the grpcio and protobuf of
the Python that runs this (no gpuexecd needed): a gRPC server on a Unix
socket built from gpuexec.v1.gpuexec_pb2_grpc's servicer answers
ListDevices, and gpuexec.connect() reads the answer back, so both halves of
the generated code (messages and service) work with this runtime.
pip_install.py runs it in the venv it installs into; on another host (a
newer grpcio or protobuf) run it with the package importable:

    python3 stubs_serve.py
"""

import concurrent.futures
import os
import sys
import tempfile

import grpc
from google import protobuf

import gpuexec
from gpuexec.v1 import gpuexec_pb2 as pb
from gpuexec.v1 import gpuexec_pb2_grpc as pb_grpc


class _Daemon(pb_grpc.GpuExecServicer):
    def ListDevices(self, request, context):
        return pb.ListDevicesResponse(
            devices=[pb.Device(index=0, name="stub device", compute_capability_major=9,
                               memory_total_bytes=1 << 30, memory_free_bytes=1 << 29,
                               healthy=True)],
            daemon_version=gpuexec.__version__)


def main():
    with tempfile.TemporaryDirectory(prefix="gpuexec-stubs-serve-") as tmp:
        target = f"unix:{os.path.join(tmp, 's.sock')}"
        server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=2))
        pb_grpc.add_GpuExecServicer_to_server(_Daemon(), server)
        server.add_insecure_port(target)
        server.start()
        try:
            with gpuexec.connect(target, timeout=10) as client:
                devices = client.devices()
        finally:
            server.stop(None)
    got = [(d.index, d.name, d.compute_capability, d.memory_free_bytes, d.healthy)
           for d in devices]
    want = [(0, "stub device", (9, 0), 1 << 29, True)]
    if got != want:
        print(f"stubs_serve: FAILED: devices() read {got}, the server sent {want}")
        sys.exit(1)
    print(f"stubs_serve: ok: Python {sys.version.split()[0]}, grpcio {grpc.__version__}, "
          f"protobuf {protobuf.__version__}: the stubs serve ListDevices and gpuexec "
          f"{gpuexec.__version__} reads it")


main()
