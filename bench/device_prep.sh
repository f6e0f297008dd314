#!/usr/bin/env bash
# What `bench/device.sh` needs on the device machine (no package registry, Python 3.12, x86-64),
# prepared here from the project root, once per session:
#   bash bench/device_prep.sh [BASELINE_COMMIT]
# It writes .whl/ (the project's dependencies and the bench extra's, resolved for CPython 3.12) and,
# given a commit, .base/ (that tree, for `cores`' and `peers`' before/after); both git-ignored.
# Then call the device tool's `run` with carry [".whl"] (and ".base") and `bash bench/device.sh`.
#
# Why not simply the bench extra: penguiflow's own requirements (an MLflow and Databricks stack,
# about 160 MiB of wheels) would not fit the 64 MiB a call may carry, and the peers measure uses
# only `penguiflow.planner.memory`, whose imports the rest already brings. So penguiflow travels
# without its requirements, and when a Python 3.12 is here the script installs the wheels into a
# scratch folder and imports every module the measures import, so a missing one is found here,
# not after minutes of device time.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
limit_mib=50 # of the 64 MiB a call carries: the tree itself is about 8

rm -rf .whl
"$py" ../shared/tools/device_wheels.py psutil openai-agents langgraph langgraph-checkpoint-sqlite langchain-core
penguiflow=$(grep -o '"penguiflow[^"]*"' pyproject.toml | head -1 | tr -d '"')
"$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d .whl "$penguiflow"

twice=$(ls .whl | sed 's/-[0-9].*//' | tr 'A-Z-' 'a-z_' | sort | uniq -d)
if [ -n "$twice" ]; then
    echo "device_prep.sh: two versions of $twice in .whl/ (pip install stops on that there)" >&2
    exit 1
fi
size=$(du -sm .whl | cut -f1)
if [ "$size" -gt "$limit_mib" ]; then
    echo "device_prep.sh: .whl/ is ${size} MiB, over ${limit_mib} (the call carries 64 MiB with the tree)" >&2
    exit 1
fi

if command -v python3.12 >/dev/null; then
    site=$(mktemp -d)
    trap 'rm -rf "$site"' EXIT
    python3.12 -m pip install -q --no-index --no-deps --no-compile --target "$site" .whl/*.whl 2>/dev/null
    (cd "$site" && PYTHONPATH="$site:$OLDPWD" python3.12 -c '
import bench._peer_stores, bench.cores, bench.latency, bench.peers, bench.summarizer_latency
import agents, langchain_core.messages, langgraph.checkpoint.sqlite, psutil
from penguiflow.planner import memory
') || { echo "device_prep.sh: the wheels in .whl/ do not import the measures' modules" >&2; exit 1; }
    echo "device_prep.sh: the measures' modules import from .whl/ under $(python3.12 --version)"
else
    echo "device_prep.sh: no python3.12 here: the wheels were not tried"
fi

if [ $# -ge 1 ]; then
    rm -rf .base && mkdir .base && git archive "$1" | tar -x -C .base
    grep -qx /.base/ .git/info/exclude || echo /.base/ >>.git/info/exclude
    echo "device_prep.sh: .base/ holds $1"
fi
echo "device_prep.sh: .whl/ ${size} MiB; carry [\".whl\"$([ $# -ge 1 ] && echo ', ".base"')] and run: bash bench/device.sh"
