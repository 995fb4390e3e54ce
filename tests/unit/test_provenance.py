"""Which suite made a record (harness/provenance.py suite_identity): the suite's own commit from its own
checkout, a content hash of its files from a copy, never the commit of a repository around a copy.

Found on an H100: a `git archive` copy of the suite inside another git repository recorded that
repository's commit (2a7ad1e6..., clean) in every record as if it were the suite's (b8fea445d815)."""
from __future__ import annotations

import io
import re
import subprocess
import tarfile
from pathlib import Path

import pytest

from harness.collect import made_with
from harness.config.schema import REPO_ROOT
from harness.provenance import SUITE_FILES, content_hash, suite_commit, suite_identity
from harness.report.verdicts import environment_text
from harness.verdict.changes import environment_diff

HASH = re.compile(r"content:sha256:[0-9a-f]{16}")


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(cwd), "-c", "user.name=t", "-c", "user.email=t@example.com",
                           "-c", "commit.gpgsign=false", *args],
                          capture_output=True, text=True, check=True, timeout=60).stdout.strip()


def this_checkout_or_skip() -> str:
    """HEAD of the suite's checkout; the tests that copy the suite out of git need one."""
    here = suite_commit()
    if here.startswith("content:"):
        pytest.skip(f"this suite is itself a copy ({here}): there is no HEAD to archive or clone")
    return git(REPO_ROOT, "rev-parse", "HEAD")


def archive_into(dest: Path) -> Path:
    """`git archive HEAD` of the suite's files, unpacked into dest: a copy as a GPU node without network gets it."""
    names = [n for n in (*SUITE_FILES, "requirements.lock", "requirements-gpu.lock") if (REPO_ROOT / n).exists()]
    data = subprocess.run(["git", "-C", str(REPO_ROOT), "archive", "HEAD", *names], capture_output=True,
                          check=True, timeout=60).stdout
    dest.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(dest, filter="data")
    return dest


@pytest.fixture
def copy_in_another_repo(tmp_path):
    """The H100 session's layout: another repository (with commits of its own), the suite's copy inside it."""
    this_checkout_or_skip()
    outer = tmp_path / "outer"
    outer.mkdir()
    git(outer, "init", "-q")
    (outer / "notes.txt").write_text("the other project's file\n")
    git(outer, "add", "notes.txt")
    git(outer, "commit", "-q", "-m", "the other project")
    return outer, archive_into(outer / "suite")


def test_a_copy_inside_another_repository_is_named_by_its_files_never_by_that_repositorys_commit(copy_in_another_repo):
    outer, suite = copy_in_another_repo
    outer_commit = git(outer, "rev-parse", "HEAD")
    found = suite_identity(suite)
    assert HASH.fullmatch(found), found
    assert outer_commit not in found
    # the same when the other repository tracks the copy (committed there): its commit is still not the suite's
    git(outer, "add", "suite")
    git(outer, "commit", "-q", "-m", "vendor the suite")
    assert suite_identity(suite) == found


def test_the_same_files_hash_alike_wherever_they_lie_and_one_changed_byte_changes_the_hash(tmp_path):
    this_checkout_or_skip()
    one, two = archive_into(tmp_path / "one"), archive_into(tmp_path / "two")
    assert content_hash(one) == content_hash(two) == suite_identity(two)
    before = content_hash(two)
    (two / "harness" / "__pycache__").mkdir(exist_ok=True)
    (two / "harness" / "__pycache__" / "record.cpython-312.pyc").write_bytes(b"a cache")
    assert content_hash(two) == before, "Python's caches are not the suite"
    path = two / "conf" / "platform" / "h100.yaml"
    path.rename(path.with_name("h100-renamed.yaml"))   # the same bytes under another name: another suite
    assert content_hash(two) != before
    path.with_name("h100-renamed.yaml").rename(path)
    assert content_hash(two) == before
    path.write_text(path.read_text() + "# one more line\n")
    assert content_hash(two) != before

def test_a_clone_is_named_by_its_commit_and_a_changed_tracked_file_makes_it_dirty(tmp_path):
    head = this_checkout_or_skip()
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", "--depth", "1", f"file://{REPO_ROOT}", str(clone)], check=True, timeout=120)
    assert suite_identity(clone) == git(clone, "rev-parse", "HEAD") == head
    (clone / "scratch.txt").write_text("untracked\n")
    assert suite_identity(clone) == head, "an untracked file is not a change of the suite (as before)"
    with open(clone / "harness" / "__init__.py", "a") as f:
        f.write("# changed\n")
    assert suite_identity(clone) == head + "-dirty"


def test_a_repository_whose_head_lacks_the_suite_is_not_its_checkout(tmp_path):
    """`git init` in a copy, nothing committed (or only other files): no commit holds the suite."""
    this_checkout_or_skip()
    suite = archive_into(tmp_path / "suite")
    git(suite, "init", "-q")
    assert HASH.fullmatch(suite_identity(suite))
    git(suite, "add", "pyproject.toml")
    git(suite, "commit", "-q", "-m", "only one file")
    assert HASH.fullmatch(suite_identity(suite))


def test_this_checkout_names_its_own_commit():
    head = this_checkout_or_skip()
    assert suite_commit().removesuffix("-dirty") == head


# --- readers: what changed, collect ------------------------------------------------------------------

def test_a_changed_content_hash_is_a_suite_change_without_a_count_of_commits_between():
    old, new = "content:sha256:0123456789abcdef", "content:sha256:fedcba9876543210"
    diff = environment_diff({"suite_commit": old}, {"suite_commit": new})
    assert diff == {"suite_commit": [old, new]}
    assert environment_text(diff) == f"suite_commit: {old} -> {new}"
    commit = "b8fea445d815c3430288255a7a8458ea6682b53c"
    diff = environment_diff({"suite_commit": commit}, {"suite_commit": new})
    assert diff == {"suite_commit": [commit, new]}
    assert environment_text(diff) == f"suite_commit: b8fea445d8 -> {new}"
    assert environment_diff({"suite_commit": new}, {"suite_commit": new}) == {}


def test_collect_names_the_suite_a_dry_run_was_made_with():
    assert made_with({"suite_commit": "b8fea445d815"}) == "the checkout that made it (b8fea445d815)"
    text = made_with({"suite_commit": "content:sha256:0123456789abcdef"})
    assert "content:sha256:0123456789abcdef" in text and "checkout" not in text.split("(")[0]
    assert made_with({}) == "the checkout that made it (commit unknown)"
