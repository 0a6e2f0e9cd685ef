# syntax=docker/dockerfile:1
#
# winnow container image, two flavours from one file (scripts/docker-build.sh wraps both):
#
#   CUDA (default)  build on nvidia/cuda:<CUDA_VERSION>-devel-ubuntu<UBUNTU_VERSION>,
#                   run on the matching nvidia/cuda:<CUDA_VERSION>-runtime-ubuntu<UBUNTU_VERSION>
#   CPU             --build-arg FLAVOR=cpu: build on debian:<DEBIAN_VERSION>, run on its -slim
#
# The model is not in the image. Kubernetes fetches it with an init container into a volume
# (deploy/helm/winnow); with plain Docker, mount a directory holding the GGUF at /models:
#
#   scripts/fetch-model.sh && docker run --rm -p 50051:50051 -p 8000:8000 \
#       -v "$PWD/models:/models:ro" winnow:latest
#
# Why not baked in: docs/deploy.md, "Where the model comes from".
# HEALTHCHECK asks grpc.health.v1 through winnow-health-probe (deploy/docker/health_probe.cc).

ARG FLAVOR=cuda
# CUDA 13.0: the nvcc the kernels are compiled and checked with on the development machines (hosts
# need an NVIDIA driver of the 580 series or newer).
ARG CUDA_VERSION=13.0.1
ARG UBUNTU_VERSION=24.04
ARG DEBIAN_VERSION=bookworm

# ---------------------------------------------------------------------------------------------
# Build stage. The CUDA base is Ubuntu 24.04: 22.04's CMake (3.22) is older than the 3.24
# CMakeLists.txt needs. The package names below are the same on Ubuntu 24.04 and Debian 12.
FROM nvidia/cuda:${CUDA_VERSION}-devel-ubuntu${UBUNTU_VERSION} AS build-cuda
FROM debian:${DEBIAN_VERSION} AS build-cpu

# hadolint ignore=DL3006
FROM build-${FLAVOR} AS build
ARG FLAVOR
# GPU architectures the CUDA kernels are compiled for: A100, A10/A40/RTX 30, L4/L40/RTX 40,
# H100/H200, B200/GB200, RTX PRO 6000/RTX 50 (the local default is 90 alone, for build time).
ARG CUDA_ARCHITECTURES="80;86;89;90;100;120"
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ARG DEBIAN_FRONTEND=noninteractive
# The build toolchain and -dev packages: scripts/install-deps.sh's list without the test-only
# ones (tests/python/test_deploy.py keeps the two in step), in the base distribution's versions.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      build-essential cmake ninja-build pkg-config \
      libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler \
      libabsl-dev libspdlog-dev libfmt-dev prometheus-cpp-dev libgtest-dev libgmock-dev \
      libpcre2-dev libyaml-cpp-dev nlohmann-json3-dev libcli11-dev libcpp-httplib-dev libssl-dev \
      libpython3-dev python3-jinja2 \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /src
# The CUDA flavour takes FlashInfer's headers from PyPI (scripts/fetch-cuda-deps.sh), with pip;
# its cuBLAS is the devel image's own.
# hadolint ignore=DL3008
RUN if [ "${FLAVOR}" = "cuda" ]; then \
      apt-get update \
      && apt-get install -y --no-install-recommends python3-pip \
      && rm -rf /var/lib/apt/lists/*; \
    fi
COPY . .
# Portable kernels (AVX2/FMA, not -march=native): the image runs on machines other than the
# one that built it. pkg-config's flags are meant to split into words (SC2046).
# hadolint ignore=SC2046
RUN cuda=OFF; if [ "${FLAVOR}" = "cuda" ]; then cuda=ON; bash scripts/fetch-cuda-deps.sh; fi \
 && cmake -S . -B /build -G Ninja -DCMAKE_BUILD_TYPE=Release -DWINNOW_NATIVE=OFF \
      -DWINNOW_CUDA="${cuda}" -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHITECTURES}" \
 && cmake --build /build --target winnow -j"$(nproc)" \
 && g++ -O2 -std=c++17 deploy/docker/health_probe.cc -o /build/winnow-health-probe \
      $(pkg-config --cflags --libs grpc++) \
 && strip /build/winnow /build/winnow-health-probe \
 && bash deploy/docker/runtime-packages.sh /build/winnow /build/winnow-health-probe \
      > /build/runtime-packages.txt \
 && cat /build/runtime-packages.txt

# ---------------------------------------------------------------------------------------------
# Runtime stage: the base image plus the packages holding the shared libraries the binaries
# load. Their names carry the library's SONAME (libgrpc++1.51, libabsl20220623, ...), so the
# archive's current version is ABI-compatible with the build without pinning it.
# (The nvidia/cuda images set NVIDIA_VISIBLE_DEVICES and NVIDIA_DRIVER_CAPABILITIES, which tell
# the NVIDIA container toolkit to mount the driver's libraries.) python3-jinja2 is the one
# package no library names: the embedded interpreter imports it to render chat templates.
FROM nvidia/cuda:${CUDA_VERSION}-runtime-ubuntu${UBUNTU_VERSION} AS runtime-cuda
FROM debian:${DEBIAN_VERSION}-slim AS runtime-cpu

# hadolint ignore=DL3006
FROM runtime-${FLAVOR} AS runtime
ARG FLAVOR
ARG DEBIAN_FRONTEND=noninteractive
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
COPY --from=build /build/runtime-packages.txt /tmp/runtime-packages.txt
RUN apt-get update \
 && xargs -a /tmp/runtime-packages.txt apt-get install -y --no-install-recommends python3-jinja2 \
 && rm -rf /var/lib/apt/lists/* /tmp/runtime-packages.txt \
 && groupadd --system --gid 10001 winnow \
 && useradd --system --uid 10001 --gid 10001 --home-dir /nonexistent --no-create-home \
      --shell /usr/sbin/nologin winnow \
 && mkdir -p /models

COPY --from=build /build/winnow /build/winnow-health-probe /usr/local/bin/

LABEL org.opencontainers.image.title="winnow" \
      org.opencontainers.image.description="gRPC LLM inference server with a compressed paged KV cache" \
      io.winnow.flavor="${FLAVOR}"

# Numeric user, so Kubernetes' runAsNonRoot can verify it without resolving names.
USER 10001:10001
# 50051: gRPC (winnow.v1.Inference, grpc.health.v1, reflection); 8000: HTTP (OpenAI API,
# /health, Prometheus /metrics).
EXPOSE 50051 8000
# The default model takes well under a minute to load; large models take longer, hence the
# long start period (failures inside it do not count).
HEALTHCHECK --interval=15s --timeout=5s --start-period=300s --retries=3 \
  CMD ["winnow-health-probe", "--timeout", "4"]
# winnow is PID 1: SIGTERM starts the drain (health NOT_SERVING, in-flight requests finish
# within --drain-timeout), a second SIGTERM cancels what is left. Give `docker stop` a
# --time above the drain timeout.
STOPSIGNAL SIGTERM
ENTRYPOINT ["winnow"]
CMD ["serve", "--model", "/models/SmolLM2-135M-Instruct.Q4_1.gguf"]
