"""The README's "From Python" example runs as written (in a fresh interpreter, as a script, so
multiprocessing's spawn start method can import it)."""
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[3]


def python_blocks(markdown: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", markdown, flags=re.S)


def test_readme_python_example_runs_as_written(tmp_path):
    blocks = python_blocks((ROOT / "README.md").read_text())
    assert blocks, "README.md has no ```python block"
    for i, code in enumerate(blocks):
        script = tmp_path / f"readme_{i}.py"
        script.write_text(code)
        r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                           timeout=60, cwd=tmp_path)
        assert r.returncode == 0, f"README block {i} failed:\n{r.stderr}"
        if "msg.meta" in code:
            assert r.stdout.split("\n")[:3] == ["0 0.0", "1 1.0", "2 2.0"], r.stdout
