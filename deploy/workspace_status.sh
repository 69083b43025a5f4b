#!/bin/sh
# Build facts for `--version` (Bazel's --workspace_status_command, set in
# .bazelrc): the commit, with -dirty when tracked files differ from it.
# Outside a git checkout (a source tarball) the commit is "unknown".
commit=$(git rev-parse --short=12 HEAD 2>/dev/null) || commit=unknown
if [ "$commit" != unknown ] && ! git diff --quiet HEAD -- 2>/dev/null; then
  commit="$commit-dirty"
fi
echo "STABLE_DYNAPIPE_COMMIT $commit"
