#!/usr/bin/env python3
"""Print the import circles of every crate in the workspace (issue 17: "no import circles").

    tools/import_cycles.py                 # every workspace member, file level and top level
    tools/import_cycles.py crates/shm-ring # one crate
    tools/import_cycles.py --edges         # also print who uses whom inside each circle

A node is a module that is its own file (`src/a/b.rs` or `src/a/b/mod.rs` is `a::b`; inline
`mod x { .. }` blocks belong to their file). Module A uses B when A's code names an item that
is defined in B: `use crate::..`, `use super::..`, `use child::..` and the same paths written
inline in code. A name is followed through `pub use` re-exports to the module that defines it,
and a re-export is not itself a use (so a parent that re-exports its children is not in a
circle with them); a private `use` counts as a use, and as an alias for its children. Comments, string literals and `#[cfg(test)] mod tests { .. }` are ignored.

Circles are the strongly connected components of more than one node. "top" repeats the count
with each node cut to its first path segment (`channel::sender` -> `channel`), which is the
layer view: layers should form a line, not a loop.

It reads the source with regular expressions (no rustc), so a macro-built path or a name
brought in by a glob from outside may be missed; it errs towards fewer edges, not more.
"""

import argparse
import collections
import os
import re
import sys

try:
    import tomllib
except ImportError:  # pragma: no cover - python < 3.11
    tomllib = None

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


def strip(src):
    """Remove comments and the contents of string/char literals, keeping offsets stable."""
    out = []
    i, n = 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif src.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if src.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif src.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(re.sub(r"[^\n]", " ", src[i:j]))
            i = j
        elif c == "r" and re.match(r'r#*"', src[i:]) and (i == 0 or not src[i - 1].isalnum()):
            m = re.match(r'r(#*)"', src[i:])
            end = src.find('"' + m.group(1), i + len(m.group(0)))
            end = n if end < 0 else end + 1 + len(m.group(1))
            out.append(re.sub(r"[^\n]", " ", src[i:end]))
            i = end
        elif c == '"':
            j = i + 1
            while j < n and src[j] != '"':
                j += 2 if src[j] == "\\" else 1
            out.append('"' + re.sub(r"[^\n]", " ", src[i + 1 : j]) + '"')
            i = j + 1
        elif c == "'" and re.match(r"'(\\.|[^\\'])'|'\\u\{[0-9a-fA-F]+\}'", src[i:]):
            m = re.match(r"'(\\.|[^\\'])'|'\\u\{[0-9a-fA-F]+\}'", src[i:])
            out.append(" " * len(m.group(0)))
            i += len(m.group(0))
        else:
            out.append(c)
            i += 1
    return "".join(out)


def block_end(src, open_at):
    """Offset just past the `}` matching the `{` at open_at."""
    depth = 0
    for j in range(open_at, len(src)):
        if src[j] == "{":
            depth += 1
        elif src[j] == "}":
            depth -= 1
            if depth == 0:
                return j + 1
    return len(src)


def blank_test_modules(src):
    for m in reversed(list(re.finditer(r"#\[cfg\(test\)\]\s*(pub(\([^)]*\))?\s+)?mod\s+\w+\s*\{", src))):
        end = block_end(src, m.end() - 1)
        src = src[: m.start()] + re.sub(r"[^\n]", " ", src[m.start() : end]) + src[end:]
    return src


class Module:
    def __init__(self, path, file):
        self.path = path  # tuple of segments below the crate root
        self.file = file
        self.children = {}  # name -> Module
        self.src = ""
        self.inline = []  # (start, end) of inline `mod x { .. }` blocks
        self.reexports = {}  # name -> (module path it is resolved from, path segments)
        self.globs = []  # modules whose public names this one re-exports with `pub use x::*`


def parse_use_tree(text):
    """`a::{b, c::d as e, f::*}` -> [(["a","b"], "b"), (["a","c","d"], "e"), (["a","f","*"], "*")]."""
    text = re.sub(r"\s+", "", text)
    out = []

    def rec(prefix, s):
        # split s at top-level commas
        parts, depth, cur = [], 0, ""
        for ch in s:
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            if ch == "," and depth == 0:
                parts.append(cur)
                cur = ""
            else:
                cur += ch
        if cur:
            parts.append(cur)
        for p in parts:
            if not p:
                continue
            brace = p.find("{")
            if brace >= 0:
                head = [x for x in p[:brace].split("::") if x]
                rec(prefix + head, p[brace + 1 : p.rfind("}")])
                continue
            alias = None
            if "as" in p and re.search(r"[A-Za-z0-9_]as[A-Za-z_]", p):
                # `xasy` after whitespace removal: split on the last segment
                segs = p.split("::")
                last = segs[-1]
                m = re.match(r"(" + IDENT + r")as(" + IDENT + r")$", last)
                if m and m.group(1) not in ("", None):
                    segs[-1] = m.group(1)
                    alias = m.group(2)
                    out.append((prefix + segs, alias))
                    continue
            segs = [x for x in p.split("::") if x]
            if segs == ["self"]:
                out.append((prefix, prefix[-1] if prefix else "self"))
            else:
                out.append((prefix + segs, alias or segs[-1]))

    rec([], text)
    return out


