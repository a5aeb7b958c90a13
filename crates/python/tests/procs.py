"""Process checks shared by the pipeline tests."""


def gone(pid: int) -> bool:
    """Whether process ``pid`` has exited (gone, or a zombie its parent has not reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True
