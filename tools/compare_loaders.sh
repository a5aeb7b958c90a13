#!/usr/bin/env bash
# GluonTS's own loader and ours on the same synthetic data, back to back.
#
#   tools/compare_loaders.sh [series] [workers]
#   LONG=1 tools/compare_loaders.sh 2000 2   # issue 11's data: 500-5,000 points, 17-digit floats, ~100 MB
#
# Needs: pip install gluonts==0.17.0 pandas numpy packaging (orjson is used when present).
set -euo pipefail
cd "$(dirname "$0")/.."
series=${1:-4000}
workers=${2:-2}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cargo build --release -q -p shmpipe-timeseries --example gen_dataset --example timeseries_loader
long=()
if [ -n "${LONG:-}" ]; then
  long=(--long)
  ./target/release/examples/gen_dataset --out "$dir/train.jsonl" --long
else
  ./target/release/examples/gen_dataset --out "$dir/train.jsonl" --series "$series"
fi
echo "== GluonTS 0.17 TrainDataLoader, single process"
python3 tools/gluonts_loader_bench.py "$dir/train.jsonl" --seconds 15
echo "== shmpipe-timeseries, in this process"
./target/release/examples/timeseries_loader --data "$dir/train.jsonl" --series "$series" "${long[@]}" --in-process
echo "== shmpipe-timeseries, pipeline with $workers workers"
./target/release/examples/timeseries_loader --data "$dir/train.jsonl" --series "$series" "${long[@]}" --workers "$workers"
