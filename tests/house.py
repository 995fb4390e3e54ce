"""The house rules of the source tree, read from its syntax (tests/unit/test_house.py runs them):

- no import cycle among the project's modules, imports inside functions included (importing
  `a.b.c` imports the packages `a` and `a.b` first, so those count too);
- benchmarks/ never imports harness/ (the ranks' side knows nothing of the controller), and
  contract/, which both import, imports neither and nothing heavy;
- no harness module pulls torch, DeepSpeed or transformers at import time, through any chain of
  module-level imports (`--help`, planning and reporting stay fast and GPU-free);
- an import inside a function only defers a heavy third-party package: one of HEAVY, or a project
  module that imports one at its own import time.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

PACKAGES = ("harness", "benchmarks", "contract", "containers", "testbed")
TORCH_LIKE = {"torch", "deepspeed", "transformers"}
HEAVY = TORCH_LIKE | {"matplotlib", "optuna", "sqlalchemy", "alembic", "datasets", "tokenizers", "safetensors",
                      "liger_kernel", "torchao", "triton"}   # the last three: optional GPU packages (the GPU lock)
"""alembic: it imports sqlalchemy."""


@dataclass
class Module:
    name: str
    path: Path
    top: set[str] = field(default_factory=set)
    """What importing it imports (module-level statements, TYPE_CHECKING blocks aside)."""
    deferred: list[tuple[int, str]] = field(default_factory=list)
    """(line, module) of every import inside a function."""


def _name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _with_parents(module: str) -> list[str]:
    parts = module.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def read_tree(root: Path, packages: tuple[str, ...] = PACKAGES) -> dict[str, Module]:
    modules = {}
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            modules[_name(root, path)] = Module(_name(root, path), path)
    for mod in modules.values():
        package = mod.name if mod.path.name == "__init__.py" else mod.name.rpartition(".")[0]

        def targets(node: ast.AST) -> list[str]:
            if isinstance(node, ast.Import):
                return [a.name for a in node.names]
            assert isinstance(node, ast.ImportFrom)
            base = node.module or ""
            if node.level:
                up = package.split(".")
                up = up[: len(up) - (node.level - 1)]
                base = ".".join(up + ([node.module] if node.module else []))
            subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in modules]
            # `from pkg import mod` imports mod (pkg on the way); `from mod import name` imports mod
            return subs + ([base] if len(subs) < len(node.names) else [])

        def visit(body: list[ast.stmt], in_function: bool) -> None:
            for node in body:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    visit(node.body, True)
                elif isinstance(node, ast.ClassDef):
                    visit(node.body, in_function)
                elif isinstance(node, (ast.Import, ast.ImportFrom)):
                    for target in targets(node):
                        if in_function:
                            mod.deferred.append((node.lineno, target))
                        else:
                            mod.top.update(_with_parents(target))
                elif isinstance(node, ast.If):
                    if "TYPE_CHECKING" not in ast.dump(node.test):
                        visit(node.body, in_function)
                    visit(node.orelse, in_function)
                else:
                    for name in ("body", "orelse", "finalbody"):
                        visit(getattr(node, name, None) or [], in_function)
                    for handler in getattr(node, "handlers", None) or []:
                        visit(handler.body, in_function)

        visit(ast.parse(mod.path.read_text()).body, False)
    return modules


def _edges(modules: dict[str, Module]) -> dict[str, set[str]]:
    return {m.name: {t for t in m.top | {p for _, d in m.deferred for p in _with_parents(d)}
                     if t in modules and t != m.name} for m in modules.values()}


def cycles(modules: dict[str, Module]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    edges = _edges(modules)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    comp.append(top)
                    if top == node:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def import_time_closure(modules: dict[str, Module], name: str) -> set[str]:
    """Every module importing `name` imports, third-party ones included (by their dotted names)."""
    seen, todo = set(), [name]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        if current in modules:
            todo.extend(modules[current].top)
    return seen


def _heavy_in(closure: set[str], heavy: set[str]) -> set[str]:
    return {m.split(".")[0] for m in closure} & heavy


def boundary_breaks(modules: dict[str, Module]) -> list[str]:
    out = []
    for mod in modules.values():
        if mod.name.split(".")[0] == "benchmarks":
            out += [f"{mod.name} imports {t}" for t in sorted(mod.top | {d for _, d in mod.deferred})
                    if t.split(".")[0] == "harness"]
        if mod.name.split(".")[0] == "contract":
            out += [f"{mod.name} imports {t}" for t in sorted(mod.top | {d for _, d in mod.deferred})
                    if t.split(".")[0] in ("harness", "benchmarks")]
            heavy = _heavy_in(import_time_closure(modules, mod.name), HEAVY)
            if heavy:
                out.append(f"{mod.name} imports {', '.join(sorted(heavy))} at import time")
        if mod.name.split(".")[0] == "harness":
            heavy = _heavy_in(import_time_closure(modules, mod.name), TORCH_LIKE)
            if heavy:
                out.append(f"{mod.name} imports {', '.join(sorted(heavy))} at import time")
    return out


def needless_deferred_imports(modules: dict[str, Module]) -> list[str]:
    """Imports inside functions that defer nothing heavy."""
    out = []
    for mod in modules.values():
        for line, target in mod.deferred:
            if target.split(".")[0] in HEAVY or mod.name.startswith(target + "."):
                continue
            if target in modules and _heavy_in(import_time_closure(modules, target), HEAVY):
                continue
            out.append(f"{mod.path}:{line}: {target} inside a function defers nothing heavy")
    return out
