#!/usr/bin/env bash
# Checks the cudart binding on a machine with an NVIDIA GPU, in under five
# minutes:
#   1. the library loads, every symbol binds, versions and error names agree;
#   2. copies in every direction (pinned host, device, host-registered mmap)
#      with data checks; stream order and events across streams; the batch
#      copy on the installed runtime (cudaMemcpyBatchAsync on 12.8+, a loop
#      of cudaMemcpyAsync before);
#   3. pinned bandwidth: 2 MiB block batches against one large copy, each way.
#      The target is blocks/large >= MIN_RATIO (default 0.9); STRICT=1 makes
#      a lower ratio fail the script.
#
# Usage, from the repository root:
#   scripts/gpu-check.sh                      # builds the test binary with go
#   CUDART_TEST_BIN=/path/cudart.test scripts/gpu-check.sh
#                                             # a binary built elsewhere with
#                                             # go test -c -o cudart.test ./cudart
# Environment: CUDART_PATH (library file or folder), CUDA_HOME, BW_BYTES
# (bytes each way per iteration, default 268435456), MIN_RATIO, STRICT.
set -euo pipefail
cd "$(dirname "$0")/.."

export CUDART_REQUIRE=1 CUDART_REQUIRE_GPU=1
min_ratio=${MIN_RATIO:-0.9}
bw_bytes=${BW_BYTES:-$((256 << 20))}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

bin=${CUDART_TEST_BIN:-}
if [[ -z "$bin" ]]; then
  export PATH="$PATH:/usr/local/go/bin"
  if ! command -v go >/dev/null; then
    echo "gpu-check: no go command; build the tests elsewhere with" >&2
    echo "  go test -c -o cudart.test ./cudart" >&2
    echo "and run with CUDART_TEST_BIN=path/to/cudart.test" >&2
    exit 2
  fi
  bin="$work/cudart.test"
  echo "== go test -c ./cudart"
  go test -c -o "$bin" ./cudart
fi

echo "== devices"
nvidia-smi -L 2>/dev/null || echo "(nvidia-smi not available)"

echo "== functional tests (library, errors, copies, ordering, batch)"
timeout 150 "$bin" -test.count=1 -test.v -test.timeout=140s \
  -test.run '^(TestReal|TestGPU)' 2>&1 | tee "$work/tests.txt"
if grep -q -- '--- SKIP' "$work/tests.txt"; then
  echo "gpu-check: some tests skipped (see above)"
fi

echo "== pinned bandwidth ($((bw_bytes >> 20)) MiB each way per iteration)"
timeout 120 "$bin" -test.run '^$' -test.bench '^BenchmarkPinnedBandwidth$' \
  -test.benchtime 10x -test.timeout=110s -cudart.bw-bytes="$bw_bytes" 2>&1 | tee "$work/bw.txt"

# Each result line holds "<value> blocks/large" among its metrics.
status=0
found=0
while read -r name ratio; do
  found=1
  if awk -v r="$ratio" -v m="$min_ratio" 'BEGIN { exit !(r >= m) }'; then
    echo "gpu-check: $name blocks/large = $ratio (>= $min_ratio): ok"
  else
    echo "gpu-check: $name blocks/large = $ratio (< $min_ratio): below target"
    [[ "${STRICT:-0}" == 1 ]] && status=1
  fi
done < <(awk '/^BenchmarkPinnedBandwidth\// {
  for (i = 2; i <= NF; i++) if ($i == "blocks/large") print $1, $(i - 1) }' "$work/bw.txt")
if [[ $found == 0 ]]; then
  echo "gpu-check: no bandwidth results" >&2
  exit 1
fi
exit $status
