"""Fail when any import cycle exists between modules of torchstep and its adapters.

import-linter's ``acyclic_siblings`` contract (in pyproject.toml) sees cycles between
siblings; this check also sees a package's ``__init__`` and its own submodules importing
each other, and counts imports inside functions too (grimp reads every import statement).
Run by ``make lint``; prints each cycle as a chain of modules.

    python tools/import_cycles.py
"""

from __future__ import annotations

import sys

import grimp

PACKAGES = ("torchstep", "torchstep_airflow", "torchstep_kfp", "torchstep_prefect")


def find_cycles(packages: tuple[str, ...] = PACKAGES) -> list[list[str]]:
    """Every strongly connected group of modules (Tarjan), as a chain from one member
    back to itself; ``[]`` when the import graph has no cycle."""
    graph = grimp.build_graph(*packages, cache_dir=None)
    modules = sorted(graph.modules)
    edges = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []
    counter = 0

    def visit(root: str) -> None:  # iterative Tarjan: deep graphs must not hit the recursion limit
        nonlocal counter
        work = [(root, iter(edges[root]))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, it = work[-1]
            for nxt in it:
                if nxt not in edges:
                    continue  # an external package
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(edges[nxt])))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = []
                    while True:
                        m = stack.pop()
                        on_stack.discard(m)
                        group.append(m)
                        if m == node:
                            break
                    if len(group) > 1:
                        groups.append(sorted(group))

    for m in modules:
        if m not in index:
            visit(m)
    cycles = []
    for group in groups:
        first = group[0]
        back = next(m for m in edges[first] if m in group)
        chain = graph.find_shortest_chain(importer=back, imported=first) or (back, first)
        cycles.append([first, *chain])
    return cycles


def main() -> int:
    packages = tuple(p for p in PACKAGES if _importable(p))
    cycles = find_cycles(packages)
    for chain in cycles:
        print("import cycle: " + " -> ".join(chain))
    if not cycles:
        print(f"no import cycles in {', '.join(packages)}")
    return 1 if cycles else 0


def _importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


if __name__ == "__main__":
    sys.exit(main())
