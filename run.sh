#!/usr/bin/env bash
# q4tune's one entry point for a fresh Debian machine:
#   ./run.sh demo   install what is missing, build (Release), run the main job on the embedded default
#   ./run.sh test   install what is missing, build, run the whole test suite (what CI runs)
# Packages come from Debian only; apt-get runs only when something is missing.
set -euo pipefail
cd "$(dirname "$0")"

PACKAGES=(cmake g++ make libvulkan-dev glslang-tools mesa-vulkan-drivers vulkan-validationlayers
          libeigen3-dev libcli11-dev libgtest-dev nlohmann-json3-dev libtomlplusplus-dev libxxhash-dev
          strace)  # strace: the tests inject disk-full errors and kills at chosen system calls
BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}

install_missing() {
  local missing=()
  for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "== installing: ${missing[*]}"
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

# The llama.cpp agreement tests run llama.cpp's CPU prebuilt through node (>= 20) and npm. A machine that has
# node already (any packaging of it) keeps it; otherwise Debian's nodejs and npm are installed.
install_node_if_missing() {
  command -v node > /dev/null && command -v npm > /dev/null && return 0
  echo "== installing: nodejs npm"
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends nodejs npm
}

# build [TARGET...]: configure (Release) and build the targets given, or everything.
build() {
  echo "== building in $BUILD_DIR"
  cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release > /dev/null
  local targets=()
  for t in "$@"; do targets+=(--target "$t"); done
  cmake --build "$BUILD_DIR" -j "$JOBS" "${targets[@]}"
}

case "${1:-}" in
  demo)
    install_missing
    build q4tune  # the demo runs the binary alone, not the tests
    # The embedded default (configs/demo.toml): LoRA on a small random llama, written to ./q4tune-demo/, which
    # this script clears first (it is the demo's own output directory).
    rm -rf q4tune-demo
    "$BUILD_DIR"/q4tune train
    ;;
  test)
    install_missing
    install_node_if_missing
    build
    # Hostile-file handling under AddressSanitizer + UBSan: the GGUF reader and the model loader on every
    # crafted malformed file.
    echo "== building the sanitizer tree in $BUILD_DIR-asan"
    cmake -S . -B "$BUILD_DIR-asan" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DQ4T_ASAN=ON > /dev/null
    cmake --build "$BUILD_DIR-asan" -j "$JOBS" --target test_gguf test_model
    ASAN_OPTIONS=detect_leaks=1 "$BUILD_DIR-asan"/tests/test_gguf
    ASAN_OPTIONS=detect_leaks=1 "$BUILD_DIR-asan"/tests/test_model --gtest_filter='ModelFiles.*'
    cd "$BUILD_DIR"
    ctest --output-on-failure -j "$JOBS"
    ;;
  *)
    echo "usage: ./run.sh demo | test" >&2
    exit 2
    ;;
esac
