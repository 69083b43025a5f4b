#!/usr/bin/env bash
# Builds a relocatable tarball of the DynaPipe binaries for machines that do
# not have this distribution's libraries (a cluster, or a lent GPU machine):
# the binaries plus every non-system shared library they need, with
# $ORIGIN-relative RUNPATHs. CUDA, cuBLAS and NCCL come from the target
# machine; run binaries through bin/dynapipe-env there to find them.
#
#   deploy/bundle.sh [--gpu-checks] [--out DIR]
#
#   --gpu-checks   also carry the CUDA kernel tests (for validating a GPU
#                  machine: bin/dynapipe-env bin/matmul_test, ...); xz-compressed
#   --out DIR      where the tarball goes (default out/bundle)
#
# On the target: tar -xzf dynapipe-bundle.tar.gz && dynapipe/bin/dynapipe-env dynapipe/bin/dynapipe-executor ...
# dynapipe/MANIFEST lists what was bundled and the glibc / libstdc++ versions needed.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

target=//deploy:bundle
file=dynapipe-bundle.tar.gz
out=out/bundle
while [ $# -gt 0 ]; do
  case "$1" in
    --gpu-checks) target=//deploy:gpu_bundle; file=dynapipe-gpu-bundle.tar.xz ;;
    --out) out="$2"; shift ;;
    *) echo "bundle: unknown argument '$1' (usage: deploy/bundle.sh [--gpu-checks] [--out DIR])" >&2; exit 2 ;;
  esac
  shift
done

bash deploy/setup.sh
echo "bundle: building $target (release)"
bazel build --config=release "$target"
mkdir -p "$out"
cp -f "bazel-bin/deploy/$file" "$out/$file"
chmod u+w "$out/$file"
echo "bundle: $out/$file ($(du -h "$out/$file" | cut -f1))"
tar -xOf "$out/$file" --wildcards '*/MANIFEST' | sed -n 2p | sed 's/^/bundle: /'
