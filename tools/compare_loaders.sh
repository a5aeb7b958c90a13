#!/usr/bin/env bash
# GluonTS's own loader and ours on the same synthetic data, back to back.
#
#   tools/compare_loaders.sh [series] [workers]
#
# Needs: pip install gluonts==0.17.0 pandas numpy packaging (orjson is used when present).
set -euo pipefail
cd "$(dirname "$0")/.."
series=${1:-4000}
workers=${2:-2}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cargo build --release -q -p shmpipe-timeseries --example gen_dataset --example timeseries_loader
./target/release/examples/gen_dataset --out "$dir/train.jsonl" --series "$series"
echo "== GluonTS 0.17 TrainDataLoader, single process"
python3 tools/gluonts_loader_bench.py "$dir/train.jsonl" --seconds 15
echo "== shmpipe-timeseries, in this process"
./target/release/examples/timeseries_loader --data "$dir/train.jsonl" --series "$series" --in-process
echo "== shmpipe-timeseries, pipeline with $workers workers"
./target/release/examples/timeseries_loader --data "$dir/train.jsonl" --series "$series" --workers "$workers"
