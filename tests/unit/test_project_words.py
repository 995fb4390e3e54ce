"""The project speaks of itself (issue 39 item 6): its docs and code describe GPU nodes by what they
are ("a one-GPU H200 node (16-core Xeon VM, no network)", "a GPU node without network access"), never
by how its developers reached them. Records and logs are kept as they were written, so only what the
project says is checked: docs, code, configs, scripts and the reference tables' provenance."""
from __future__ import annotations

import re
import subprocess

from unit_helpers import REPO_ROOT

WORDS = re.compile(r"(?<![a-z])lent(?![a-z])|(?<![a-z])lending(?![a-z])|\bdevice tool\b|\bthis session\b|\bissue \d+ session\b|"
                   r"\bsessions? (?:get|gets) at most\b|\bsession of \d{4}", re.IGNORECASE)
"""How the suite's GPU nodes were reached while it was developed: nothing a reader can place."""
CHECKED = re.compile(r"\.(md|py|sh|ya?ml|toml|cfg|txt)$|(^|/)(Makefile|Dockerfile\.\w+)$|^reference_results/[^/]+\.json$")


def _project_files() -> list[str]:
    listed = subprocess.run(["git", "ls-files"], cwd=REPO_ROOT, capture_output=True, text=True, check=True).stdout
    return [f for f in listed.splitlines() if CHECKED.search(f) and f != "tests/unit/test_project_words.py"]


def test_docs_and_code_never_speak_of_how_gpu_nodes_were_reached():
    files = _project_files()
    assert any(f.startswith("docs/") for f in files) and "reference_results/h200.json" in files
    found = [f"{f}:{n}: {line.strip()[:120]}" for f in files
             for n, line in enumerate((REPO_ROOT / f).read_text(encoding="utf-8", errors="replace").splitlines(), 1)
             if WORDS.search(line)]
    assert not found, "\n".join(found)


def test_the_words_are_caught_where_they_would_be():
    for line in ("on a lent H200", "tests/gpu/lent_machine.sh", "LENT_NODE_HOST_GIB = 125.87", "lending_budget", "(the device tool; every", "submitter (issue 26 session)",
                 "over three hours of this session", "developers (session of 2026-11-27)"):
        assert WORDS.search(line), line
    for line in ("a one-GPU H200 node (16-core Xeon VM, no network)", "the test session's PostgreSQL", "silent",
                 "EQUIVALENT_NODE", "excellent", "lentil"):
        assert not WORDS.search(line), line
