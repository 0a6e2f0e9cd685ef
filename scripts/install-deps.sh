#!/usr/bin/env bash
# Installs the system packages winnow builds and tests against. Debian's packages are the
# pinned versions (bookworm). Idempotent: skips apt when everything is already present.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libspdlog-dev libfmt-dev prometheus-cpp-dev libgtest-dev libgmock-dev
  libpcre2-dev libyaml-cpp-dev nlohmann-json3-dev libcli11-dev
  libcpp-httplib-dev libssl-dev
  libpython3-dev python3-jinja2
  python3-venv
  prometheus curl openssl
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all system packages present"
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
# Debian starts the prometheus service on install where systemd runs; the tests start their own
# Prometheus on a free loopback port.
if [[ " ${missing[*]} " == *" prometheus "* ]] && [ -d /run/systemd/system ]; then
  $SUDO systemctl disable --now prometheus >/dev/null 2>&1 || true
fi
