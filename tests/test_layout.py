"""The repository's layout as a reader meets it: the reading set at the root, machinery in folders.

A static parse of every import of the project's modules, imports inside functions included (the
modules are never imported into this process, so a broken module fails its own tests, not this one):
  * no import cycle among the project's modules;
  * plumbing/, evaluation/ and tasks/ never import a command a user types (train, eval, report,
    preflight), except the builder scripts that are themselves commands (`python -m tasks.tiny_base`);
  * the trainer reaches no command and no task through its imports, direct or not; and importing
    train.py (in a subprocess) loads no tasks.* module and no command: the task comes from the
    config at run time (--task, task.BUILTIN_TASKS);
  * the root holds the reading set and the commands, nothing else;
  * no module over 650 lines but those MAX_LINES names, each with its reason (verifier.py among the capped).
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FOLDERS = ("plumbing", "evaluation", "tasks")
COMMANDS = {"train", "eval", "report", "preflight"}
# Modules of the folders that are commands themselves (run with python -m), so they may import the commands.
FOLDER_COMMANDS = {"tasks.tiny_base"}
ROOT_MODULES = {"dapo", "train", "task", "rollout", "verifier", "eval", "report", "preflight"}
# The size cap is 650 lines. A file that reaches it is split by concern (two concerns, two files named for
# them), or, where it is one concern, given its own cap here with the reason; code is never moved out only
# for the count.
MAX_LINES = {
    "dapo.py": 800,  # the whole algorithm, one pure function per intervention, read top to bottom
    "train.py": 750,  # the design card's one file: the config, one DAPO step in the order it runs, the loop
    "plumbing/generator.py": 700,  # one concern, the pool of generator processes: start, admission, weights, failures
}


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


def test_the_trainer_loads_no_task_and_no_command():
    graph, reached, todo = _graph(), set(), ["train"]
    while todo:  # everything train.py imports, directly or through other modules
        for t in graph[todo.pop()] - reached:
            reached.add(t)
            todo.append(t)
    back = sorted(m for m in reached if m in COMMANDS or m.split(".")[0] == "tasks")
    assert not back, f"train.py reaches {back} through its imports: a preset's values go in train.PRESETS, a measurement in evaluation/"
    code = "import json, sys, train; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr[-3000:]
    loaded = json.loads(out.stdout.splitlines()[-1])
    bad = [m for m in loaded if m.split(".")[0] == "tasks" or m in COMMANDS - {"train"}]
    assert not bad, f"importing train.py loads {bad}: the task is the config's, loaded at run time"


def test_the_root_holds_the_reading_set_and_the_commands():
    root = {p.stem for p in REPO.glob("*.py")}
    assert root == ROOT_MODULES, (f"root .py files {sorted(root)}; a new module goes into plumbing/, evaluation/ or "
                                  "tasks/ (plumbing/__init__.py says which) unless it is an algorithm component or a command")


def test_no_module_over_650_lines():
    sizes = {str(p.relative_to(REPO)): len(p.read_text().splitlines()) for p in _modules().values()}
    over = {f: n for f, n in sizes.items() if n > MAX_LINES.get(f, 650)}
    assert len(sizes) > 20 and not over, (f"over the size limit: {over}. Split the file by concern, or, if it is one "
                                          "concern, raise its cap in MAX_LINES with the reason")
