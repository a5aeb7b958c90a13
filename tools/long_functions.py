#!/usr/bin/env python3
"""List the Rust functions longer than a limit (issue 17: "functions over ~80 lines").

    tools/long_functions.py                    # every tracked .rs file, limit 80 lines
    tools/long_functions.py --limit 60 crates/pipeline crates/bench

One line per function, longest first: `path:line name lines`, where `lines` counts from the
`fn` line to the closing brace. Nested functions and closures count towards their enclosing
function (a nested `fn` is listed on its own as well). It reads the source with regular
expressions and a brace counter (strings, char literals and `//` comments are skipped), no
rustc; a brace inside a raw string may throw a count off.
"""

import argparse
import re
import subprocess
import sys

FN = re.compile(
    r'^\s*(?:pub(?:\([^)]*\))?\s+)?(?:const\s+)?(?:async\s+)?(?:unsafe\s+)?'
    r'(?:extern\s+"[^"]*"\s+)?fn\s+(\w+)'
)


def code(line):
    """The line without string and char literals and `//` comments."""
    line = re.sub(r'"(?:\\.|[^"\\])*"', '""', line)
    line = re.sub(r"'(?:\\.|[^'\\])'", "''", line)
    return line.split("//")[0]


def functions(path):
    """(line, name, length) of every function with a body in `path`."""
    lines = open(path, encoding="utf-8", errors="replace").read().split("\n")
    for i, line in enumerate(lines):
        m = FN.match(line)
        if not m:
            continue
        depth, opened = 0, False
        for j in range(i, len(lines)):
            s = code(lines[j])
            if not opened and ";" in s and "{" not in s:
                break  # a declaration (trait method without a body)
            for ch in s:
                if ch == "{":
                    depth, opened = depth + 1, True
                elif ch == "}":
                    depth -= 1
            if opened and depth == 0:
                yield i + 1, m.group(1), j - i + 1
                break


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--limit", type=int, default=80, help="list functions longer than this")
    ap.add_argument("paths", nargs="*", help="folders or files (default: the whole tree)")
    a = ap.parse_args()
    files = subprocess.run(
        ["git", "ls-files", "--", *(a.paths or ["."])],
        capture_output=True, text=True, check=True,
    ).stdout.split()
    found = [
        (f, line, name, n)
        for f in files if f.endswith(".rs")
        for line, name, n in functions(f) if n > a.limit
    ]
    for f, line, name, n in sorted(found, key=lambda t: (-t[3], t[0])):
        print(f"{f}:{line} {name} {n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
