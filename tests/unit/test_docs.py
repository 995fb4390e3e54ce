"""The README and docs/ as a newcomer reads them (issue 30): the README short, every relative link in
it and in docs/ resolving (the file, and the heading an anchor names), every command its quick start
shows existing, and `make help`, `python -m harness --help` and each command's own --help agreeing
with what the README and docs/ say."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import unit_helpers  # noqa: F401  (puts the repository root on sys.path)

from harness.__main__ import COMMANDS, OWN_HELP

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = sorted((REPO / "docs").glob("*.md"))
MAX_README_LINES = 200
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _all_text() -> str:
    return README.read_text() + "\n".join(p.read_text() for p in DOCS)


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _headings(path: Path) -> set[str]:
    text, fence, out = path.read_text(), False, set()
    for line in text.splitlines():
        if line.startswith("```"):
            fence = not fence
        elif not fence and line.startswith("#"):
            out.add(_slug(line.lstrip("#")))
    return out


def test_the_readme_is_short_and_every_topic_has_its_page():
    assert len(README.read_text().splitlines()) <= MAX_README_LINES
    linked = {Path(m).name for m in LINK.findall(README.read_text()) if m.startswith("docs/")}
    assert linked == {p.name for p in DOCS}, "every docs/ page is linked from the README, and only those"


def test_every_relative_link_resolves():
    broken = []
    for page in [README, *DOCS]:
        for target in LINK.findall(page.read_text()):
            if re.match(r"[a-z]+:", target):          # http:, https:, mailto:: not ours to check offline
                continue
            file, _, anchor = target.partition("#")
            path = (page.parent / file).resolve() if file else page
            if not path.exists():
                broken.append(f"{page.relative_to(REPO)}: {target} (no such file)")
            elif anchor and path.suffix == ".md" and anchor not in _headings(path):
                broken.append(f"{page.relative_to(REPO)}: {target} (no such heading)")
    assert broken == []


def _quick_start() -> str:
    return README.read_text().split("## Quick start", 1)[1].split("\n## ", 1)[0]


def _make_targets() -> set[str]:
    makefile = (REPO / "Makefile").read_text()
    return {m for m in re.findall(r"^([a-z][\w-]*):", makefile, re.M)}


def test_every_command_the_quick_start_shows_exists():
    commands = re.findall(r"^(make [\w-]+|python -m harness [\w-]+)", _quick_start(), re.M)
    commands += re.findall(r"`(make [\w-]+|python -m harness [\w-]+)", _quick_start())
    assert len(commands) >= 5
    targets = _make_targets()
    for command in commands:
        tool, *rest = command.split()
        name = rest[-1]
        assert (name in targets) if tool == "make" else (name in COMMANDS), command


def test_the_command_table_is_every_command_the_cli_has():
    table = README.read_text().split("## Command line", 1)[1].split("\n## ", 1)[0]
    listed = {m for m in re.findall(r"^\| `([\w-]+)", table, re.M)}
    assert listed == set(COMMANDS)


def test_make_help_names_only_targets_the_docs_show():
    helped = subprocess.run(["make", "-s", "help"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    targets = re.findall(r"^  ([a-z][\w-]*)\s", helped.split("Variables", 1)[0], re.M)
    assert len(targets) >= 10 and set(targets) <= _make_targets()
    text = _all_text()
    assert [t for t in targets if f"make {t}" not in text and t != "help"] == []


def test_each_commands_own_help_agrees_with_the_docs():
    """Every option a command's --help offers is named in the README or docs/, and the top-level
    --help lists every command."""
    text = _all_text()
    top = subprocess.run([sys.executable, "-m", "harness", "--help"], cwd=REPO, capture_output=True, text=True)
    assert top.returncode == 0 and all(name in top.stdout for name in COMMANDS)
    undocumented = []
    for name in OWN_HELP:
        out = subprocess.run([sys.executable, "-m", "harness", name, "--help"], cwd=REPO, capture_output=True,
                             text=True)
        assert out.returncode == 0, (name, out.stderr[-500:])
        options = set(re.findall(r"(?<![\w-])(--[a-z][\w-]+)", out.stdout)) - {"--help"}
        undocumented += [f"{name} {o}" for o in sorted(options) if o not in text]
    assert undocumented == []


def test_the_layout_page_names_the_rooms_ls_shows():
    """docs/layout.md names every package and module directly under harness/ (`harness/x/`,
    `harness/x.py`), and every harness/ path it names exists."""
    text = (REPO / "docs" / "layout.md").read_text()
    rooms = {f"harness/{p.name}/" if p.is_dir() else f"harness/{p.name}" for p in (REPO / "harness").iterdir()
             if p.name not in ("__pycache__", "__init__.py")}
    assert [r for r in sorted(rooms) if f"`{r}" not in text] == []
    named = set(re.findall(r"`(harness/[\w/.]+)`", _all_text()))
    assert [n for n in sorted(named) if not (REPO / n.rstrip("/")).exists()] == []
