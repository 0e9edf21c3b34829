#!/usr/bin/env bash
# q4tune's one entry point for a fresh Debian machine:
#   ./run.sh demo   install what is missing, build (Release), run the main job on the embedded default
#   ./run.sh test   install what is missing, build, run the whole test suite (what CI runs)
# Packages come from Debian only; apt-get runs only when something is missing.
set -euo pipefail
cd "$(dirname "$0")"

PACKAGES=(cmake g++ make libvulkan-dev glslang-tools mesa-vulkan-drivers vulkan-validationlayers
          libeigen3-dev libcli11-dev libgtest-dev nlohmann-json3-dev libtomlplusplus-dev libxxhash-dev
          strace   # strace: the tests inject disk-full errors and kills at chosen system calls
          openmpi-bin libopenmpi-dev  # data-parallel training (mpirun -np N q4tune train) and its tests
          clang libclang-rt-dev)  # the sanitizer tree and its libFuzzer targets (tests/fuzz)
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

# fuzz_smoke DIR: each libFuzzer target of the tree DIR for FUZZ_SECONDS (default 25) over its seeds and the inputs
# that once failed (tests/fuzz/regressions/); a finding (crash, sanitizer report, leak, timeout, out of memory)
# fails the run, its input left in DIR/fuzz-findings/.
fuzz_smoke() {
  local dir="$1" secs="${FUZZ_SECONDS:-25}"
  mkdir -p "$dir/fuzz-findings"
  for t in model_gguf adapter safetensors dataset config; do
    local corpora=("$dir/fuzz-corpus/$t" "$dir/tests/fuzz/seeds/$t") log="$dir/fuzz-findings/$t.log"
    [ -d "tests/fuzz/regressions/$t" ] && corpora+=("tests/fuzz/regressions/$t")
    mkdir -p "$dir/fuzz-corpus/$t"
    echo "== fuzzing $t for ${secs}s"
    if ! UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 "$dir/tests/fuzz/fuzz_$t" -max_total_time="$secs" \
         -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$dir/fuzz-findings/$t-" \
         "${corpora[@]}" > "$log" 2>&1; then
      tail -n 60 "$log"
      echo "== fuzz_$t failed: $log, input in $dir/fuzz-findings/" >&2
      return 1
    fi
    grep -E "^(Done|stat::number_of_executed_units)" "$log"
  done
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
    # Hostile-file handling under AddressSanitizer + UBSan, in a clang tree that also holds the libFuzzer
    # targets: the GGUF reader and the model loader on every crafted malformed file, then each fuzz target.
    echo "== building the sanitizer tree in $BUILD_DIR-asan (clang)"
    # A tree configured with another compiler cannot switch: start it again.
    if [ -f "$BUILD_DIR-asan/CMakeCache.txt" ] && ! grep -q '^CMAKE_CXX_COMPILER:.*clang++' "$BUILD_DIR-asan/CMakeCache.txt"; then
      rm -rf "$BUILD_DIR-asan"
    fi
    cmake -S . -B "$BUILD_DIR-asan" -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo -DQ4T_ASAN=ON \
          -DQ4T_FUZZ=ON > /dev/null
    cmake --build "$BUILD_DIR-asan" -j "$JOBS" --target test_gguf test_model fuzz
    ASAN_OPTIONS=detect_leaks=1 "$BUILD_DIR-asan"/tests/test_gguf
    ASAN_OPTIONS=detect_leaks=1 "$BUILD_DIR-asan"/tests/test_model --gtest_filter='ModelFiles.*'
    fuzz_smoke "$BUILD_DIR-asan"
    cd "$BUILD_DIR"
    ctest --output-on-failure -j "$JOBS"
    ;;
  *)
    echo "usage: ./run.sh demo | test" >&2
    exit 2
    ;;
esac
