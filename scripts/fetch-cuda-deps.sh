#!/usr/bin/env bash
# Fetches the CUDA build dependencies that the toolkit does not carry, from PyPI, pinned:
#   - cuBLAS / cuBLASLt (nvidia-cublas: headers and shared libraries), only when the CUDA
#     toolkit that nvcc belongs to has no cuBLAS of its own (the CUDA devel images have it,
#     a bare nvcc install does not);
#   - FlashInfer's C++ headers and the CCCL they are written against (flashinfer-python:
#     flashinfer/data/include and flashinfer/data/cccl; nothing else of the wheel is kept).
# Into WINNOW_CUDA_DEPS_DIR (default third_party/cuda, git-ignored), where CMake looks for them.
# Idempotent: a dependency whose stamp names the pinned version is left alone. Downloads
# ~62 MB (flashinfer-python) and ~421 MB (nvidia-cublas) the first time.
set -euo pipefail

CUBLAS_VERSION="13.0.2.14"        # cuBLAS of CUDA 13.0 (nvcc here and in the image is 13.0)
FLASHINFER_VERSION="0.7.2.post1"

root="$(cd "$(dirname "$0")/.." && pwd)"
dest="${WINNOW_CUDA_DEPS_DIR:-$root/third_party/cuda}"

if ! command -v nvcc >/dev/null 2>&1; then
  echo "fetch-cuda-deps: no nvcc on PATH: nothing to fetch (the build is CPU-only)"
  exit 0
fi
# The toolkit nvcc belongs to (nvcc on PATH may be a wrapper script elsewhere).
toolkit="$(nvcc --dryrun -c -x cu /dev/null 2>&1 | sed -n 's/^#\$ TOP=//p' | head -n 1)"

# fetch NAME VERSION SUBDIR PREFIX...: downloads the wheel of NAME==VERSION and extracts the
# members under each PREFIX into $dest/SUBDIR (PREFIX stripped of its first part).
fetch() {
  local name="$1" version="$2" subdir="$3"
  shift 3
  local out="$dest/$subdir"
  if [ "$(cat "$out/.version" 2>/dev/null)" = "$version" ]; then
    echo "fetch-cuda-deps: $name $version present in $out"
    return
  fi
  local tmp
  tmp="$(mktemp -d)"
  echo "fetch-cuda-deps: downloading $name==$version"
  python3 -m pip download --quiet --no-deps --only-binary=:all: "$name==$version" -d "$tmp"
  rm -rf "$out"
  mkdir -p "$out"
  python3 - "$tmp"/*.whl "$out" "$@" <<'PY'
import os, shutil, sys, zipfile
wheel, out, prefixes = sys.argv[1], sys.argv[2], sys.argv[3:]
with zipfile.ZipFile(wheel) as z:
    members = [m for m in z.infolist() if not m.is_dir()
               and any(m.filename.startswith(p + "/") for p in prefixes)]
    if not members:
        sys.exit(f"fetch-cuda-deps: nothing under {prefixes} in {wheel}")
    for m in members:
        # Keep the path below the prefix's parent: nvidia/cu13/include/x.h -> include/x.h.
        prefix = next(p for p in prefixes if m.filename.startswith(p + "/"))
        rel = os.path.join(os.path.basename(prefix), m.filename[len(prefix) + 1:])
        target = os.path.join(out, rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with z.open(m) as src, open(target, "wb") as dst:
            shutil.copyfileobj(src, dst)
        # Wheels keep the executable bit in the upper half of external_attr.
        mode = (m.external_attr >> 16) & 0o777
        os.chmod(target, mode or 0o644)
PY
  rm -rf "$tmp"
  echo "$version" > "$out/.version"
  echo "fetch-cuda-deps: $name $version -> $out"
}

if [ -n "$toolkit" ] && [ -f "$toolkit/include/cublasLt.h" ] \
    && { compgen -G "$toolkit/lib*/libcublasLt.so*" || compgen -G "$toolkit/targets/*/lib/libcublasLt.so*"; } \
      >/dev/null; then
  echo "fetch-cuda-deps: cuBLAS found in $toolkit: not fetching nvidia-cublas"
else
  fetch nvidia-cublas "$CUBLAS_VERSION" cublas nvidia/cu13/include nvidia/cu13/lib
  # The wheel ships only the versioned SONAMEs; the linker looks for the unversioned names.
  for lib in cublas cublasLt; do
    ln -sf "lib$lib.so.13" "$dest/cublas/lib/lib$lib.so"
  done
fi
fetch flashinfer-python "$FLASHINFER_VERSION" flashinfer flashinfer/data/include flashinfer/data/cccl
