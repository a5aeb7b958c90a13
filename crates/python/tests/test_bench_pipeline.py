"""The pipeline benchmark runs and prints its table (a smoke test: no speed is asserted)."""

import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.join(HERE, "..", "bench", "bench_pipeline.py")


def test_bench_pipeline_quick_runs_and_prints_every_row():
    r = subprocess.run([sys.executable, BENCH, "--quick"], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.splitlines()
    assert lines[0].startswith("# bench_pipeline") and "load" in lines[0]
    rows = [ln.split() for ln in lines if ln.startswith(("double", "heavy"))]
    # 2 steps x 2 worker counts, each with the peers and a ratio.
    assert len(rows) == 4, r.stdout
    assert {(row[0], row[1], row[2]) for row in rows} == {
        (s, "1000", w) for s in ("double", "heavy") for w in ("1", "2")}
    assert all(len(row) >= 10 for row in rows), r.stdout
    assert any("workers / 1" in ln for ln in lines)
    assert any("first output after" in ln and "PSS" in ln for ln in lines), r.stdout
    assert lines[-1].startswith("# done")
