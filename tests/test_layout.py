"""The repository's layout as a reader meets it: the reading set at the root, machinery in folders.

A static parse of every import of the project's modules, imports inside functions included (the
modules are never imported here, so a broken module fails its own tests, not this one):
  * no import cycle among the project's modules;
  * plumbing/, evaluation/ and tasks/ never import a command a user types (train, eval, report,
    preflight), except the builder scripts that are themselves commands (`python -m tasks.tiny_base`);
  * the root holds the reading set and the commands, nothing else;
  * no module over 650 lines (dapo.py: 800).
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FOLDERS = ("plumbing", "evaluation", "tasks")
COMMANDS = {"train", "eval", "report", "preflight"}
# Modules of the folders that are commands themselves (run with python -m), so they may import the commands.
FOLDER_COMMANDS = {"tasks.tiny_base"}
ROOT_MODULES = {"dapo", "train", "task", "rollout", "verifier", "eval", "report", "preflight",
                "tiny_base"}  # tiny_base.py: only prints where the builder moved (python -m tasks.tiny_base)
MAX_LINES = {"dapo.py": 800}


def _modules() -> dict[str, Path]:
    mods = {p.stem: p for p in REPO.glob("*.py")}
    for folder in FOLDERS:
        for p in (REPO / folder).glob("*.py"):
            mods[folder if p.stem == "__init__" else f"{folder}.{p.stem}"] = p
    return mods


def _imports(path: Path, mods: set[str]) -> set[str]:
    """The project's modules that `path` imports anywhere (module level or inside a function)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            while name and name not in mods:
                name = name.rpartition(".")[0]
            if name:
                out.add(name)
    return out


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    graph = {m: _imports(p, set(mods)) - {m} for m, p in mods.items()}
    for m in graph:  # `from plumbing import cli` names plumbing.cli, not the package's docstring module
        graph[m] = {t for t in graph[m] if t not in FOLDERS} | {
            f"{t}.{a}" for t in graph[m] & set(FOLDERS) for a in _from_names(mods[m], t) if f"{t}.{a}" in mods}
    return graph


def _from_names(path: Path, package: str) -> list[str]:
    return [a.name for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.ImportFrom) and node.module == package for a in node.names]


def test_no_import_cycle_counting_imports_inside_functions():
    graph, cycles, done = _graph(), [], set()

    def visit(m: str, stack: list[str]) -> None:
        stack.append(m)
        for t in sorted(graph[m]):
            if t in stack:
                cycles.append(stack[stack.index(t):] + [t])
            elif t not in done:
                visit(t, stack)
        stack.pop()
        done.add(m)

    for m in sorted(graph):
        if m not in done:
            visit(m, [])
    assert not cycles, f"import cycles: {[' -> '.join(c) for c in cycles]}"
    # the verifier's machinery is imported by verifier.py, never the reverse (the graph sees those edges)
    assert {"plumbing.final_answer", "plumbing.math_equivalence", "plumbing.math_workers"} <= graph["verifier"]


def test_folders_never_import_the_commands():
    graph = _graph()
    assert "plumbing.runlog" in graph and "evaluation.audit" in graph and "tasks.tiny" in graph
    bad = {m: sorted(graph[m] & COMMANDS) for m in graph
           if m.split(".")[0] in FOLDERS and m not in FOLDER_COMMANDS and graph[m] & COMMANDS}
    assert not bad, f"machinery importing a command (move the call to the command, or the code out of it): {bad}"


def test_the_root_holds_the_reading_set_and_the_commands():
    root = {p.stem for p in REPO.glob("*.py")}
    assert root == ROOT_MODULES, (f"root .py files {sorted(root)}; a new module goes into plumbing/, evaluation/ or "
                                  "tasks/ (plumbing/__init__.py says which) unless it is an algorithm component or a command")


def test_no_module_over_650_lines():
    sizes = {str(p.relative_to(REPO)): len(p.read_text().splitlines()) for p in _modules().values()}
    over = {f: n for f, n in sizes.items() if n > MAX_LINES.get(f, 650)}
    assert len(sizes) > 20 and not over, f"over the size limit: {over}"
