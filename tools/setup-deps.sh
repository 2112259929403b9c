#!/usr/bin/env bash
# setup-deps.sh — install the Debian packages dtrain needs, only those missing.
# Usage: tools/setup-deps.sh [build|test|bench|all]   (default: build)
# Runs apt-get as root; as another user it prints the command to run instead.
set -euo pipefail
want=${1:-build}
pkgs=(build-essential cmake pkg-config libopenblas-dev zlib1g-dev libinih-dev
      libcjson-dev libssl-dev libmicrohttpd-dev libcurl4-openssl-dev dataset-fashion-mnist)
case $want in
  test) pkgs+=(libcmocka-dev clang libclang-rt-14-dev openmpi-bin libopenmpi-dev iproute2
                 prometheus chromium etcd-server etcd-client) ;;
  bench|all) pkgs+=(libcmocka-dev clang libclang-rt-14-dev openmpi-bin libopenmpi-dev iproute2
                    python3-torch python3-numpy) ;;
esac
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "dtrain: missing packages: ${missing[*]}" >&2
  echo "dtrain: run as root: apt-get install -y ${missing[*]}" >&2
  exit 1
fi
echo "dtrain: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
