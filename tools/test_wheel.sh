#!/usr/bin/env bash
# The wheel as a user gets it: builds it (tools/build_wheel.sh), installs it into a fresh
# virtualenv whose PATH has no cargo and no rustc, and runs README.md's Python example
# there, as a script outside the checkout. Called by .ci/run.
#
#   tools/test_wheel.sh [WHEEL]     (default: build one into a temporary directory)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/shmpipe-wheel-test.XXXXXX")
trap 'rm -rf "$work"' EXIT

if [ $# -ge 1 ]; then
  whl=$1
else
  tools/build_wheel.sh "$work/dist" >/dev/null
  whl=$(ls "$work"/dist/shmpipe-*.whl)
fi
name=$(basename "$whl")
case "$name" in
  shmpipe-*-cp39-abi3-*manylinux_2_*.whl) ;;
  *) echo "test_wheel: $name is not an abi3 manylinux wheel" >&2; exit 1 ;;
esac

# A fresh virtualenv: no system site-packages, no .pth into another environment.
python3 -m venv "$work/venv"
"$work/venv/bin/python" -m pip install -q "$whl"

# Everything below runs with a PATH that has neither cargo nor rustc.
clean="$work/venv/bin:/usr/local/bin:/usr/bin:/bin"
for tool in cargo rustc; do
  if env PATH="$clean" bash -c "command -v $tool" >/dev/null; then
    echo "test_wheel: $tool is on the clean PATH ($clean); cannot test without it" >&2
    exit 1
  fi
done

mkdir "$work/run"
"$work/venv/bin/python" - "$root/README.md" "$work/run" <<'PY'
import pathlib, re, sys
blocks = re.findall(r"```python\n(.*?)```", pathlib.Path(sys.argv[1]).read_text(), flags=re.S)
assert blocks, "README.md has no python block"
for i, code in enumerate(blocks):
    pathlib.Path(sys.argv[2], f"readme_{i}.py").write_text(code)
PY
for script in "$work"/run/readme_*.py; do
  (cd "$work/run" && env -i PATH="$clean" HOME="$work" python "$script") >"$work/out.txt" 2>&1 || {
    echo "test_wheel: $(basename "$script") failed:" >&2; cat "$work/out.txt" >&2; exit 1; }
  if grep -q 'msg.meta' "$script" && [ "$(head -3 "$work/out.txt")" != $'0 0.0\n1 1.0\n2 2.0' ]; then
    echo "test_wheel: $(basename "$script") printed:" >&2; cat "$work/out.txt" >&2; exit 1
  fi
done
# The module came from the wheel, not from the checkout.
where=$(cd "$work/run" && env -i PATH="$clean" python -c "import shmpipe, shmpipe._native as n; print(n.__file__)")
case "$where" in
  "$work/venv/"*) ;;
  *) echo "test_wheel: shmpipe was imported from $where, not from the wheel" >&2; exit 1 ;;
esac
head -3 "$work/out.txt"
echo "test_wheel: $name installs without cargo/rustc and runs README.md's Python example"
