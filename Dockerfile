# gpuexec: build on Debian 12, run on slim Debian 12.
#
# The build stage runs the same scripts/setup.sh that the README and CI run.
# The CUDA toolkit (for cuda.h and nvcc; Debian 12 packages none new enough)
# comes from NVIDIA's image. The runtime image has no CUDA at all: the NVIDIA
# container runtime injects libcuda.so.1 into the container at run time.
#
#   docker build -t gpuexec .
#   docker run --gpus all -p 50051:50051 gpuexec

ARG CUDA_IMAGE=nvidia/cuda:13.0.0-devel-ubuntu24.04

FROM ${CUDA_IMAGE} AS cuda

FROM debian:12 AS build
COPY --from=cuda /usr/local/cuda /usr/local/cuda
WORKDIR /src
COPY . .
RUN ./scripts/setup.sh && ctest --test-dir build -L unit --output-on-failure \
    && strip build/server/gpuexecd

FROM debian:12-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends libgrpc++1.51 libprotobuf32 ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --no-create-home gpuexec
COPY --from=build /src/build/server/gpuexecd /usr/local/bin/gpuexecd
ENV NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
USER gpuexec
EXPOSE 50051
# Inside the container's own network namespace, listen on all its interfaces;
# who can reach the port is decided by how the container is published.
ENTRYPOINT ["/usr/local/bin/gpuexecd"]
CMD ["--listen=0.0.0.0:50051"]
