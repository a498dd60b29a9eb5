"""gRPC stubs of the gpuexec.v1 API (proto/gpuexec/v1/gpuexec.proto).

gpuexec_pb2 and gpuexec_pb2_grpc are generated and committed:
scripts/regenerate-python-stubs.sh writes them, and the test
python_stubs_current checks that they match the .proto.
"""
