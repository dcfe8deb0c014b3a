#!/usr/bin/env bash
# scripts/gpu-bundle.sh [DIR] — run on a CPU machine that reaches Debian's registry: downloads
# (apt-get download; nothing is installed) the .deb files that dtf's CUDA build, its GPU tests
# and the CPU dry run need on a machine without any registry, and the Fashion-MNIST data, into
# DIR (default .gpu-bundle/, ignored by git; a device call carries it). scripts/gpu-check.sh
# unpacks them into a private prefix there. Refuses a bundle over 48 MiB.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-.gpu-bundle}
limit_mib=48

# What each package gives (headers and CMake packages unless said). Runtime libraries that
# every Linux has (zlib, OpenSSL 3) come too, so the bundle's development links never point
# outside the prefix.
pkgs=(
  libasio-dev             # transport (standalone Asio)
  libcereal-dev           # control messages, checkpoint metadata
  libxtensor-dev xtl-dev  # host tensors
  nlohmann-json3-dev      # JSON (TF_CONFIG, dtfrun, checkpoints)
  libssl-dev libssl3      # HMAC, TLS 1.3
  zlib1g-dev zlib1g       # gzip-compressed IDX files
  catch2                  # dtf_tests (Catch2 v2, header-only)
  libopenblas-pthread-dev libopenblas0-pthread  # GEMM of the CPU build (--dry-run only)
  dataset-fashion-mnist   # the data of the examples and benchmarks (30 MB of the bundle)
)

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
chmod 755 "$tmp"  # apt's download user writes there
if ! (cd "$tmp" && apt-get download "${pkgs[@]}" >/dev/null 2>&1); then
  echo "gpu-bundle: apt-get download failed; refreshing the package lists once" >&2
  sudo=""
  [[ $(id -u) -eq 0 ]] || sudo="sudo"
  $sudo apt-get update -qq
  (cd "$tmp" && apt-get download "${pkgs[@]}" >/dev/null)
fi

total=$(du -cb "$tmp"/*.deb | tail -1 | cut -f1)
if ((total > limit_mib * 1024 * 1024)); then
  echo "gpu-bundle: $((total / 1024 / 1024)) MiB is over the $limit_mib MiB limit" >&2
  exit 1
fi
rm -rf "$dir"
mkdir -p "$dir"
mv "$tmp"/*.deb "$dir"/
{
  echo "# dtf GPU bundle, made $(date -u +%Y-%m-%dT%H:%MZ) on $(. /etc/os-release && echo "$PRETTY_NAME")"
  echo "# package version bytes sha256"
  for f in "$dir"/*.deb; do
    printf '%s %s %s %s\n' "$(dpkg-deb -f "$f" Package)" "$(dpkg-deb -f "$f" Version)" "$(stat -c %s "$f")" \
      "$(sha256sum "$f" | cut -d' ' -f1)"
  done
} >"$dir/MANIFEST"
echo "gpu-bundle: $dir holds ${#pkgs[@]} packages, $(awk -v b="$total" 'BEGIN { printf "%.1f", b / 1048576 }') MiB:"
grep -v '^#' "$dir/MANIFEST" | awk '{ printf "  %-26s %-28s %8.2f MiB\n", $1, $2, $3 / 1048576 }'
