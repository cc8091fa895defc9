"""The house map: headstore's rooms and the imports between them, drawn from the code so it cannot drift.

    python3 tools/house_map.py            # rewrite the generated block of docs/design.md
    python3 tools/house_map.py --check    # exit 1 when docs/design.md's block is not what the code gives (CI, a test)

A room is a package (a folder with an `__init__.py`) below the containers `headstore`, `headstore.featurize`,
`headstore.heads` and `headstore.heads.experiments`; a module lying directly in a container is a room of its own
at the top (`cli`) and belongs to the container's own room below it (`heads.experiments`). The import graph is
grimp's (the one `lint-imports` checks), function-level imports included. An arrow A --> B says A imports B;
arrows implied by others (A --> B --> C makes A --> C implied) are left out, so the picture shows the layering,
not every import. The table under it lists each room's modules and the first sentence of its docstring.
"""
from __future__ import annotations

import argparse
import ast
import importlib.util
import sys
from pathlib import Path

import grimp

CONTAINERS = ("headstore", "headstore.featurize", "headstore.heads", "headstore.heads.experiments")
GROUPS = ("headstore.data", "headstore.featurize", "headstore.heads.experiments", "headstore.heads")  # subgraphs
BEGIN, END = "<!-- house-map:begin (tools/house_map.py writes this block) -->", "<!-- house-map:end -->"
DESIGN = Path(__file__).resolve().parent.parent / "docs" / "design.md"


def room_of(module: str, packages: set[str]) -> str:
    """The room a module lives in: its first ancestor (or itself) that is a package and no container."""
    parts = module.split(".")
    for depth in range(1, len(parts) + 1):
        prefix = ".".join(parts[:depth])
        if prefix in CONTAINERS:
            continue
        if prefix in packages or prefix == module:
            if prefix == module and module not in packages and ".".join(parts[:-1]) != "headstore":
                return ".".join(parts[:-1])  # a loose module of a container below the top: the container's room
            return prefix
    return module  # a container's own __init__


def room_edges(graph, rooms: dict[str, str]) -> set[tuple[str, str]]:
    """(importer room, imported room) for every import between two rooms."""
    edges = set()
    for module, room in rooms.items():
        for imported in graph.find_modules_directly_imported_by(module):
            other = rooms.get(imported)
            if other is not None and other != room:
                edges.add((room, other))
    return edges


def reduced(edges: set[tuple[str, str]]) -> set[tuple[str, str]]:
    """The transitive reduction of the room graph: an edge is dropped when another path joins its ends."""
    succ: dict[str, set[str]] = {}
    for a, b in edges:
        succ.setdefault(a, set()).add(b)

    def reaches(start: str, goal: str, skip: tuple[str, str]) -> bool:
        seen, todo = {start}, [start]
        while todo:
            node = todo.pop()
            for nxt in succ.get(node, ()):
                if (node, nxt) == skip or nxt in seen:
                    continue
                if nxt == goal:
                    return True
                seen.add(nxt)
                todo.append(nxt)
        return False

    return {(a, b) for a, b in edges if not reaches(a, b, (a, b))}


def short(room: str) -> str:
    name = room.removeprefix("headstore.")
    return f"{name} (heads_cli)" if room == "headstore.heads.experiments" else name


def node_id(room: str) -> str:
    return room.replace(".", "_")


def mermaid(rooms: set[str], edges: set[tuple[str, str]]) -> list[str]:
    lines = ["```mermaid", "flowchart TB"]
    placed = set()
    for group in GROUPS:
        members = sorted(r for r in rooms - placed if r == group or r.startswith(group + "."))
        if not members:
            continue
        lines.append(f'  subgraph {node_id(group)}_g["{group.removeprefix("headstore.")}"]')
        lines += [f'    {node_id(r)}["{short(r)}"]' for r in members]
        lines.append("  end")
        placed |= set(members)
    lines += [f'  {node_id(r)}["{short(r)}"]' for r in sorted(rooms - placed)]
    lines += [f"  {node_id(a)} --> {node_id(b)}" for a, b in sorted(edges)]
    return lines + ["```"]


def first_sentence(path: Path) -> str:
    """The first sentence of a module's docstring, on one line (the table's "what it owns")."""
    doc = " ".join((ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or "").split())
    end = next((i + 1 for i, c in enumerate(doc) if c == "." and doc[i + 1:i + 2] in ("", " ")), len(doc))
    sentence = doc[:end] if end <= 160 else doc[:160].rsplit(" ", 1)[0] + " …"
    return sentence.replace("|", "\\|")


def room_table(rooms: dict[str, str], files: dict[str, Path]) -> list[str]:
    lines = ["| room | modules | what it owns (its docstring's first sentence) |", "|---|---|---|"]
    for room in sorted(set(rooms.values())):
        members = [m for m, r in rooms.items() if r == room]
        init = files.get(room)
        lines.append(f"| `{short(room)}` | {len(members)} | {first_sentence(init) if init else ''} |")
    return lines


def block() -> str:
    graph = grimp.build_graph("headstore")
    files = {m: Path(importlib.util.find_spec(m).origin) for m in graph.modules}
    packages = {m for m, f in files.items() if f.name == "__init__.py"}
    rooms = {m: room_of(m, packages) for m in graph.modules if m not in CONTAINERS}
    edges = reduced(room_edges(graph, rooms))
    body = mermaid(set(rooms.values()), edges) + [""] + room_table(rooms, files)
    return "\n".join([BEGIN, *body, END])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when docs/design.md's block is stale")
    args = parser.parse_args()
    text = DESIGN.read_text(encoding="utf-8")
    if BEGIN not in text or END not in text:
        print(f"{DESIGN}: no house-map block ({BEGIN!r} ... {END!r})", file=sys.stderr)
        return 1
    head, rest = text.split(BEGIN, 1)
    new = head + block() + rest.split(END, 1)[1]
    if args.check:
        if new != text:
            print(f"{DESIGN}: the house map is stale: run python3 tools/house_map.py", file=sys.stderr)
            return 1
        return 0
    DESIGN.write_text(new, encoding="utf-8")
    print(f"wrote the house map into {DESIGN}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
