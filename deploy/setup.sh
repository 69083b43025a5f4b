#!/usr/bin/env bash
# Installs every build and test dependency of the DynaPipe runtime from the
# distribution's packages (Debian 12 / Ubuntu). Idempotent: a second run
# installs nothing and only reports. Never downloads anything else; the Bazel
# build itself is offline.
#
# Writes .bazelrc.local choosing --config=cuda when the CUDA toolkit (with
# nvcc and NCCL) is present and --config=nocuda otherwise.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

packages=(
  bazel-bootstrap          # Bazel 4.2.3, the build
  g++                      # C++20 compiler
  protobuf-compiler        # protoc
  libprotobuf-dev
  protobuf-compiler-grpc   # grpc_cpp_plugin
  libgrpc++-dev
  libhiredis-dev           # Redis client
  redis-server             # plan store (tests start their own on loopback)
  libspdlog-dev
  libfmt-dev
  libabsl-dev
  catch2                   # unit tests (v2)
  libgloo-dev              # CPU communication backend
  libopenblas-dev          # CPU math backend
  libbenchmark-dev         # Google Benchmark
  libcpp-httplib-dev       # status endpoint
  libsentencepiece-dev     # dynapipe data import --tokenizer: SentencePiece models
  python3                  # test-summary helper
  curl                     # deploy/local-cluster.sh health checks
  patchelf                 # deploy/bundle.sh: relocatable binaries
  slurmctld slurmd slurm-client munge  # deploy/local_slurm_test: the sbatch script on a real Slurm
  clang lld                # deploy/fuzz.sh: libFuzzer harnesses (fuzz/), in their own output base
  python3-torch            # benchmarks/: the PyTorch reference the CPU backend is measured against
  libjemalloc2             # benchmarks/: the allocator both sides run under
  prometheus               # promtool: the metrics tests check /metrics with it
  python3-grpcio python3-protobuf  # examples/python: the Python client (tests/integration:api_test runs it)
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${#missing[@]} package(s): ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  # The package lists may be empty on a fresh machine; refresh them once.
  if ! apt-cache show "${missing[0]}" >/dev/null 2>&1; then
    as_root apt-get update -q
  fi
  as_root apt-get install -y -q --no-install-recommends "${missing[@]}"
  echo "setup: installed: ${missing[*]}"
else
  echo "setup: all ${#packages[@]} packages already installed"
fi

# CUDA: compiled and linked where the toolkit exists, skipped (with a message)
# where it does not.
cuda_home="${CUDA_HOME:-/usr/local/cuda}"
if [ -x "$cuda_home/bin/nvcc" ] && { [ -e "$cuda_home/lib64/libnccl.so" ] || [ -e "$cuda_home/lib/libnccl.so" ] || ls /usr/lib/x86_64-linux-gnu/libnccl.so >/dev/null 2>&1; }; then
  echo "build --config=cuda" > "$here/.bazelrc.local"
  echo "setup: CUDA toolkit found at $cuda_home: CUDA backend will be built (--config=cuda)"
else
  echo "build --config=nocuda" > "$here/.bazelrc.local"
  echo "setup: no CUDA toolkit with NCCL at $cuda_home: building the CPU backend only (--config=nocuda)"
fi
