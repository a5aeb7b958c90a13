"""A process that runs a pipeline and forks (``os.fork``, ``multiprocessing``'s fork start
method on Linux): the fork's copy of the pipeline does nothing (issue 16, review of the
pipeline part, finding 4)."""

import os
import subprocess
import sys

HERE = os.path.dirname(__file__)


def run_script(mode):
    script = os.path.join(HERE, "pipeline_fork_script.py")
    out = subprocess.run([sys.executable, script, mode], capture_output=True, text=True,
                         timeout=120, cwd=HERE)
    return out.stdout + out.stderr


def test_a_forked_child_that_exits_normally_leaves_the_parents_pipeline_alone():
    """A fork that ends normally finalizes its copy of the Pipeline: its PipelineRun's
    shutdown waited for a pump thread that does not exist in the fork, then SIGKILLed every
    child of the parent's pipeline by pid."""
    out = run_script("exit")
    assert "OK 200" in out, out


def test_a_forked_child_cannot_take_the_parents_outputs():
    """The fork's copy refuses to be iterated (it would take outputs meant for the parent),
    saying why."""
    out = run_script("iterate")
    assert "CHILD REFUSED" in out and "fork" in out, out
    assert "OK 200" in out, out


def test_a_forked_child_cannot_feed_or_drain_the_parents_pipeline():
    """Enqueue mode: the fork's enqueue, dequeue, close_input and pending raise
    PipelineError naming the fork (they would have waited for a pump thread that the fork
    does not have, or fed the parent's workers behind its back), and the parent's run goes
    on."""
    out = run_script("enqueue")
    for name in ["enqueue", "dequeue", "close_input", "pending"]:
        assert f"{name} REFUSED" in out, out
    assert "OK 200" in out, out
