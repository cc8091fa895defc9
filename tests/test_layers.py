"""The import layers of pyproject.toml's [tool.importlinter] contracts hold (data -> featurize -> heads ->
cli; inside heads the core -> apply -> experiments; no circle between sibling modules), and importing the
command line loads no torch (so `cli --help` answers at once), every package folder is in the wheel, and the size rules hold (modules, functions, docs pages)."""
from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_import_contracts_are_kept():
    if shutil.which("lint-imports") is None:
        pytest.skip("import-linter is not installed (the README set-up installs it with the test extra)")
    run = subprocess.run(["lint-imports"], cwd=ROOT, capture_output=True, text=True, env=os.environ.copy())
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert "0 broken" in run.stdout


def test_importing_the_cli_loads_no_torch():
    code = "import sys, headstore.cli; print(sorted(m for m in ('torch', 'transformers', 'faiss') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=os.environ.copy())
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout


def test_every_package_folder_is_listed_for_the_wheel():
    """pyproject.toml lists the packages by hand (the repository root is the package): a folder with an
    __init__.py missing from that list would be absent from a wheel or a non-editable install."""
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {"headstore"} | {
        "headstore." + ".".join(init.parent.relative_to(ROOT).parts)
        for top in ("data", "featurize", "heads") for init in (ROOT / top).rglob("__init__.py")}
    assert folders - listed == set(), f"package folders missing from [tool.setuptools] packages: {sorted(folders - listed)}"
    assert listed - folders == set(), f"listed packages without a folder: {sorted(listed - folders)}"


def _source_files() -> list[Path]:
    """The project's own Python modules (tests aside): the package folders, cli.py, bench/ and tools/."""
    return [p for p in ROOT.rglob("*.py") if not {"tests", "build", ".git"} & set(p.relative_to(ROOT).parts)
            and not any(part.endswith(".egg-info") for part in p.parts)]


def test_no_module_over_350_lines_and_no_function_over_60():
    """The house's size rules (nanoGPT's: modules of 100-350 lines, functions that fit on a screen)."""
    too_long = []
    for path in _source_files():
        source = path.read_text(encoding="utf-8")
        if len(source.splitlines()) > 350:
            too_long.append(f"{path.relative_to(ROOT)}: {len(source.splitlines())} lines")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 60:
                too_long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: "
                                f"{node.end_lineno - node.lineno + 1} lines")
    assert not too_long, "\n".join(too_long)


def test_no_docs_page_over_400_lines_before_its_lab_notes():
    """A docs page opens with its answer; probes and dated reruns go under a final "## Lab notes"."""
    long_pages = []
    for page in (ROOT / "docs").rglob("*.md"):
        lines = page.read_text(encoding="utf-8").splitlines()
        before = next((i for i, line in enumerate(lines) if line.strip() == "## Lab notes"), len(lines))
        if before > 400:
            long_pages.append(f"{page.relative_to(ROOT)}: {before} lines before its lab notes")
    assert not long_pages, "\n".join(long_pages)


def test_the_import_graph_has_no_circle():
    """No module imports, directly or through others, a module that imports it (a package's __init__ and its own
    modules included, which import-linter's sibling contract does not see): grimp's graph, function-level imports
    counted, searched for strongly connected components (Tarjan)."""
    import grimp

    graph = grimp.build_graph("headstore")
    edges = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    index, low, stack, on_stack, circles = {}, {}, [], set(), []

    def visit(root: str) -> None:  # iterative Tarjan: (node, its next edge) frames
        frames = [(root, 0)]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while frames:
            node, i = frames[-1]
            if i < len(edges[node]):
                frames[-1] = (node, i + 1)
                nxt = edges[node][i]
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    frames.append((nxt, 0))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            frames.pop()
            if frames:
                low[frames[-1][0]] = min(low[frames[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    circles.append(sorted(component))

    for module in sorted(edges):
        if module not in index:
            visit(module)
    assert not circles, circles
