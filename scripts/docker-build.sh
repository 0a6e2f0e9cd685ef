#!/usr/bin/env bash
# Builds the winnow container image from the root Dockerfile, on a machine where a Docker engine
# with BuildKit runs (the development machines and CI of this repository have the docker CLI
# only; there `make test` lints the Dockerfile with hadolint instead).
#
#   scripts/docker-build.sh                    # CUDA image:  winnow:<version>-cuda
#   scripts/docker-build.sh --cpu              # CPU image:   winnow:<version>-cpu
#   scripts/docker-build.sh --image REG/winnow --push
#   scripts/docker-build.sh -- --build-arg CUDA_ARCHITECTURES=90   # extra `docker build` args
#
# Environment: CUDA_VERSION, UBUNTU_VERSION, DEBIAN_VERSION override the Dockerfile's defaults.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
flavor=cuda
image=winnow
push=0
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --cpu) flavor=cpu ;;
    --cuda) flavor=cuda ;;
    --image) image="$2"; shift ;;
    --push) push=1 ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "docker-build: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done

if ! docker info >/dev/null 2>&1; then
  echo "docker-build: no Docker engine is reachable (docker info failed)" >&2
  exit 1
fi

version="$(git -C "$root" describe --tags --always --dirty 2>/dev/null || echo dev)"
args=(--build-arg "FLAVOR=$flavor")
for var in CUDA_VERSION UBUNTU_VERSION DEBIAN_VERSION; do
  [ -z "${!var:-}" ] || args+=(--build-arg "$var=${!var}")
done
tag="$image:$version-$flavor"

echo "docker-build: $tag"
DOCKER_BUILDKIT=1 docker build "${args[@]}" -t "$tag" -t "$image:latest-$flavor" \
  -f "$root/Dockerfile" "${extra[@]}" "$root"
if [ "$push" -eq 1 ]; then
  docker push "$tag"
  docker push "$image:latest-$flavor"
fi
echo "docker-build: built $tag"
