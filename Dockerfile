# gpuexec: build on Debian 12, run on slim Debian 12.
#
# The build stage is plain Debian 12 running scripts/setup.sh, the same step
# the README's commands and CI run (CI runs it on every change, so the build
# stage is proven there; tests/deploy/check_dockerfile.sh checks the rest of
# this file). It needs no CUDA toolkit and no NVIDIA image: the daemon
# declares the part of the driver API it uses (server/cuda/cuda_api.h) and
# opens the driver at run time. Neither image has any CUDA: the NVIDIA
# container runtime injects libcuda.so.1 into the container at run time.
#
# The daemon serves TLS and names every client's tenant (a gpuexecd on a
# non-loopback address without them refuses to start), so it expects, under
# /etc/gpuexec (deploy/kubernetes/README.md shows how to make them):
#   tls/tls.crt, tls/tls.key   the server certificate and key; replace them
#                              by rename and the daemon reloads them
#   tenants/tenants.textproto  the tenants; reread on SIGHUP
# Mount directories, not single files: a file mounted alone keeps its old
# contents when it is replaced by rename.
#
#   docker build -t gpuexec:0.1.0 .
#   docker run --gpus all -p 50051:50051 -p 127.0.0.1:9464:9464 \
#       -v /etc/gpuexec/tls:/etc/gpuexec/tls:ro \
#       -v /etc/gpuexec/tenants:/etc/gpuexec/tenants:ro gpuexec
#
# The HEALTHCHECK runs the gpuexec tool over the daemon's Unix socket,
# /run/gpuexec/gpuexec.sock (the ENTRYPOINT serves it, whatever CMD says), as
# the image's user, uid 10001; the tenants file must name that uid:
#   tenant { name: "probe" uid: 10001 }
# Metrics on 9464 are plain HTTP, with tenant names: publish them on the
# host's loopback only (as above), or behind a network policy.
#
# Base images by a point release of Debian 12, not the moving "12": a
# rebuild takes the same system until this line changes. To pin further,
# name each by digest (debian:12.11@sha256:..., from `docker buildx
# imagetools inspect debian:12.11`).

FROM debian:12.11 AS build
WORKDIR /src
COPY . .
# The programs as `cmake --install` makes them, not the build tree's: the
# installed ones search only $ORIGIN/../lib for libraries
# (tests/deploy/check_rpath.sh checks both).
RUN ./scripts/setup.sh && ctest --test-dir build -L unit --output-on-failure \
    && cmake --install build --prefix /opt/gpuexec --component runtime --strip

FROM debian:12.11-slim
# Only the runtime libraries of gRPC and Protobuf (they bring Abseil, c-ares,
# RE2, OpenSSL and zlib) and the daemon's allocator (tcmalloc); no compilers,
# no -dev packages, no CUDA.
RUN apt-get update \
    && apt-get install -y --no-install-recommends libgrpc++1.51 libprotobuf32 libtcmalloc-minimal4 \
       ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 gpuexec \
    && useradd --system --uid 10001 --gid gpuexec --no-create-home gpuexec \
    && install -d -o gpuexec -g gpuexec -m 0755 /run/gpuexec \
    && install -d -m 0755 /etc/gpuexec /etc/gpuexec/tls /etc/gpuexec/tenants
COPY --from=build /opt/gpuexec/bin/gpuexecd /usr/local/bin/gpuexecd
COPY --from=build /opt/gpuexec/bin/gpuexec /usr/local/bin/gpuexec
ENV NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
USER gpuexec
EXPOSE 50051 9464
HEALTHCHECK --interval=10s --timeout=5s \
    CMD ["/usr/local/bin/gpuexec", "--target=unix:/run/gpuexec/gpuexec.sock", "--timeout=4s", "devices"]
ENTRYPOINT ["/usr/local/bin/gpuexecd", "--unix_socket=/run/gpuexec/gpuexec.sock"]
# Inside the container's own network namespace, listen on all its interfaces;
# who can reach the ports is decided by how the container is published, and
# who may use them by the certificate and the tenants.
CMD ["--listen=0.0.0.0:50051", \
     "--tls_cert=/etc/gpuexec/tls/tls.crt", "--tls_key=/etc/gpuexec/tls/tls.key", \
     "--tenants=/etc/gpuexec/tenants/tenants.textproto", \
     "--metrics_listen=0.0.0.0:9464"]
