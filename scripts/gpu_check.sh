#!/usr/bin/env bash
# Blobs in GPU memory on a machine with an NVIDIA GPU: runs the GPU tests (tests/actor/
# blob_device_test.cpp) and bench/device_bench.cpp, then prints, in GB/s, from one run:
# cudaMemcpy host to device from pinned memory, a 1 GiB blob over loopback into device memory
# (beside the same blob into host memory), a 1 GiB blob device to device on one host through
# CUDA IPC (in 4 MiB chunks, the default, and in 64 MiB chunks), and cudaMemcpy device to
# device, with the two targets of bench/README.md ("Device memory").
#
#   scripts/gpu_check.sh              build here (BUILD_DIR, default build-gpu) and run here
#   scripts/gpu_check.sh pack DIR     build here, and put the programs and the libraries they
#                                     need (not the C library or CUDA) in DIR: for a GPU machine
#                                     without troupe's build dependencies
#   scripts/gpu_check.sh run DIR      run what `pack` put in DIR (on the GPU machine)
#
# CUDA is found as troupe finds it (actor/blob_device.h); where the dynamic loader knows no
# libcudart, the toolkit's (/usr/local/cuda) or the Python package nvidia-cuda-runtime's is named
# in TROUPE_CUDA_RUNTIME. Exits 1 when a test fails or no GPU is found.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BUILD_DIR:-$root/build-gpu}
programs=(blob_device_test device_bench bench_blob_member)

build_here() {
  if [ -f "$build/CMakeCache.txt" ]; then
    cmake "$build" >/dev/null  # a build folder of its own settings (BUILD_DIR=build): kept
  else
    cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DTROUPE_BUILD_TESTS=ON -DTROUPE_BUILD_BENCH=ON -DTROUPE_BUILD_EXAMPLES=OFF \
      -DTROUPE_BUILD_PYTHON=OFF >/dev/null
  fi
  ninja -C "$build" "${programs[@]}"
}

pack() {
  local dir=$1
  build_here
  rm -rf "$dir"
  mkdir -p "$dir/bin" "$dir/lib"
  for p in "${programs[@]}"; do
    objcopy --strip-debug "$build/bin/$p" "$dir/bin/$p"
    # Every library it loads but the C runtime's own.
    ldd "$build/bin/$p" | awk '$3 ~ /^\// {print $3}' | while read -r lib; do
      case $(basename "$lib") in
        libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|ld-linux*) ;;
        libstdc++.so*|libgcc_s.so*) ;;  # the GPU machine's own are as new or newer
        *) [ -e "$dir/lib/$(basename "$lib")" ] || objcopy --strip-debug "$lib" "$dir/lib/$(basename "$lib")" ;;
      esac
    done
  done
  du -sh "$dir"
}

find_cudart() {
  [ -n "${TROUPE_CUDA_RUNTIME:-}" ] && return
  ldconfig -p 2>/dev/null | grep -q 'libcudart\.so' && return
  local candidates=(/usr/local/cuda/lib64/libcudart.so.*)
  local site
  site=$(python3 -c 'import nvidia.cuda_runtime as m, os; print(os.path.dirname(m.__file__))' \
    2>/dev/null || true)
  [ -n "$site" ] && candidates+=("$site"/lib/libcudart.so.*)
  for f in "${candidates[@]}"; do
    if [ -e "$f" ]; then export TROUPE_CUDA_RUNTIME=$f; return; fi
  done
}

run() {
  local bin=$1 json
  find_cudart
  command -v nvidia-smi >/dev/null && nvidia-smi -L || true
  echo "gpu_check: CUDA runtime: ${TROUPE_CUDA_RUNTIME:-as the dynamic loader finds it}"
  # The GPU test must run, not skip; then the rest of the suite.
  local gpu
  gpu=$("$bin/blob_device_test" --gtest_filter='CudaBlobTest.*' 2>&1) || { echo "$gpu"; return 1; }
  if grep -q 'SKIPPED' <<<"$gpu"; then
    grep -A1 'Skipped' <<<"$gpu" | tail -1
    echo "gpu_check: no GPU here" >&2
    return 1
  fi
  "$bin/blob_device_test" --gtest_brief=1 2>&1 | grep -v '^\[20' || return 1
  json=$(mktemp)
  # Log lines are left out, but for those saying why a blob did not go device to device.
  TROUPE_BENCH_BLOB_MEMBER="$bin/bench_blob_member" "$bin/device_bench" \
    --benchmark_repetitions=3 --benchmark_report_aggregates_only=true \
    --benchmark_out="$json" --benchmark_out_format=json 2>&1 |
    awk '!/^\[20/ || /through host memory|cannot export|cannot open/'
  python3 - "$json" <<'PY'
import json, sys
# By name and arguments ("BM_Blob_DeviceToDevice/1024/4"), medians only.
runs = {b["run_name"].rsplit("/", 1)[0]: b for b in json.load(open(sys.argv[1]))["benchmarks"]
        if b.get("aggregate_name") == "median"}
gbs = {name: b["bytes_per_second"] / 1e9 for name, b in runs.items()}
# The share of its bytes the member copied from the sender's memory (BlobResult::pulledBytes).
d2d = {chunk: f"BM_Blob_DeviceToDevice/1024/{chunk}" for chunk in (4, 64)}
ipc = {chunk: runs.get(name, {}).get("pulled", 0) == 1 for chunk, name in d2d.items()}
rows = [("cudaMemcpy host to device, pinned", "BM_Device_CopyIn/1024"),
        ("1 GiB blob into host memory, loopback TCP", "BM_Blob_IntoHost/1024"),
        ("1 GiB blob into device memory, loopback TCP", "BM_Blob_IntoDevice/1024")]
rows += [(f"1 GiB blob device to device, one host, {chunk} MiB chunks "
          + ("(IPC)" if ipc[chunk] else "(NOT IPC)"), name) for chunk, name in d2d.items()]
rows += [("cudaMemcpy device to device", "BM_Device_CopyWithin/1024")]
print("\ngpu_check: medians of 3, GB/s")
for label, name in rows:
    print(f"  {label:62s} {gbs.get(name, float('nan')):8.2f}")
into = gbs["BM_Blob_IntoHost/1024"] / gbs["BM_Blob_IntoDevice/1024"]
print(f"  into device / into host, time: {into:.2f}x (target at most 1.15x)")
for chunk, name in d2d.items():
    what = f"IPC / cudaMemcpy device to device, {chunk} MiB chunks"
    if ipc[chunk]:
        ratio = gbs[name] / gbs["BM_Device_CopyWithin/1024"]
        print(f"  {what}: {ratio:.2f}x (target at least 0.5x)")
    else:
        print(f"  {what}: not measured: the member took the blob through host memory, not from "
              "the sender's device memory (the log lines above say why)")
PY
  rm -f "$json"
}

case ${1:-} in
  pack) pack "${2:?usage: gpu_check.sh pack DIR}" ;;
  run) run "$(cd "${2:?usage: gpu_check.sh run DIR}" && pwd)/bin" ;;
  "") build_here && run "$build/bin" ;;
  *) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 2 ;;
esac
