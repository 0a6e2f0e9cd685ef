#!/usr/bin/env bash
# Bundles what the GPU checks need into one folder, for a GPU machine that has the CUDA driver
# and cuBLAS but none of winnow's build dependencies (gRPC, Abseil, spdlog, ...):
#   bin/   stripped winnow, winnow_cuda_tests, gpu_bench, capacity_bench and structured_bench
#          from BUILD
#          (default build/)
#   lib/   the shared libraries they load, except glibc, libstdc++ and cuBLAS (the GPU
#          machine's own are used: a CUDA image has them)
# On the GPU machine: LD_LIBRARY_PATH=DIR/lib:<cuBLAS dir> DIR/bin/winnow_cuda_tests
#
#   scripts/gpu-bundle.sh OUT_DIR [BUILD]
set -euo pipefail
out=${1:?usage: gpu-bundle.sh OUT_DIR [BUILD]}
build=${2:-build}
mkdir -p "$out/bin" "$out/lib"
for exe in winnow winnow_cuda_tests gpu_bench capacity_bench structured_bench; do
  [[ -x "$build/$exe" ]] || continue
  strip -o "$out/bin/$exe" "$build/$exe"
done
skip='^(linux-vdso|libc\.so|libm\.so|ld-linux|libstdc\+\+|libgcc_s|libcublas|librt|libpthread|libdl|libz\.so|libssl|libcrypto)'
for exe in "$out"/bin/*; do
  ldd "$exe" | awk '$3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r name path; do
  [[ "$name" =~ $skip ]] && continue
  cp -L "$path" "$out/lib/$name"
done
du -sh "$out"/bin "$out"/lib
