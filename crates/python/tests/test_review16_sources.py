"""Issue 16 review (review-16): an in-memory source fed by the parent (issue 18) that is a
slow generator (a stream: a sensor, a queue, a socket) must stream. The parent pulls up to a
whole feed window (groups of up to 256 items) from the generator before it returns the first
output, so outputs wait for the generator to be exhausted or the window to fill."""

import subprocess
import sys
import textwrap

CODE = """
import time, shmpipe
import test_review16_sources as t
if __name__ == "__main__":
    pulled = [0]
    def gen():
        for i in range(40):
            pulled[0] += 1
            yield {"n": i}
            time.sleep(0.1)
    p = shmpipe.Pipeline(gen(), [t.same], workers=1)
    it = iter(p)
    first = next(it)
    print("FIRST", first["n"], "AFTER", pulled[0], "PULLED", flush=True)
    p.close()
"""


def same(item):
    return item


def test_review16_a_slow_generator_source_streams_its_first_output():
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(CODE)], capture_output=True,
                         text=True, timeout=120, cwd=__import__("os").path.dirname(__file__))
    text = out.stdout + out.stderr
    assert "FIRST 0" in text, text
    pulled = int(text.split("AFTER")[1].split()[0])
    # Streaming: the first output comes while most of the generator is still to come (each
    # item takes 0.1 s to produce; the whole generator 4 s).
    assert pulled < 20, f"first output only after {pulled} of 40 items were pulled: {text}"
