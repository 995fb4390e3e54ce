"""Paths and small helpers shared by the unit tests (imported by name: tests/unit is on sys.path)."""
from __future__ import annotations

import os
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
CONF_DIR = REPO_ROOT / "conf"
_VENV = REPO_ROOT / ".venv" / "bin" / "python"
VENV_PYTHON = str(_VENV) if _VENV.exists() else sys.executable

if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(REPO_ROOT / ".cache" / "torch_extensions"))


def options(group: str) -> list[str]:
    """The options of a config group as a user sees them: the YAML files in conf/<group>/."""
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))