class Crate:
    def __init__(self, name, root_file):
        self.name = name
        self.modules = {}
        self.root = self.load((), root_file)

    def load(self, path, file):
        m = Module(path, file)
        self.modules[path] = m
        with open(file, encoding="utf-8") as f:
            raw = f.read()
        src = blank_test_modules(strip(raw))
        # `pub(in crate::a)` names a module for visibility, it uses nothing in it.
        src = re.sub(r"pub\(\s*in\s+[^)]*\)", lambda x: "pub(crate)" + " " * (len(x.group(0)) - 10), src)
        m.src = src
        for im in re.finditer(r"\bmod\s+(" + IDENT + r")\s*\{", src):
            m.inline.append((im.end() - 1, block_end(src, im.end() - 1)))
        base = os.path.dirname(file)
        own_dir = base if os.path.basename(file) in ("mod.rs", "lib.rs", "main.rs") or not path else os.path.join(base, os.path.splitext(os.path.basename(file))[0])
        if not path and os.path.basename(file) not in ("lib.rs", "main.rs"):
            own_dir = base  # a binary's root file: its `mod x;` files sit beside it
        for dm in re.finditer(r"(#\[path\s*=\s*\"[^\"]*\"\]\s*)?(?:#\[[^\]]*\]\s*)*(?:pub(?:\([^)]*\))?\s+)?mod\s+(" + IDENT + r")\s*;", src):
            name = dm.group(2)
            pm = re.search(r'#\[path\s*=\s*"([^"]*)"\]', raw[dm.start() : dm.end()])
            if pm:
                child = os.path.join(base, pm.group(1))
            else:
                child = os.path.join(own_dir, name + ".rs")
                if not os.path.exists(child):
                    child = os.path.join(own_dir, name, "mod.rs")
            if os.path.exists(child):
                m.children[name] = self.load(path + (name,), child)
        return m

    # -- name resolution ---------------------------------------------------------------
    def inline_depth(self, mod, at):
        return sum(1 for s, e in mod.inline if s < at < e)

    def start(self, mod, segs, at):
        """Where a path begins: (module path, remaining segments) or None if external."""
        if not segs:
            return None
        head = segs[0]
        if head == "crate":
            return (), segs[1:]
        if head in ("self", "super"):
            cur = list(mod.path)
            depth = self.inline_depth(mod, at)
            rest = segs
            while rest and rest[0] in ("self", "super"):
                if rest[0] == "super":
                    if depth:
                        depth -= 1
                    elif cur:
                        cur.pop()
                rest = rest[1:]
            return tuple(cur), rest
        if head in mod.children:
            return mod.path, segs
        return None

    def resolve(self, mod_path, rest, seen=None):
        """The module defining the item a path names, following re-exports."""
        seen = seen or set()
        cur = self.modules[mod_path]
        rest = list(rest)
        while rest and rest[0] in cur.children:
            cur = cur.children[rest.pop(0)]
        if not rest or rest[0] == "*":
            return cur.path
        name = rest[0]
        key = (cur.path, name)
        if key in seen:
            return cur.path
        seen.add(key)
        if name in cur.reexports:
            base, segs = cur.reexports[name]
            st = self.start(self.modules[base], segs, -1)
            if st is not None:
                return self.resolve(st[0], st[1], seen)
        for g in cur.globs:
            target = self.modules.get(g)
            if target and (name in target.reexports or re.search(
                    r"\bpub(\([^)]*\))?\s+(unsafe\s+)?(fn|struct|enum|trait|const|static|type|mod|union)\s+" + name + r"\b",
                    target.src)):
                return self.resolve(g, [name], seen)
        return cur.path

    def collect_reexports(self):
        # Every `use` makes an alias that children (and, if `pub`, others) can name the item
        # by: `crate::channel::ShmRing` where channel/mod.rs has `use crate::link::ShmRing`.
        for mod in self.modules.values():
            for um in re.finditer(r"(?:\bpub(\([^)]*\))?\s+)?\buse\s+([^;]+);", mod.src):
                for segs, alias in parse_use_tree(um.group(2)):
                    st = self.start(mod, segs, um.start())
                    if st is None:
                        continue
                    if segs[-1] == "*":
                        tgt = self.walk(st[0], st[1][:-1])
                        if tgt is not None:
                            mod.globs.append(tgt)
                    else:
                        mod.reexports[alias] = (mod.path, segs)

    def walk(self, mod_path, segs):
        cur = self.modules[mod_path]
        for s in segs:
            if s not in cur.children:
                return None
            cur = cur.children[s]
        return cur.path

    def edges(self):
        self.collect_reexports()
        out = collections.defaultdict(set)
        for mod in self.modules.values():
            src = mod.src
            spans = []
            # `use` statements that are not re-exports
            for um in re.finditer(r"(\bpub(\([^)]*\))?\s+)?\buse\s+([^;]+);", src):
                spans.append((um.start(), um.end()))
                if um.group(1):
                    continue
                for segs, _ in parse_use_tree(um.group(3)):
                    self.add(out, mod, segs, um.start())
            # paths written in code
            for pm in re.finditer(r"(?<![A-Za-z0-9_:])((?:" + IDENT + r"::)+" + IDENT + r")", src):
                if any(s <= pm.start() < e for s, e in spans):
                    continue
                segs = pm.group(1).split("::")
                if segs[0] in ("crate", "self", "super") or segs[0] in mod.children:
                    self.add(out, mod, segs, pm.start())
        return out

    def add(self, out, mod, segs, at):
        st = self.start(mod, segs, at)
        if st is None:
            return
        tgt = self.resolve(st[0], st[1])
        if tgt != mod.path:
            out[mod.path].add(tgt)


