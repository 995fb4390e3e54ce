"""Attribution (issue 16 item 4), in CI: a slowed micro-step run for real, Inductor's kernels built
unoptimised in a compiled run for real (issue 38), DeepSpeed's memory_breakdown left on in a user's
DeepSpeed JSON for real, and every change the corpus makes by editing real
records (versions, the training stack's packages and SDPA backend, NCCL and gloo variables, image,
link, CPU), each judged as `compare NEW --against OLD` judges: the verdict names exactly the change; a
slower machine (torch's non-vectorised kernels, for real) and a degraded GPU (real nvidia-smi -q
outputs in the probe) are not comparable, naming why. The full corpus (thread count, a busier machine
and a package moved in a second venv for real, unchanged runs as the edited side) and the false-alarm
count are `make perf` (tests/perf/attribution.py)."""
from __future__ import annotations

import dataclasses

from tests.perf.attribution import CASES, Case, corpus

FAST = ["measure.warmup_steps=1", "measure.steps=2", "measure.profile_steps=0"]
"""Both sides alike: the verdicts judge the throughput steps; a profiled step would add one more (13 s in the
memory_breakdown run on a 2-core AVX2 box)."""


def test_each_injected_change_is_named_exactly_and_another_machine_is_not_comparable(tmp_path):
    """A slowed micro-step is a regression naming it (and, if a neighbour ran meanwhile, the load it
    caused, which is true); so is llama-tiny compiled with TORCHINDUCTOR_DEBUG_COMPILE=1 (-O0 kernels,
    3.0-3.8x slower here), naming that variable; torch's non-vectorised kernels (ATEN_CPU_CAPABILITY=default,
    run for real) and a power-capped, throttled or PCIe-degraded GPU (real nvidia-smi -q outputs) are
    "not comparable", naming the machine's difference."""
    # 0.3 s per micro-step: 1.2 s a step, over 1.5x on a box twice as slow as this one; one NEW run against
    # OLD's two, as every real case here (a second bench cost 22 s on a 2-core AVX2 box)
    delay = Case("slowed micro-step", {"measure.inject_delay_s"}, overrides=["measure.inject_delay_s=0.3"], runs=1)
    slower_kernels = next(c for c in CASES if c.env.get("ATEN_CPU_CAPABILITY") == "default")
    # one NEW run against two OLD: the -O0 kernels cost ~90 s (their C++ builds, then 4 s steps); the
    # corpus compiles warm (measure.compile_cache=warm), so the second OLD run loads what the first compiled
    unoptimised = next(c for c in CASES if "TORCHINDUCTOR_DEBUG_COMPILE" in c.env)
    # and one run of torch's non-vectorised kernels: its verdict is the probe's (the CPU capability it
    # measured), whatever the steps read, and its steps are the slowest of the corpus
    # and one run with DeepSpeed's memory_breakdown on in the user's JSON (13x slower): no library, variable or
    # setting of the configuration's key moved, the DeepSpeed JSON did
    memory_breakdown = next(c for c in CASES if "memory_breakdown" in c.name)
    cases = [delay, dataclasses.replace(slower_kernels, runs=1), dataclasses.replace(unoptimised, runs=1),
             dataclasses.replace(memory_breakdown, runs=1)] + [c for c in CASES if not c.real]
    outcomes = corpus(tmp_path, repeats=2, cases=cases, extra=FAST, edit_source="old")
    wrong = [f"{o.case.name}: {o.verdicts}, what changed: {o.named}" for o in outcomes if not o.right]
    assert not wrong, wrong
    assert len(outcomes) >= 10
