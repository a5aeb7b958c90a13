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


def _bullet(markdown: str, start: str) -> str:
    """The README bullet that starts with ``start`` (up to the next bullet or heading)."""
    m = re.search(re.escape(start) + r"(.*?)(?=\n- |\n#)", markdown, flags=re.S)
    assert m, f"no bullet starting {start!r}"
    return m.group(1)


def test_package_readme_lists_every_pipeline_option_and_the_channel_tuple():
    import inspect

    import shmpipe

    text = (ROOT / "crates" / "python" / "README.md").read_text()
    options = _bullet(text, "- Options (keyword arguments of `shmpipe.Pipeline`")
    listed = set(re.findall(r"`([a-z_]+)(?:[=`)+ ])", options))
    params = inspect.signature(shmpipe.Pipeline).parameters
    wanted = {n for n, p in params.items() if p.kind is p.KEYWORD_ONLY} | {"workers"}
    assert wanted - listed == set(), f"options missing from README: {wanted - listed}"
    assert listed - set(params) <= {"slots", "blocks", "block_size", "large_pool", "shard",
                                    "seed", "rank", "world_size"}, listed - set(params)
    # channel= takes 4 values; every mention of the tuple in the README says so.
    for m in re.findall(r"channel=\([^)]*\)", text):
        if "slots" in m:
            assert m.count(",") == 3 and "large_pool" in m, m
