#!/usr/bin/env bash
# Size limits on the project's own code: no source file over 600 lines and no
# function over 80 lines, outside tests, fuzz harnesses and kernels
# (runtime/kernels/, whose launch sequences read best whole). Exceptions, each
# with its reason, live in tools/code_size_exceptions.txt.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
git ls-files '*.cc' '*.h' '*.cu' '*.cuh' \
  | grep -v -E '_test\.cc$|^tests/|^fuzz/|^third_party/|^bazel/|^runtime/kernels/' \
  | xargs python3 tools/code_size.py --exceptions tools/code_size_exceptions.txt "$@"
