"""The GPU nodes' own noise, from their records (reference_results/sources/gpu-runs/): how far the
capability probe's figures moved between benches of one GPU model, and how far each training run's
pace (its pulse, environment.load.pulse_fp32) lay from its own bench's probe, and its memory pace
(load.pulse_triad) from the probe's triad. harness/probe.py sets the probe's GPU tolerances
(TOLERANCE_PCT["cuda"]) and the pace rule's GPU noise (PACE_NOISE_PCT["cuda"]) from these figures, and
harness/pace.py MEMORY_PACE_NOISE_PCT["cuda"] once records carry a memory pulse;
tests/unit/test_gpu_noise.py keeps them above what the records show.

    .venv/bin/python tests/perf/gpu_noise.py [ROOT ...]
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from harness.probe import best_figure  # noqa: E402  (the probe's best-of figure, as the verdicts read it)

REPO_ROOT = Path(__file__).resolve().parents[2]
GPU_RUNS = REPO_ROOT / "reference_results" / "sources" / "gpu-runs"
FIGURES = (("matmul", "fp32"), ("matmul", "bf16"), ("matmul", "fp16"), ("triad",))


@dataclass
class Noise:
    """One GPU model's figures: each probe figure's values (one per bench), and each paced run's
    pulse over its own bench's probe fp32 figure."""
    gpu: str
    probes: dict[str, list[float]] = field(default_factory=dict)
    paces: list[float] = field(default_factory=list)
    memory_paces: list[float] = field(default_factory=list)

    def spread_pct(self, figure: str) -> float:
        """max/min - 1 of a figure over the benches, percent: the farthest two probes of one model."""
        values = self.probes.get(figure) or []
        return (max(values) / min(values) - 1) * 100 if len(values) > 1 else 0.0

    def pace_pct(self, memory: bool = False) -> float:
        """The farthest a run's pace (memory pace: its triad's) lay from its bench's probe, percent."""
        return max((abs(p - 1) * 100 for p in (self.memory_paces if memory else self.paces)), default=0.0)


def _gpu(env: dict[str, Any]) -> Optional[str]:
    gpus = ((env.get("machine") or {}).get("gpus")) or []
    return (gpus[0].get("name") if gpus and isinstance(gpus[0], dict) else None) or env.get("gpu_model")


def noise(roots: list[Path]) -> dict[str, Noise]:
    """Every bench folder (one with a record whose probe ran on cuda) under the roots, by GPU model."""
    out: dict[str, Noise] = {}
    seen_probes: set[str] = set()
    for root in roots:
        for path in sorted(root.rglob("*.json")):
            if "runs" in path.parts or "probes" in path.parts:
                continue
            try:
                rec = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            env = rec.get("environment") if isinstance(rec, dict) else None
            probe = ((env or {}).get("machine") or {}).get("probe") if isinstance(env, dict) else None
            if not isinstance(probe, dict) or probe.get("device") != "cuda" or not _gpu(env):
                continue
            model = out.setdefault(_gpu(env), Noise(_gpu(env)))
            key = json.dumps(probe, sort_keys=True)
            if key not in seen_probes:   # one probe a bench (a bench that reused an earlier probe adds none)
                seen_probes.add(key)
                for figure in FIGURES:
                    value = best_figure(probe, *figure)
                    if value:
                        model.probes.setdefault(" ".join(reversed(figure)), []).append(value)
            pulse = (env.get("load") or {}).get("pulse_fp32")
            fp32 = best_figure(probe, "matmul", "fp32")
            if isinstance(pulse, (int, float)) and pulse > 0 and fp32:
                model.paces.append(pulse / fp32)
            memory, triad = (env.get("load") or {}).get("pulse_triad"), best_figure(probe, "triad")
            if isinstance(memory, (int, float)) and memory > 0 and triad:
                model.memory_paces.append(memory / triad)
    return out


def main(argv: Optional[list[str]] = None) -> int:
    roots = [Path(a) for a in (argv if argv is not None else sys.argv[1:])] or [GPU_RUNS]
    models = noise(roots)
    if not models:
        print(f"no GPU records with a probe under {', '.join(map(str, roots))}")
        return 1
    for m in models.values():
        print(f"{m.gpu}:")
        for figure, values in m.probes.items():
            print(f"  probe {figure:<12} {min(values):>12,.1f} - {max(values):>12,.1f}  spread {m.spread_pct(figure):4.1f} % "
                  f"({len(values)} benches)")
        if m.paces:
            print(f"  pace (pulse / its bench's probe fp32): {min(m.paces):.4f} - {max(m.paces):.4f} over {len(m.paces)} runs "
                  f"(at most {m.pace_pct():.1f} % off)")
        else:
            print("  pace: no run with a pulse")
        if m.memory_paces:
            print(f"  memory pace (pulse_triad / its bench's probe triad): {min(m.memory_paces):.4f} - "
                  f"{max(m.memory_paces):.4f} over {len(m.memory_paces)} runs (at most {m.pace_pct(True):.1f} % off)")
        else:
            print("  memory pace: no run with a memory pulse")
    return 0


if __name__ == "__main__":
    sys.exit(main())
