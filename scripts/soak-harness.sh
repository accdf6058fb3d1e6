#!/usr/bin/env bash
# Runs conformance harnesses against reference implementations many times,
# under the race detector, with two CPU-bound processes beside them, and
# reports every run that failed. A harness must never fail a correct
# implementation because the machine is slow: 0 failures is the bar.
#
# Usage, from anywhere in the repository:
#   scripts/soak-harness.sh [-n RUNS] [TARGET...]
#
# A TARGET is PACKAGE:TESTS, a package path as go test takes it and a
# -test.run pattern, for instance
#   ./store/memstore:^TestConformance$               storetest over memstore
#   ./store/mooncake:^TestConformance$               storetest over the fake Mooncake
#   ./connector/connectortest:^TestStoreConnector$   storeconn over memstore
#   ./connector/p2p:^TestConnectorTest$              p2p, producer and consumer
#   ./store/remote:^TestConformance$                 storetest over remote clients of memstores
#   ./store/diskstore:^TestConformance$              storetest over the disk store
#   ./store/tiered:^TestConformance$                 storetest over RAM and disk in tiers
#   ./rdma:^TestLoopbackConformance$                 rdmatest over loopback engines
#   ./rdma/shm:^TestConformance$                     rdmatest over shared-memory engines
#   ./rdma/mooncake:^TestConformanceFake$            rdmatest over the fake Mooncake Transfer Engine
# (the default targets; the fake Mooncakes need gcc, and
# MOONCAKE_FAKE_REQUIRE=1 makes its absence a failure). Each package's test binary is built once
# (go test -c -race) and run RUNS times (default 200, or $RUNS), from the
# package's directory as go test runs it.
#
# Environment: RUNS, RACE (1 by default: build with -race; 0 builds without,
# which runs several times faster and still finds every harness that
# depends on timing), HOGS (CPU-bound processes beside the runs, default 2),
# TIMEOUT (per run, default 10m), TESTFLAGS (more flags for every run, such
# as -rapid.checks=200), KEEP (a directory to keep the logs of failed runs
# in; by default they are printed and removed).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

runs=${RUNS:-200}
while getopts "n:" opt; do
  case $opt in
    n) runs=$OPTARG ;;
    *) echo "usage: $0 [-n RUNS] [PACKAGE:TESTS...]" >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
targets=("$@")
if [[ ${#targets[@]} -eq 0 ]]; then
  targets=(
    "./store/memstore:^TestConformance\$"
    "./store/mooncake:^TestConformance\$"
    "./connector/connectortest:^TestStoreConnector\$"
    "./connector/p2p:^TestConnectorTest\$"
    "./store/remote:^TestConformance\$"
    "./store/diskstore:^TestConformance\$"
    "./store/tiered:^TestConformance\$"
    "./rdma:^TestLoopbackConformance\$"
    "./rdma/shm:^TestConformance\$"
    "./rdma/mooncake:^TestConformanceFake\$"
  )
fi
hogs=${HOGS:-2}
race=${RACE:-1}
raceflag=(-race)
racename=-race
if [[ $race == 0 ]]; then
  raceflag=()
  racename="no -race"
fi
timeout=${TIMEOUT:-10m}
read -r -a extra <<<"${TESTFLAGS:-}"

work=$(mktemp -d)
pids=()  # the CPU-bound processes
child="" # the test binary running now
cleanup() {
  for pid in "${pids[@]}" $child; do
    kill "$pid" 2>/dev/null || true
  done
  if [[ -n ${KEEP:-} ]]; then
    mkdir -p "$KEEP"
    cp "$work"/*.log "$KEEP"/ 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Build every binary before the load starts.
declare -A bins rapidflags
for t in "${targets[@]}"; do
  pkg=${t%%:*}
  if [[ -z ${bins[$pkg]:-} ]]; then
    bin="$work/$(echo "$pkg" | tr -c 'A-Za-z0-9\n' '_').test"
    echo "== go test -c ${raceflag[*]} $pkg"
    go test -c "${raceflag[@]}" -o "$bin" "$pkg"
    bins[$pkg]=$bin
    # rapid's flag only where the package's tests use rapid: an unknown
    # flag fails every run of the others before a test starts.
    if "$bin" -h 2>&1 | grep -q -- '-rapid.nofailfile'; then
      rapidflags[$pkg]=-rapid.nofailfile
    fi
  fi
done

for _ in $(seq 1 "$hogs"); do
  sh -c 'while :; do :; done' &
  pids+=($!)
done
echo "== $hogs CPU-bound processes beside the runs (pids ${pids[*]}); $runs runs per target"

total_fail=0
summary=()
for t in "${targets[@]}"; do
  pkg=${t%%:*}
  tests=${t#*:}
  bin=${bins[$pkg]}
  dir=$(go list -f '{{.Dir}}' "$pkg")
  fails=0
  min=999999 max=0 sum=0
  for i in $(seq 1 "$runs"); do
    log="$work/$(basename "$bin" .test)-$i.log"
    start=$(date +%s%N)
    (cd "$dir" && exec "$bin" -test.run "$tests" -test.count=1 -test.timeout "$timeout" ${rapidflags[$pkg]:-} "${extra[@]}") >"$log" 2>&1 &
    child=$!
    if wait "$child"; then
      child=""
      rm -f "$log"
    else
      child=""
      fails=$((fails + 1))
      echo "-- $t run $i FAILED:"
      grep -E -- '--- FAIL|\[rapid\] (failed|flaky|panic)|\.go:[0-9]+: [^[]' "$log" | grep -v 'draw ' | head -20 || true
      [[ -n ${KEEP:-} ]] || rm -f "$log"
    fi
    ms=$((($(date +%s%N) - start) / 1000000))
    sum=$((sum + ms))
    if ((ms < min)); then min=$ms; fi
    if ((ms > max)); then max=$ms; fi
  done
  total_fail=$((total_fail + fails))
  line="$t: $fails failed of $runs runs ($racename, $hogs hogs; run time min ${min}ms, mean $((sum / runs))ms, max ${max}ms)"
  echo "== $line"
  summary+=("$line")
done

echo "== summary"
printf '%s\n' "${summary[@]}"
cd "$root"
if ((total_fail > 0)); then
  echo "== $total_fail runs failed"
  exit 1
fi
echo "== no run failed"
