#!/usr/bin/env python3
"""Count a crate's public API from rustdoc's JSON output (issue 17's "public surface" figure).

    tools/api_surface.py                      # shm-ring, default features
    tools/api_surface.py --features unstable-internals
    tools/api_surface.py --list               # every public item with its path(s)
    tools/api_surface.py --json target/doc/shm_ring.json   # reuse a JSON file

It runs `RUSTC_BOOTSTRAP=1 cargo rustdoc -p <crate> --lib -- -Z unstable-options
--output-format json` (items hidden with `#[doc(hidden)]` and private items are not in that
output unless --hidden), walks the module tree from the crate root following `pub mod` and `pub use`, and
counts what a user of the crate can name:

- fns_total: fns + trait_fns (the figure issue 17 compares with its baseline of 236);
- fns: free functions, plus the public methods and associated functions of inherent impls of
  every reachable struct/enum (trait impls and trait methods are not counted as fns; a trait's
  own methods are counted apart as trait_fns);
- structs, enums, traits, consts (module-level `const`/`static` plus public associated consts of
  inherent impls), type aliases;
- multi_path: items of this crate (methods included) a user can name by more than one path
  (e.g. `shm_ring::message::X` and `shm_ring::X`); multi_path_types: the types among them.
"""

import argparse
import collections
import json
import os
import subprocess
import sys

KINDS = ("function", "struct", "enum", "union", "trait", "constant", "static", "type_alias")


def build(crate, features, hidden, root):
    cmd = ["cargo", "rustdoc", "-q", "-p", crate, "--lib"]
    if features:
        cmd += ["--features", features]
    cmd += ["--", "-Z", "unstable-options", "--output-format", "json"]
    if hidden:
        cmd += ["--document-hidden-items"]
    env = dict(os.environ, RUSTC_BOOTSTRAP="1")
    subprocess.run(cmd, check=True, cwd=root, env=env)
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(root, "target"))
    return os.path.join(target, "doc", crate.replace("-", "_") + ".json")


def kind(item):
    inner = item["inner"]
    return next(iter(inner)) if isinstance(inner, dict) else inner


def walk(doc):
    """Map item id -> set of paths by which it can be named from the crate root."""
    index = doc["index"]
    paths = collections.defaultdict(set)
    seen_modules = set()

    def visit_module(mod_id, prefix):
        key = (mod_id, prefix)
        if key in seen_modules:
            return
        seen_modules.add(key)
        for child in index[str(mod_id)]["inner"]["module"]["items"]:
            visit(child, prefix)

    def visit(item_id, prefix, name=None):
        item = index.get(str(item_id))
        if item is None:  # an item of another crate, re-exported
            return
        if item.get("visibility") != "public" and kind(item) != "use":
            return
        k = kind(item)
        if k == "use":
            use = item["inner"]["use"]
            if use["id"] is None:
                return
            target = index.get(str(use["id"]))
            if target is None:
                return
            if use["is_glob"]:
                if kind(target) == "module":
                    visit_module(use["id"], prefix)
                return
            visit(use["id"], prefix, use["name"])
            return
        name = name or item["name"]
        path = prefix + "::" + name
        if k == "module":
            paths[item_id].add(path)
            visit_module(item_id, path)
            return
        if item.get("crate_id") != 0:
            return
        paths[item_id].add(path)

    root = doc["root"]
    visit_module(root, index[str(root)]["name"])
    return paths


def members(doc, type_id):
    """Public fns and consts of the inherent impls of a struct/enum; methods of a trait."""
    index = doc["index"]
    item = index[str(type_id)]
    k = kind(item)
    out = []
    if k == "trait":
        for mid in item["inner"]["trait"]["items"]:
            out.append(("trait_fn" if kind(index[str(mid)]) == "function" else "trait_item", mid))
        return out
    if k not in ("struct", "enum", "union"):
        return out
    for impl_id in item["inner"][k]["impls"]:
        impl = index.get(str(impl_id))
        if impl is None or impl["inner"]["impl"]["trait"] is not None:
            continue
        if impl["inner"]["impl"].get("is_synthetic") or impl["inner"]["impl"].get("blanket_impl"):
            continue
        for mid in impl["inner"]["impl"]["items"]:
            m = index.get(str(mid))
            if m is None or m.get("visibility") != "public":
                continue
            mk = kind(m)
            if mk == "function":
                out.append(("function", mid))
            elif mk == "assoc_const":
                out.append(("constant", mid))
    return out


def count(doc):
    index = doc["index"]
    paths = walk(doc)
    rows = []  # (kind, display path(s), id)
    for item_id, ps in paths.items():
        item = index[str(item_id)]
        k = kind(item)
        if k == "module":
            continue
        if k == "static":
            k = "constant"
        rows.append((k, sorted(ps), item_id))
        for mk, mid in members(doc, item_id):
            m = index[str(mid)]
            rows.append((mk, sorted(p + "::" + m["name"] for p in ps), mid))
    seen = set()
    uniq = []
    for r in rows:
        if r[2] in seen:
            continue
        seen.add(r[2])
        uniq.append(r)
    totals = collections.Counter(k for k, _, _ in uniq)
    multi = [r for r in uniq if len(r[1]) > 1]
    modules = sorted(p for i, ps in paths.items() if kind(index[str(i)]) == "module" for p in ps)
    return uniq, totals, multi, modules


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--crate", default="shm-ring")
    ap.add_argument("--features", default="")
    ap.add_argument("--json", help="read this rustdoc JSON file instead of building one")
    ap.add_argument("--list", action="store_true", help="print every public item")
    ap.add_argument(
        "--hidden",
        action="store_true",
        help="count `#[doc(hidden)]` items too (they are public, only not documented)",
    )
    args = ap.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = args.json or build(args.crate, args.features, args.hidden, root)
    with open(path) as f:
        doc = json.load(f)
    rows, totals, multi, modules = count(doc)
    if args.list:
        for k, ps, _ in sorted(rows, key=lambda r: (r[0], r[1])):
            print(f"{k:10} {' | '.join(ps)}")
        print()
    fields = [
        ("fns_total", totals["function"] + totals["trait_fn"]),
        ("fns", totals["function"]),
        ("structs", totals["struct"]),
        ("enums", totals["enum"]),
        ("consts", totals["constant"]),
        ("traits", totals["trait"]),
        ("trait_fns", totals["trait_fn"]),
        ("type_aliases", totals["type_alias"]),
        ("pub_modules", len(modules)),
        ("multi_path", len(multi)),
        ("multi_path_types", sum(1 for r in multi if r[0] in KINDS and r[0] != "function")),
    ]
    print(" ".join(f"{k}={v}" for k, v in fields))
    if multi and not args.list:
        print("reachable by more than one path:", file=sys.stderr)
        for _, ps, _ in multi:
            print("  " + " | ".join(ps), file=sys.stderr)


if __name__ == "__main__":
    main()
