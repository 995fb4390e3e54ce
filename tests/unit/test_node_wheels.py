"""`python -m containers.node_wheels`: what a GPU node without network access lacks, as wheels in
.whl/ for tests/gpu/*_node.sh: the gpu lock's hashed pins of CARRY for CPython 3.12 on Linux x86-64,
the sdist-only ones built here, torchao 0.16 beside them; the real lock pins every one of them.
pip is a fake here (`wheelhouse._pip` replaced), writing the files a real pip would."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from packaging.utils import canonicalize_name
from unit_helpers import REPO_ROOT

from containers import lock, node_wheels, wheelhouse

SOURCE_ONLY = {"deepspeed", "antlr4-python3-runtime"}


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def file_of(name: str, version: str) -> str:
    stem = f"{canonicalize_name(name).replace('-', '_')}-{version}"
    return f"{stem}.tar.gz" if canonicalize_name(name) in SOURCE_ONLY else f"{stem}-py3-none-any.whl"


def synthetic_lock(names, version="1.0", extra: str = "") -> str:
    return "# a lock\n" + extra + "".join(
        f"{n}=={version} \\\n    --hash=sha256:{sha(file_of(n, version).encode())}\n" for n in names)


def fake_pip(calls: list):
    def pip(python, args, env=None):
        calls.append(list(args))
        value = {a: args[i + 1] for i, a in enumerate(args[:-1])}
        if args[0] == "download":
            dest = Path(value["--dest"])
            dest.mkdir(parents=True, exist_ok=True)
            for e in lock.parse_lock(Path(value["-r"]).read_text()):
                (dest / file_of(e.name, e.version)).write_bytes(file_of(e.name, e.version).encode())
        elif args[0] == "wheel":
            out = Path(value["--wheel-dir"])
            out.mkdir(parents=True, exist_ok=True)
            sdist = Path(args[-1]).name.removesuffix(".tar.gz")
            (out / f"{sdist}-py3-none-any.whl").write_bytes(b"built here")
    return pip


def test_the_gpu_lock_pins_everything_a_node_lacks_each_hashed():
    entries = node_wheels.carried(lock.parse_lock((REPO_ROOT / "requirements-gpu.lock").read_text()))
    assert [canonicalize_name(e.name) for e in entries] == [canonicalize_name(n) for n in node_wheels.CARRY]
    assert all(e.hashes for e in entries)
    node_has = {"torch", "triton", "transformers", "numpy", "nvidia-nccl-cu13"}   # never replaced on the node
    assert not node_has & {canonicalize_name(n) for n in node_wheels.CARRY}


def test_node_wheels_are_the_locks_files_the_sdists_built_and_the_older_torchao_beside(monkeypatch, tmp_path, capsys):
    lock_path = tmp_path / "requirements-gpu.lock"
    lock_path.write_text(synthetic_lock(["torch", *node_wheels.CARRY]))   # torch: pinned, not carried
    calls: list = []
    monkeypatch.setattr(wheelhouse, "_pip", fake_pip(calls))
    fallback = lambda pin: [sha(file_of(pin.name, pin.version).encode())]   # noqa: E731 - PyPI's JSON API
    dest = node_wheels.make(lock_path, tmp_path / ".whl", hashes_of=fallback)
    top = sorted(p.name for p in dest.glob("*.whl"))
    assert len(top) == len(node_wheels.CARRY) and not any(n.startswith("torch-") for n in top)
    assert {"deepspeed-1.0-py3-none-any.whl", "antlr4_python3_runtime-1.0-py3-none-any.whl"} <= set(top)
    assert [p.name for p in (dest / "torchao016").iterdir()] == ["torchao-0.16.0-py3-none-any.whl"]
    downloads = [c for c in calls if c[0] == "download"]
    assert len(downloads) == 2 and all("--require-hashes" in c and "cp312" in c for c in downloads)
    manifest = json.loads((dest / wheelhouse.MANIFEST).read_text())
    assert manifest["lock"] == "requirements-gpu.lock" and manifest["pins"]["deepspeed"] == "1.0"
    assert manifest["files"]["torchao016/torchao-0.16.0-py3-none-any.whl"]["folder"] == "torchao016"
    assert "built here from deepspeed-1.0.tar.gz" in manifest["files"]["deepspeed-1.0-py3-none-any.whl"]["origin"]
    assert f"{len(node_wheels.CARRY) + 1} wheels" in capsys.readouterr().out
    assert not (tmp_path / ".whl.partial").exists()


def test_the_stack_script_installs_the_fallback_from_the_folder_this_writes():
    text = (REPO_ROOT / "tests" / "gpu" / "stack_node.sh").read_text()
    for folder in node_wheels.FALLBACK:
        assert f".whl/{folder}/*.whl" in text


def test_a_lock_without_a_carried_pin_stops_naming_it_and_keeps_the_old_wheels(monkeypatch, tmp_path, capsys):
    lock_path = tmp_path / "requirements-gpu.lock"
    lock_path.write_text(synthetic_lock([n for n in node_wheels.CARRY if n not in ("optuna", "colorlog")],
                                        extra="colorlog==6.12.0\n"))
    dest = tmp_path / ".whl"
    dest.mkdir()
    (dest / "kept.whl").write_bytes(b"from before")
    monkeypatch.setattr(wheelhouse, "_pip", fake_pip([]))
    assert node_wheels.main(["--lock", str(lock_path), "--dest", str(dest)]) == 2
    err = capsys.readouterr().err
    assert "pins no optuna" in err and "pins colorlog without a hash" in err
    assert [p.name for p in dest.iterdir()] == ["kept.whl"]


def test_a_failed_download_keeps_the_old_wheels(monkeypatch, tmp_path):
    lock_path = tmp_path / "requirements-gpu.lock"
    lock_path.write_text(synthetic_lock(node_wheels.CARRY))
    dest = tmp_path / ".whl"
    dest.mkdir()
    (dest / "kept.whl").write_bytes(b"from before")

    def offline(python, args, env=None):
        raise wheelhouse.WheelhouseError("`pip download ...` failed (exit 1): no network")
    monkeypatch.setattr(wheelhouse, "_pip", offline)
    with pytest.raises(wheelhouse.WheelhouseError, match="no network"):
        node_wheels.make(lock_path, dest)
    assert [p.name for p in dest.iterdir()] == ["kept.whl"]
