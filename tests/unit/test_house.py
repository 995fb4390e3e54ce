"""The house rules (tests/house.py) hold on this tree, and each rule catches what it names."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.house import boundary_breaks, cycles, needless_deferred_imports, read_tree

REPO = Path(__file__).resolve().parents[2]


def test_no_import_cycle_anywhere():
    assert cycles(read_tree(REPO)) == []


def test_benchmarks_never_import_harness_and_harness_pulls_no_torch_at_import():
    assert boundary_breaks(read_tree(REPO)) == []


def test_imports_inside_functions_only_defer_heavy_packages():
    assert needless_deferred_imports(read_tree(REPO)) == []


def test_importing_every_harness_module_loads_no_torch():
    code = ("import importlib, pkgutil, sys, harness\n"
            "for m in pkgutil.walk_packages(harness.__path__, 'harness.'):\n"
            "    importlib.import_module(m.name)\n"
            "print(sorted({k.split('.')[0] for k in sys.modules} & {'torch', 'deepspeed', 'transformers'}))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"


def _tree(root: Path, files: dict[str, str]) -> dict:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return read_tree(root, ("harness", "benchmarks", "contract"))


def test_the_rules_catch_a_cycle_a_boundary_break_and_a_needless_deferred_import(tmp_path):
    modules = _tree(tmp_path, {
        "harness/__init__.py": "",
        "harness/a.py": "def f():\n    from .b import g\n",          # a cycle through a function
        "harness/b.py": "from .a import f\nimport json\n",
        "harness/c.py": "from benchmarks import model\n",             # torch at import, through benchmarks
        "harness/d.py": "def f():\n    from . import c\n    import optuna\n",   # both defer something heavy
        "benchmarks/__init__.py": "",
        "benchmarks/model.py": "import torch\n",
        "contract/spec.py": "def f():\n    from harness import b\n    import json\n",
    })
    assert cycles(modules) == [["harness.a", "harness.b"]]
    assert boundary_breaks(modules) == ["harness.c imports torch at import time", "contract.spec imports harness.b"]
    needless = needless_deferred_imports(modules)
    assert [line.split(": ", 1)[1] for line in needless] == [
        "harness.b inside a function defers nothing heavy", "harness.b inside a function defers nothing heavy",
        "json inside a function defers nothing heavy"]
