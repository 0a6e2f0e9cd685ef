#!/usr/bin/env bash
# Prints, one per line, the Debian/Ubuntu packages that hold the shared libraries the given
# binaries load (ldd), so the runtime image installs exactly the library packages the build
# stage linked against, whatever the base distribution calls them (Ubuntu 24.04 renames many to
# *t64, Debian 12 does not). The names carry the SONAME, so no version pin is needed.
# Libraries the runtime base already has (glibc, libgcc, libstdc++), the CUDA driver (mounted by
# the NVIDIA container toolkit at run time) and the CUDA libraries (cuBLAS, the CUDA runtime:
# the nvidia/cuda runtime base image has them) are left out. The CUDA libraries are skipped by
# name before any owner is looked up: outside the image they may come from a PyPI wheel
# (scripts/fetch-cuda-deps.sh), which no package owns.
#
#   deploy/docker/runtime-packages.sh build/winnow [more binaries...]
set -euo pipefail

[ $# -ge 1 ] || { echo "usage: $0 BINARY..." >&2; exit 2; }

# Packages the runtime base image always has, or that must come from the host.
SKIP_RE='^(libc6|libgcc-s1|libstdc\+\+6|libcuda1|libnvidia-.*|cuda-.*|libcudart.*)$'
# Library file names the CUDA runtime base image provides, whoever owns them here.
CUDA_LIB_RE='^lib(cublas|cublasLt|cudart|cuda)\.so'

candidates() {  # the paths dpkg may have recorded for a library (usrmerge, symlinks)
  local path="$1" real
  real="$(readlink -f "$path")"
  for p in "$path" "$real"; do
    echo "$p"
    case "$p" in
      /usr/*) echo "${p#/usr}" ;;
      *) echo "/usr$p" ;;
    esac
  done
}

# Every library the binaries load, and its candidate paths.
mapfile -t libs < <(for bin in "$@"; do
  ldd "$bin" | awk '$2 == "=>" && $3 ~ /^\// { print $3 }'
done | sort -u)
mapfile -t paths < <(for lib in "${libs[@]}"; do candidates "$lib"; done | sort -u)

# One dpkg-query call (it reads the whole database each time): "pkg[:arch][, pkg2]: /path".
declare -A owner=()
while IFS= read -r line; do
  path="${line##*: }"
  pkg="${line%%: *}"
  pkg="${pkg%%,*}"
  pkg="${pkg%%:*}"
  [ -n "${owner[$path]:-}" ] || owner["$path"]="$pkg"
done < <(dpkg-query -S "${paths[@]}" 2>/dev/null || true)

declare -A seen=()
missing=0
for lib in "${libs[@]}"; do
  [[ "$(basename "$lib")" =~ $CUDA_LIB_RE ]] && continue
  pkg=""
  while read -r c; do
    if [ -n "${owner[$c]:-}" ]; then pkg="${owner[$c]}"; break; fi
  done < <(candidates "$lib")
  if [ -z "$pkg" ]; then
    echo "runtime-packages: no package owns $lib" >&2
    missing=1
    continue
  fi
  [[ "$pkg" =~ $SKIP_RE ]] && continue
  seen["$pkg"]=1
done
[ "$missing" -eq 0 ] || exit 1

printf '%s\n' "${!seen[@]}" | sort
