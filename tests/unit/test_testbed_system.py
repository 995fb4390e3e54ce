"""testbed/system.install_packages against an apt-get that an earlier, killed install left refusing ("dpkg was
interrupted"): it says so, runs `dpkg --configure -a` and installs again, once; any other failure, or a dpkg that
cannot mend it, stops with apt-get's (dpkg's) own words. apt-get, apt-cache and dpkg are small scripts on PATH that
keep their calls in a log: the state a killed install leaves is a marker file that only `dpkg --configure -a`
removes."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from testbed import system

REFUSAL = "E: dpkg was interrupted, you must manually run 'dpkg --configure -a' to correct the problem."


def _tools(tmp_path: Path, monkeypatch, dpkg_rc: int = 0, other_failure: str = "") -> tuple[Path, Path]:
    bin_dir, log, half_done = tmp_path / "bin", tmp_path / "calls.log", tmp_path / "half-done"
    bin_dir.mkdir()
    half_done.touch()
    scripts = {
        "apt-cache": "exit 0",
        "apt-get": (f'if [ -e {half_done} ]; then echo "{REFUSAL}" >&2; exit 100; fi\n'
                    + (f'echo "{other_failure}" >&2; exit 100' if other_failure else "exit 0")),
        "dpkg": f'[ "$*" = "--configure -a" ] || exit 2\n[ {dpkg_rc} -eq 0 ] && rm -f {half_done}\n'
                f'echo "dpkg: error processing package libpulse0" >&2\nexit {dpkg_rc}',
    }
    for name, body in scripts.items():
        (bin_dir / name).write_text(f'#!/bin/sh\necho "{name} $*" >> {log}\n{body}\n')
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.setattr(system, "find_binary", lambda name: shutil.which(name, path=str(bin_dir)))
    monkeypatch.setattr(system.os, "geteuid", lambda: 0)
    monkeypatch.setattr(system, "APT_LOCK", tmp_path / "apt.lock")
    return log, half_done


def test_an_install_that_dpkg_was_interrupted_before_is_mended_and_made(tmp_path, monkeypatch, capsys):
    log, half_done = _tools(tmp_path, monkeypatch)
    system.install_packages(["chromium"], {})
    calls = [line.split(" -o ")[0] if line.startswith("apt-get") else line for line in log.read_text().splitlines()]
    assert calls == ["apt-cache show chromium", "apt-get", "dpkg --configure -a", "apt-get"], calls
    assert not half_done.exists()
    assert "dpkg was interrupted by an earlier install; running `dpkg --configure -a`" in capsys.readouterr().err


def test_a_dpkg_that_cannot_mend_it_stops_with_its_own_words(tmp_path, monkeypatch):
    log, _ = _tools(tmp_path, monkeypatch, dpkg_rc=1)
    with pytest.raises(system.Unavailable, match=r"(?s)dpkg --configure -a failed \(rc 1\).*libpulse0"):
        system.install_packages(["chromium"], {})
    assert log.read_text().count("apt-get") == 1


def test_another_failure_is_not_mended_but_said(tmp_path, monkeypatch):
    log, half_done = _tools(tmp_path, monkeypatch, other_failure="E: Unable to locate package chromium")
    half_done.unlink()
    with pytest.raises(system.Unavailable, match="Unable to locate package chromium"):
        system.install_packages(["chromium"], {})
    assert "dpkg" not in log.read_text()


def test_two_processes_install_one_after_the_other(tmp_path, monkeypatch):
    """make test's second integration phase runs two pytest workers: one may install podman for the image build while
    the other installs Chromium. Each install holds system.APT_LOCK (an flock), so the second apt-get starts after the
    first ended: their calls never interleave."""
    log, half_done = _tools(tmp_path, monkeypatch)
    half_done.unlink()
    apt_get = tmp_path / "bin" / "apt-get"
    apt_get.write_text(f'#!/bin/sh\necho "start $$" >> {log}\nsleep 0.5\necho "end $$" >> {log}\n')
    lock = system.APT_LOCK   # the tmp_path one _tools set, for both processes
    script = ("import sys; from pathlib import Path; from testbed import system\n"
              "system.os.geteuid = lambda: 0\n"
              f"system.APT_LOCK = Path({str(lock)!r})\n"
              "system.install_packages([sys.argv[1]], {})\n")
    repo = Path(__file__).resolve().parents[2]
    procs = [subprocess.Popen([sys.executable, "-c", script, name], cwd=repo) for name in ("podman", "chromium")]
    assert [p.wait(timeout=60) for p in procs] == [0, 0]
    calls = [line.split()[0] for line in log.read_text().splitlines() if line.split()[0] in ("start", "end")]
    assert calls == ["start", "end", "start", "end"], log.read_text()
