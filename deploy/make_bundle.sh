#!/usr/bin/env bash
# Makes a relocatable tarball of DynaPipe binaries (called by the Bazel
# genrules in deploy/BUILD; deploy/bundle.sh is the user-facing command).
#
#   make_bundle.sh OUT.tar.gz NAME [--file DEST=SRC]... BINARY...
#
#   --file DEST=SRC   also carry the file SRC at NAME/DEST (a job config, a
#                     lengths file), so that commands run from NAME/ read the
#                     same relative paths as in the source tree
#   BINARY            a Bazel output, or a binary of this machine given by its
#                     absolute path (/usr/bin/redis-server: a lent machine
#                     has none); bundled under its own name either way
#
# Layout inside the tarball (top folder NAME):
#   bin/       the binaries, RUNPATH $ORIGIN/../lib:/usr/local/cuda/lib64
#   lib/       every shared library they need that is not part of the C
#              runtime (glibc, libstdc++, libgcc_s) or of the CUDA stack;
#              each with RUNPATH $ORIGIN
#   bin/dynapipe-env   runs a command with the target's CUDA libraries found
#   MANIFEST   what was bundled, and the newest glibc / libstdc++ symbol
#              versions the bundle needs from the target machine
#
# CUDA, cuBLAS and NCCL are never bundled: they come from the target machine
# (its driver decides which runtime works), found by bin/dynapipe-env.
set -euo pipefail

out="$1"
name="$2"
shift 2

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
root="$work/$name"
mkdir -p "$root/bin" "$root/lib"