def sccs(nodes, edges):
    index, low, stack, on, res = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            res.append(comp)

    sys.setrecursionlimit(10000)
    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return [sorted(c) for c in res if len(c) > 1]


def name(path, crate):
    return "::".join(path) if path else "(root)"


def report(label, nodes, edges, show_edges):
    comps = sccs(nodes, edges)
    pairs = sorted({tuple(sorted((a, b))) for a in edges for b in edges[a] if a in edges.get(b, ())})
    print(f"  {label}: {len(comps)} circle(s), {len(pairs)} mutual pair(s)")
    for c in comps:
        print("    " + " <-> ".join(name(p, None) for p in c))
        if show_edges:
            cs = set(c)
            for a in c:
                for b in sorted(edges.get(a, ())):
                    if b in cs:
                        print(f"      {name(a, None)} -> {name(b, None)}")
    return len(comps)


def crate_roots(crate_dir):
    name = os.path.basename(crate_dir)
    toml = os.path.join(crate_dir, "Cargo.toml")
    if tomllib and os.path.exists(toml):
        with open(toml, "rb") as f:
            name = tomllib.load(f).get("package", {}).get("name", name)
    roots = []
    lib = os.path.join(crate_dir, "src", "lib.rs")
    if os.path.exists(lib):
        roots.append((name + " (lib)", lib))
    main = os.path.join(crate_dir, "src", "main.rs")
    if os.path.exists(main):
        roots.append((name + " (bin)", main))
    bindir = os.path.join(crate_dir, "src", "bin")
    if os.path.isdir(bindir):
        for f in sorted(os.listdir(bindir)):
            if f.endswith(".rs"):
                roots.append((f"{name} (bin {f[:-3]})", os.path.join(bindir, f)))
    return roots


def members(root):
    with open(os.path.join(root, "Cargo.toml"), "rb") as f:
        if tomllib:
            return [os.path.join(root, m) for m in tomllib.load(f)["workspace"]["members"]]
    text = open(os.path.join(root, "Cargo.toml")).read()
    return [os.path.join(root, m) for m in re.findall(r'"(crates/[^"]+)"', text)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("crates", nargs="*", help="crate directories (default: workspace members)")
    ap.add_argument("--edges", action="store_true", help="print the edges inside each circle")
    args = ap.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    total_file = total_top = 0
    for crate_dir in args.crates or members(root):
        for label, file in crate_roots(crate_dir):
            crate = Crate(label, file)
            edges = crate.edges()
            print(f"{label}: {len(crate.modules)} modules")
            total_file += report("file level", crate.modules.keys(), edges, args.edges)
            top = collections.defaultdict(set)
            for a, bs in edges.items():
                for b in bs:
                    ta, tb = a[:1], b[:1]
                    if ta != tb and ta and tb:
                        top[ta].add(tb)
            total_top += report("top level", {p[:1] for p in crate.modules if p}, top, args.edges)
    print(f"total: {total_file} file-level circle(s), {total_top} top-level circle(s)")


if __name__ == "__main__":
    main()
