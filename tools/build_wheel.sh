#!/usr/bin/env bash
# Builds the Python package as a wheel users install without a Rust toolchain:
#   release build, CPython's stable ABI (abi3: one wheel for every CPython >= 3.9),
#   a manylinux platform tag that maturin checks against every versioned glibc symbol the
#   library links.
#
#   tools/build_wheel.sh [OUT_DIR]        (default: target/wheels)
#
# The tag: manylinux_2_34 (glibc >= 2.34: Debian 12, Ubuntu 22.04, RHEL 9 and later) when
# built on a current distribution: the Rust standard library then links glibc 2.29-2.34
# symbols (pthread_*, stat64, gettid, log, ...), so an older tag would be refused. For
# manylinux_2_28 (glibc >= 2.28: Debian 10, Ubuntu 20.04, RHEL 8), build inside a
# manylinux_2_28 container, or with SHMPIPE_WHEEL_TAG=manylinux_2_28 SHMPIPE_WHEEL_ZIG=1
# (links with zig against glibc 2.28; needs `pip install ziglang`).
#
# Needs cargo and maturin (>= 1.5: $MATURIN, else from PATH, else from the virtualenv
# target/pyenv, installed there with pip if missing). Install the result with `pip install OUT_DIR/shmpipe-*.whl`.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-target/wheels}
mkdir -p "$out"

maturin=${MATURIN:-$(command -v maturin || true)}
if [ -z "$maturin" ]; then
  venv=target/pyenv
  if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
  fi
  if [ ! -x "$venv/bin/maturin" ]; then
    "$venv/bin/python" -m pip install -q --ignore-installed "maturin>=1.5,<2"
  fi
  maturin="$venv/bin/maturin"
fi

# --strip: the release profile keeps line tables for profiling (callgrind, perf); a wheel
# does not need them (46 MB -> a few MB).
# --compatibility checks every symbol the library links against the tag's policy (and fails
# if one is newer) before it tags the wheel.
tag=${SHMPIPE_WHEEL_TAG:-manylinux_2_34}
zig=()
if [ -n "${SHMPIPE_WHEEL_ZIG:-}" ]; then zig=(--zig); fi
$maturin build --release --manifest-path crates/python/Cargo.toml --features abi3 --strip \
  --compatibility "$tag" "${zig[@]}" --interpreter python3 --out "$out"
ls -1 "$out"/shmpipe-*.whl