files=()
while [ $# -gt 0 ] && [ "$1" = --file ]; do
  dest="${2%%=*}"
  src="${2#*=}"
  case "$dest" in
    ""|/*|*..*) echo "make_bundle: --file $2: DEST must be a relative path inside the bundle" >&2; exit 2 ;;
  esac
  [ -f "$src" ] || { echo "make_bundle: --file $2: $src is not a file" >&2; exit 1; }
  mkdir -p "$root/$(dirname "$dest")"
  cp -L "$src" "$root/$dest"
  chmod u+w "$root/$dest"
  files+=("$dest")
  shift 2
done

# Provided by every Linux target: the C runtime and the C++ runtime (newer
# versions stay compatible with older builds); and the CUDA stack, which must
# match the target's driver.
is_target_provided() {
  case "$1" in
    linux-vdso.so.*|ld-linux*.so.*|libc.so.*|libm.so.*|libdl.so.*|libpthread.so.*|librt.so.*) return 0 ;;
    libresolv.so.*|libutil.so.*|libanl.so.*|libstdc++.so.*|libgcc_s.so.*) return 0 ;;
    libcuda.so.*|libcudart.so.*|libcublas.so.*|libcublasLt.so.*|libnccl.so.*|libcudnn*.so.*) return 0 ;;
    libnvidia-*.so.*|libnvrtc*.so.*|libnvJitLink.so.*) return 0 ;;
  esac
  return 1
}

needed_libs() {  # prints "soname path" for every library ldd resolves
  ldd "$1" | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }'
  ldd "$1" | awk '$2 == "=>" && $3 == "not" { print "MISSING", $1 }'
}

declare -A bundled=()
for bin in "$@"; do
  base="$(basename "$bin")"
  if [ ! -f "$bin" ]; then
    echo "make_bundle: $bin is not installed (deploy/setup.sh installs what the bundle takes from this machine)" >&2
    exit 1
  fi
  cp -L "$bin" "$root/bin/$base"
  chmod u+w "$root/bin/$base"
  # Without the DWARF of -g1 (symbols stay, so backtraces keep their
  # names): the GPU bundle fell from 53 to 21 MB (xz), the CPU bundle from
  # 38 to 26 MB (gzip), leaving room beside the tree in one transfer to a
  # lent machine.
  if [ "$(head -c 4 "$root/bin/$base" | tail -c 3)" = ELF ]; then strip --strip-debug "$root/bin/$base"; fi
  while read -r soname path; do
    if [ "$soname" = MISSING ]; then
      echo "make_bundle: $base needs $path, which is not installed" >&2
      exit 1
    fi
    is_target_provided "$soname" && continue
    [ -n "${bundled[$soname]:-}" ] && continue
    cp -L "$path" "$root/lib/$soname"
    chmod u+w "$root/lib/$soname"
    bundled[$soname]="$path"
  done < <(needed_libs "$bin")
done

for f in "$root"/bin/*; do
  patchelf --set-rpath '$ORIGIN/../lib:/usr/local/cuda/lib64' "$f"
done
for f in "$root"/lib/*; do
  patchelf --set-rpath '$ORIGIN' "$f"
done

# Newest symbol versions required from the target's glibc and libstdc++.
max_version() {  # prefix
  objdump -T "$root"/bin/* "$root"/lib/* 2>/dev/null | grep -o "$1[0-9.]*" | sort -uV | tail -1
}

cat > "$root/bin/dynapipe-env" <<'SCRIPT'
#!/usr/bin/env bash
# Runs a command of this bundle with the target machine's CUDA libraries
# (runtime, cuBLAS, NCCL, cuDNN, NVRTC, CUPTI) on the library path: CUDA_HOME
# or /usr/local/cuda, then those from Python's nvidia-* packages when the
# toolkit lacks them. Usage: bin/dynapipe-env bin/dynapipe-executor --backend cuda ...
# The search runs once per machine and CUDA_HOME: its result is kept in
# bin/.dynapipe-env.<host> (used while every directory in it still exists).
set -euo pipefail
cuda="${CUDA_HOME:-/usr/local/cuda}"
cache="$(dirname "$0")/.dynapipe-env.$(hostname 2>/dev/null || echo host)"
path="" cached=0
if [ -r "$cache" ] && [ "$(head -1 "$cache")" = "$cuda" ]; then
  cached=1
  path="$(sed -n 2p "$cache")"
  IFS=: read -r -a kept <<< "$path"
  for d in "${kept[@]}"; do [ -d "$d" ] || { cached=0; break; }; done
fi
if [ "$cached" = 0 ]; then
  dirs=()
  [ -d "$cuda/lib64" ] && dirs+=("$cuda/lib64")
  find_lib() {  # soname -> a directory holding it, searched where pip puts CUDA
    for d in "${dirs[@]}"; do [ -e "$d/$1" ] && return 0; done
    ldconfig -p 2>/dev/null | grep -q " $1 " && return 0
    local hit
    hit="$(find /usr /opt /root -path '*nvidia*' -name "$1" 2>/dev/null | head -1 || true)"
    [ -n "$hit" ] && dirs+=("$(dirname "$hit")")
    return 0
  }
  find_lib libcudart.so.13
  find_lib libcublasLt.so.13
  find_lib libcublas.so.13
  find_lib libnccl.so.2
  # Optional: cuDNN's fused attention (the tiled kernel runs without it) and
  # the NVRTC its runtime-compiled engines need; CUPTI for --kernel-trace.
  find_lib libcudnn.so.9
  find_lib libnvrtc.so.13
  find_lib libcupti.so.13
  path="$(IFS=:; echo "${dirs[*]:-}")"
  printf '%s\n%s\n' "$cuda" "$path" > "$cache.$$" 2>/dev/null && mv -f "$cache.$$" "$cache" 2>/dev/null || rm -f "$cache.$$"
fi
export LD_LIBRARY_PATH="${path}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
exec "$@"
SCRIPT
chmod +x "$root/bin/dynapipe-env"

{
  echo "bundle: $name"
  echo "needs from the target: glibc >= $(max_version GLIBC_ | sed 's/GLIBC_//'), libstdc++ >= $(max_version GLIBCXX_ | sed 's/GLIBCXX_//')"
  echo "binaries:"
  for f in "$root"/bin/*; do echo "  $(basename "$f")"; done
  echo "libraries (copied from):"
  for soname in $(printf '%s\n' "${!bundled[@]}" | sort); do echo "  $soname  ${bundled[$soname]}"; done
  if [ ${#files[@]} -gt 0 ]; then
    echo "files:"
    for f in "${files[@]}"; do echo "  $f"; done
  fi
} > "$root/MANIFEST"

# Reproducible archive: fixed order, owner and times; xz where OUT ends in
# .xz (the GPU bundle: about half gzip's size, so it and the tree fit in one
# transfer to a lent machine), gzip otherwise.
case "$out" in
  *.xz) compress=-J ;;
  *) compress=-z ;;
esac
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime='2000-01-01 00:00Z' \
  -C "$work" "$compress" -cf "$out" "$name"
