#!/usr/bin/env python3
"""Checks that the library's headers include only downwards in the layer order.

Scans every *.hpp and *.cuh under the library root (default: include/distillcache), resolves each
quoted #include relative to the including file (and <distillcache/...> from the include root;
other <...> includes are external and ignored), then checks:

  1. levels: a header may include only headers of its own level or lower (LEVELS below), and
     cpu/ and cuda/ must not include each other;
  2. folders: every header lies in a folder of the table (a new folder must be added to it);
  3. existence: a quoted include that points into the library names a file that exists;
  4. cycles: the folder -> folder graph of the includes (model/ is one folder, detail/
     subfolders belong to their parent) has no cycle.

On failure: one line per violation, then a summary, exit status 1. On success: one summary line,
exit status 0. Run by CTest (tests/headers/CMakeLists.txt) as layering.check, and on the broken
tree tests/fixtures/layering_bad as layering.rejects_bad_include.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections import defaultdict
from pathlib import Path, PurePosixPath

# ---- The layer order (lowest first) --------------------------------------------------------
# Folder -> level. detail/ subfolders take their parent's level. A header in a folder not listed
# here is an error: add new folders to this table.
LEVELS: dict[str, int] = {
    "core": 0,
    "math": 1,
    "cpu": 2,
    "cuda": 2,
    "io": 3,  # loaders, tokenizers
    "cache": 4,
    "model": 5,  # transformer.hpp, sampling.hpp and any model/ file not in FILE_LEVELS
    "policy": 6,
    "decode": 7,
    "rl": 8,
    "eval": 8,
    "eval/tasks": 8,  # RULER-style task generators (host-only text, no model)
}
# Files whose level differs from their folder's (paths relative to the root).
FILE_LEVELS: dict[str, int] = {
    "model/config.hpp": 3,
    "model/weights.hpp": 3,
    "distillcache.hpp": 9,  # the umbrellas
    "distillcache.cuh": 9,
}
# Folders of one level that must not include each other (either way).
SEPARATE: set[frozenset[str]] = {frozenset({"cpu", "cuda"})}

EXTENSIONS = (".hpp", ".cuh")
INCLUDE_RE = re.compile(r'^\s*#\s*include\s*(?:"([^"]+)"|<([^>]+)>)')
PACKAGE = "distillcache/"  # <distillcache/...> resolves from the library root
REPO = Path(__file__).resolve().parent.parent


def strip_comments(lines: list[str]) -> list[str]:
    """Blanks /* ... */ comments (keeping line numbers), so commented-out includes are skipped."""
    out, in_block = [], False
    for line in lines:
        text, i = [], 0
        while i < len(line):
            if in_block:
                end = line.find("*/", i)
                if end < 0:
                    i = len(line)
                else:
                    in_block, i = False, end + 2
            else:
                start = line.find("/*", i)
                line_comment = line.find("//", i)
                if start < 0 or (0 <= line_comment < start):
                    text.append(line[i:])
                    i = len(line)
                else:
                    text.append(line[i:start])
                    in_block, i = True, start + 2
        out.append("".join(text))
    return out


def folder_of(rel: PurePosixPath) -> str:
    """The folder a header belongs to: its directory without detail/ components; '' at the top."""
    parts = [p for p in rel.parent.parts if p != "detail"]
    return "/".join(parts)


def level_of(rel: PurePosixPath) -> int | None:
    key = rel.as_posix()
    if key in FILE_LEVELS:
        return FILE_LEVELS[key]
    return LEVELS.get(folder_of(rel))


def describe(rel: PurePosixPath) -> str:
    folder = folder_of(rel)
    return folder if folder else rel.as_posix()


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Cycles among folders: for each strongly connected component, enough shortest cycles to
    cover every edge inside it."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    counter = [0]

    def strongconnect(v: str) -> None:  # Tarjan; the graph has a dozen nodes, recursion is fine
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                components.append(sorted(comp))

    nodes = set(graph) | {w for ws in graph.values() for w in ws}
    for v in sorted(nodes):
        if v not in index:
            strongconnect(v)

    def shortest_path(src: str, dst: str, members: set[str]) -> list[str]:
        parent: dict[str, str | None] = {src: None}
        frontier = [src]
        while frontier and dst not in parent:
            nxt = []
            for u in frontier:
                for w in sorted(graph.get(u, ())):
                    if w in members and w not in parent:
                        parent[w] = u
                        nxt.append(w)
            frontier = nxt
        path, u = [], dst
        while u is not None:
            path.append(u)
            u = parent[u]
        return path[::-1]

    # Within each component, one shortest cycle through every edge not yet on a printed cycle:
    # every include that takes part in a cycle shows up, without listing all elementary cycles.
    cycles = []
    for comp in sorted(components):
        members = set(comp)
        covered: set[tuple[str, str]] = set()
        for u in comp:
            for v in sorted(graph.get(u, ())):
                if v not in members or (u, v) in covered:
                    continue
                cycle = [u] + shortest_path(v, u, members)
                # Print each cycle starting from its smallest folder, so the output is stable.
                body = cycle[:-1]
                k = body.index(min(body))
                cycle = body[k:] + body[:k] + [body[k]]
                covered.update(zip(cycle, cycle[1:]))
                cycles.append(cycle)
    return cycles


def check(root: Path) -> tuple[list[str], int, int]:
    root = root.resolve()
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in EXTENSIONS)
    violations: list[str] = []
    includes_checked = 0
    graph: dict[str, set[str]] = defaultdict(set)
    edge_includes: dict[tuple[str, str], list[str]] = defaultdict(list)

    def shown(path: Path) -> str:  # as printed: relative to the repository, whatever the cwd
        try:
            return path.relative_to(REPO).as_posix()
        except ValueError:
            return str(path)

    for path in files:
        rel = PurePosixPath(path.relative_to(root).as_posix())
        level = level_of(rel)
        if level is None:
            what = (f"folder '{folder_of(rel)}'" if folder_of(rel)
                    else f"top-level header '{rel}'")
            violations.append(f"{shown(path)}:1: {what} is not in the layer table "
                              f"(scripts/check_layers.py LEVELS)")
        lines = strip_comments(path.read_text(encoding="utf-8", errors="replace").splitlines())
        for lineno, line in enumerate(lines, start=1):
            m = INCLUDE_RE.match(line)
            if not m:
                continue
            quoted, angled = m.group(1), m.group(2)
            if quoted is not None:
                target = Path(os.path.normpath(path.parent / quoted))
                if not target.exists() and quoted.startswith(PACKAGE):
                    target = Path(os.path.normpath(root / quoted[len(PACKAGE):]))
            elif angled.startswith(PACKAGE):
                target = Path(os.path.normpath(root / angled[len(PACKAGE):]))
            else:
                continue  # a system or third-party header
            try:
                trel = PurePosixPath(target.relative_to(root).as_posix())
            except ValueError:
                continue  # outside the library: not this check's business
            spelled = quoted if quoted is not None else f"<{angled}>"
            includes_checked += 1
            if not target.is_file():
                violations.append(f"{shown(path)}:{lineno}: includes {trel} ({spelled}), "
                                  f"which does not exist")
                continue
            tlevel = level_of(trel)
            if level is None:
                continue  # already reported: the including file's folder is unknown
            if tlevel is None:
                violations.append(f"{shown(path)}:{lineno}: includes {trel}, which is not "
                                  f"in the layer table")
                continue
            src_folder, dst_folder = folder_of(rel), folder_of(trel)
            if tlevel > level:
                violations.append(f"{shown(path)}:{lineno}: includes {trel} (level {tlevel}) "
                                  f"from level {level}")
            elif frozenset({src_folder, dst_folder}) in SEPARATE:
                violations.append(f"{shown(path)}:{lineno}: includes {trel} (level {tlevel}) "
                                  f"from level {level}: {src_folder}/ and {dst_folder}/ must "
                                  f"not include each other")
            src_node, dst_node = describe(rel), describe(trel)
            if src_node != dst_node:
                graph[src_node].add(dst_node)
                edge_includes[(src_node, dst_node)].append(f"{rel}:{lineno} includes {trel}")

    for cycle in find_cycles(graph):
        def edge(a: str, b: str) -> str:
            shown_includes, rest = edge_includes[(a, b)][:4], edge_includes[(a, b)][4:]
            return ", ".join(shown_includes) + (f" (+{len(rest)} more)" if rest else "")
        edges = "; ".join(edge(a, b) for a, b in zip(cycle, cycle[1:]))
        violations.append(f"directory cycle: {' -> '.join(cycle)} ({edges})")
    return violations, len(files), includes_checked


def main() -> int:
    repo = REPO
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=repo / "include" / "distillcache",
                        help="the library's header root (default: %(default)s)")
    args = parser.parse_args()
    if not args.root.is_dir():
        print(f"check_layers: --root {args.root} is not a directory", file=sys.stderr)
        return 2
    violations, nfiles, nincludes = check(args.root)
    for v in violations:
        print(v)
    if violations:
        print(f"check_layers: FAILED: {len(violations)} violation(s) in {nfiles} files "
              f"({nincludes} includes checked)")
        return 1
    print(f"check_layers: OK: {nfiles} files, {nincludes} includes checked, no upward includes, "
          f"no directory cycles")
    return 0


if __name__ == "__main__":
    sys.exit(main())
