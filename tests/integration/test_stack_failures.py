"""A compile that fails is a recorded error with the compiler's own message, never a traceback of the
harness or a hung rank; a stack setting the platform cannot run is refused before anything launches."""
from __future__ import annotations

import os
import subprocess

import pytest

from .conftest import REPO, harness_cmd

pytestmark = pytest.mark.integration


def test_a_compile_that_fails_is_an_error_record_with_inductors_own_message(tmp_path):
    out = tmp_path / "out"
    # Inductor's C++ backend with no working compiler: the ranks' compile fails at the first step
    proc = subprocess.run(harness_cmd(out, "suite=single", "workload.compile=torch", "measure.steps=1",
                                      "measure.profile_steps=0", "measure.timeout_s=300"),
                          cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONUNBUFFERED": "1", "CXX": "/nonexistent/g++"})
    assert proc.returncode == 3, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    import json
    (record,) = [json.loads(p.read_text()) for p in out.glob("*.json") if p.name != "suite.json"]
    assert record["status"] == "error"
    assert "InductorError" in record["reason"] and "No working C++ compiler" in record["reason"]


@pytest.mark.parametrize("override,words", [("workload.kernels=liger", "Triton GPU kernels"),
                                            ("workload.precision=fp8", "no FP8 tensor cores")])
def test_a_setting_the_cpu_platform_cannot_run_is_refused_before_launch(tmp_path, override, words):
    out = tmp_path / "out"
    proc = subprocess.run(harness_cmd(out, "suite=single", override), cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and words in proc.stderr and "Traceback" not in proc.stderr
    assert not list(out.glob("*.json"))
