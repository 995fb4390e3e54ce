"""What the capability probe (benchmarks/node/probe.py) tells the controller: whether two machines are
comparable, in words when they are not; what a training run achieved against the matmul rates its
machine measured (matmul_eff_pct: its model FLOPs at those rates, a teacher's in its own dtype, over
the time taken); the probe's one line in the run summary.

Comparable, by measurement: the two records' probes agree on the device and, on cpu, on the ISA
class that picks torch's kernels, the GPUs' state (power limit, throttling, PCIe link, ECC,
persistence, MIG: benchmarks/node/gpu_state.py) does not differ, and each figure (best of the probe's
repeats) lies within its tolerance (TOLERANCE_PCT, measured: see docs/measurement.md, "Machines"):
the triad, and the matmul rates of the dtypes the run computes in (harness/verdict/compare.py
run_dtypes; an AMX core's bf16 rate moves 2-3x with its host's neighbours, which an fp32 run never feels).
A reference whose record carries no probe is "machine not measured"; a run without one (a record
from before the probe) is judged by the machines' names as before (harness.verdict.compare.machine_of).
"""
from __future__ import annotations

import copy
import math
from typing import Any, Collection, Optional

from benchmarks.node.gpu_state import state_differences

TOLERANCE_PCT = {"cpu": {"matmul": 40.0, "triad": 60.0}, "cuda": {"matmul": 12.0, "triad": 5.0}}
"""How far a probe figure may differ (|now/ref - 1|, percent) between two runs of one machine, by device.
cpu, measured on the cpu platform's 2-core AMD EPYC VM (AVX2) over three hours: fp32
matmul (F.linear) best-of-5 65.5-90.8 GFLOP/s per core (max/min 1.39; it drifts with the VM's host,
and the runs' throughput with it), bf16 7.3-8.8, one core's triad 14.3-26.1 GB/s (1.83 at worst,
1.55 on a quiet box). A box that lacks AVX-512 differs by 2x in fp32 matmul and the ISA class is
compared exactly, so 40 % still parts them. cuda, from the GPU nodes' records
(reference_results/sources/gpu-runs/, `tests/perf/gpu_noise.py`): over 6 benches on two H100 80GB
HBM3 nodes, bf16 matmul 713-774 TFLOP/s (8.6 % apart, the widest), fp16 695-732 (5.2 %), fp32
50.8-51.1 (0.7 %), triad 2,994-3,036 GB/s (1.4 %); over 2 benches of an H200 node, fp16 4.1 %, bf16
1.1 %, triad 1.4 %. So matmul 12 % and triad 5 %, about 1.4x and 3.5x the widest seen; an H200
(triad 4.3 TB/s) and an H100 (3.0) stay 40 % apart, and the GPUs' power, clocks and link are
compared exactly (benchmarks/node/gpu_state.py). tests/unit/test_gpu_noise.py keeps these above the
records. docs/measurement.md, "Machines"."""
PACE_NOISE_PCT = {"cpu": 15.0, "cuda": 3.0}
"""How far a run's pace (harness/nodes.py pulse_of) may differ from the reference's before the machine
counts as having run at another speed (harness/verdict/explained.py at_machine_pace). cpu, measured
on the 2-core AVX2 EPYC: the 7 training runs of a default-cpu bench on a quiet box read 0.93-1.11x
their own bench's probe fp32 figure (docs/measurement.md, "A machine that changes speed"). cuda,
from the GPU nodes' records (`tests/perf/gpu_noise.py`): 17 training runs on two H100 nodes (6
benches, eager, compiled, FP8, Liger, 8B-shaped) read 0.997-1.014x their own bench's probe fp32
figure, 1.4 % off at most; so 3 %, about 2x that. (The H200's records predate the pulse.)"""
HOST_DISPATCH_PCT = 15.0
"""How far the probe's host_dispatch figure (million torch ops a second, one thread) may move before a
"what changed" names it. Not part of comparability: a GPU-bound run does not feel its host's pace.
Measured on the 2-core EPYC VM: best of 5 within 0.859-0.864 over five probes (under 1 %); GPU nodes'
hosts: not measured yet (their records predate the figure), so 15 %, the cpu pace noise's."""
FLAG_WORDS = {"avx512f": "AVX-512", "avx512_bf16": "AVX-512 BF16", "amx_bf16": "AMX (bf16 tiles)"}
UNIT_WORDS = {"cpu": "GFLOP/s per core", "cuda": "GFLOP/s"}
DTYPE_ORDER = ("fp32", "bf16", "fp16")


def probe_of(machine: Any) -> Optional[dict[str, Any]]:
    """The probe of a machine dict (environment.machine or a node's), None when it has none or
    it failed."""
    probe = machine.get("probe") if isinstance(machine, dict) else None
    if not isinstance(probe, dict) or probe.get("error") or not isinstance(probe.get("matmul"), dict):
        return None
    return probe


def node_probes(env: Optional[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every node's probe of a fingerprint (rank 0's node only, for a record without nodes)."""
    env = env if isinstance(env, dict) else {}
    nodes = env.get("nodes") or [{"machine": env.get("machine")}]
    return [p for p in (probe_of(n.get("machine")) for n in nodes if isinstance(n, dict)) if p]


def best_figure(probe: dict[str, Any], *path: str) -> Optional[float]:
    """A probe figure's best-of value (what verdicts compare): best_figure(probe, "matmul", "fp32"),
    best_figure(probe, "triad"); None where the probe lacks it."""
    node: Any = probe
    for key in path:
        node = node.get(key) if isinstance(node, dict) else None
    value = node.get("best") if isinstance(node, dict) else None
    return float(value) if isinstance(value, (int, float)) and value > 0 else None


def probe_distance(reference_env: Optional[dict[str, Any]], current_env: Optional[dict[str, Any]]) -> Optional[float]:
    """How far apart two machines' probes read (first nodes): the sum, over the figures both measured (fp32 matmul,
    the triad), of |ln(theirs / ours)|; None where they share none (a record from before the probe)."""
    ours, theirs = node_probes(current_env), node_probes(reference_env)
    if not ours or not theirs:
        return None
    pairs = [(best_figure(theirs[0], *path), best_figure(ours[0], *path)) for path in (("matmul", "fp32"), ("triad",))]
    logs = [abs(math.log(a / b)) for a, b in pairs if a and b]
    return sum(logs) if logs else None


def _named_figures(probe: dict[str, Any]) -> list[tuple[tuple[str, ...], dict[str, Any]]]:
    """A probe's figure dicts by their path (("matmul", "fp32"), ("triad",)): what best_figure reads."""
    out = [(("matmul", d), f) for d, f in (probe.get("matmul") or {}).items() if isinstance(f, dict)]
    return out + [((k,), probe[k]) for k in ("triad", "host_dispatch") if isinstance(probe.get(k), dict)]


def pooled(env: Optional[dict[str, Any]], envs: list[Optional[dict[str, Any]]]) -> Optional[dict[str, Any]]:
    """env with each of its probes' figures at their best over the probes of `envs` taken on the same
    node (host, boot, device): one machine probed once per run, pooled as one probe pools its repeats.
    Measured in CI on the 2-core EPYC: one run's probe read fp32 matmul 45.3 GFLOP/s, quiet, while
    the other run of the same night read 80.6 and the runs' own pulses 72-77; judged by that one
    probe, the night's verdicts were all "not comparable". env itself is left as it is (a copy)."""
    if not isinstance(env, dict) or len(envs) < 2:
        return env
    best: dict[tuple, float] = {}
    for other in envs:
        for probe in node_probes(other):
            node = (probe.get("host"), probe.get("boot_id"), probe.get("device"))
            for path, fig in _named_figures(probe):
                value = best_figure(fig)
                if value:
                    best[node + path] = max(value, best.get(node + path, 0.0))
    out = copy.deepcopy(env)
    for probe in node_probes(out) + [p for p in [probe_of(out.get("machine"))] if p]:
        node = (probe.get("host"), probe.get("boot_id"), probe.get("device"))
        for path, fig in _named_figures(probe):
            if node + path in best and best_figure(fig):
                fig["best"] = best[node + path]
    return out


def _num(x: float) -> str:
    return f"{x:.3g}" if x < 100 else f"{x:,.0f}"


def isa_words(ref: dict[str, Any], cur: dict[str, Any]) -> Optional[str]:
    """Why two CPUs' ISA classes differ, in words; None when they are the same class."""
    a, b = ref.get("isa") or {}, cur.get("isa") or {}
    if a.get("class") == b.get("class"):
        return None
    words = []
    if b.get("torch_cpu_capability") == "DEFAULT" != a.get("torch_cpu_capability"):
        env = b.get("aten_cpu_capability_env")
        words.append("torch's vectorised CPU kernels are off here (CPU capability DEFAULT"
                     + (f", ATEN_CPU_CAPABILITY={env})" if env else ")"))
    elif a.get("torch_cpu_capability") == "DEFAULT" != b.get("torch_cpu_capability"):
        words.append("the reference ran torch's non-vectorised CPU kernels (CPU capability DEFAULT)")
    fa, fb = a.get("flags") or {}, b.get("flags") or {}
    lacks = [w for f, w in FLAG_WORDS.items() if fa.get(f) and not fb.get(f)]
    has = [w for f, w in FLAG_WORDS.items() if fb.get(f) and not fa.get(f)]
    if lacks:
        words.append(f"this CPU lacks {', '.join(lacks)}")
    if has:
        words.append(f"the reference's CPU lacked {', '.join(has)}")
    detail = "; ".join(words) or "another kernel set"
    return f"ISA {b.get('class')} vs {a.get('class')}: {detail}"


def _busier(ref: dict[str, Any], cur: dict[str, Any]) -> str:
    out = ""
    for key, what in (("other_cpus", "other work"), ("steal_cpus", "the hypervisor's steal")):
        a, b = ref.get(key), cur.get(key)
        if isinstance(a, (int, float)) and isinstance(b, (int, float)) and abs(a - b) >= 0.5:
            out += f"; {what} during the probe {b:.1f} vs {a:.1f} CPUs ({'busier' if b > a else 'quieter'} here)"
    return out


def moved(ref: dict[str, Any], cur: dict[str, Any],
          dtypes: Optional[Collection[str]] = None) -> list[tuple[str, float, float]]:
    """(figure, reference, now) of each probe figure beyond its device's tolerance: 'fp32_matmul',
    'bf16_matmul', ... in the suite's dtype order, then 'triad'; the matmul figures of `dtypes`
    only, where given (None: every dtype)."""
    tolerance = TOLERANCE_PCT.get(cur.get("device") or "cpu", TOLERANCE_PCT["cpu"])
    pairs = [(f"{d}_matmul", "matmul", best_figure(ref, "matmul", d), best_figure(cur, "matmul", d))
             for d in DTYPE_ORDER if d in ref["matmul"] and d in cur["matmul"] and (dtypes is None or d in dtypes)]
    pairs.append(("triad", "triad", best_figure(ref, "triad"), best_figure(cur, "triad")))
    return [(name, a, b) for name, kind, a, b in pairs if a and b and abs(b / a - 1) * 100 > tolerance[kind]]


def differences(ref: dict[str, Any], cur: dict[str, Any], dtypes: Optional[Collection[str]] = None) -> list[str]:
    """What makes two probes not comparable, in words ('bf16 matmul 1.2 vs 79 GFLOP/s per core: this
    CPU lacks AVX-512 BF16'); [] when they are comparable. Numbers read 'now vs reference'. `dtypes`:
    the matmul rates compared (those a run computes in: harness/verdict/compare.py run_dtypes); None: all of them."""
    if ref.get("device") != cur.get("device"):
        return [f"device {cur.get('device')} vs {ref.get('device')}"]
    device = cur.get("device") or "cpu"
    isa = isa_words(ref, cur) if device == "cpu" else None
    unit = UNIT_WORDS.get(device, "GFLOP/s")
    out = [f"memory bandwidth (triad) {_num(b)} vs {_num(a)} GB/s" if name == "triad"
           else f"{name.replace('_', ' ')} {_num(b)} vs {_num(a)} {unit}" for name, a, b in moved(ref, cur, dtypes)]
    if device == "cuda":
        out += state_differences(ref.get("gpus") or [], cur.get("gpus") or [])
        if ref.get("gpu_name") != cur.get("gpu_name"):
            out.insert(0, f"GPU {cur.get('gpu_name')} vs {ref.get('gpu_name')}")
    if isa:
        head, detail = isa.split(": ", 1)
        out = [f"{'; '.join(out)}: {detail} ({head})" if out else isa]
    elif out:
        out[-1] += _busier(ref, cur)
    return out


def probe_diff(reference_env: Optional[dict[str, Any]], current_env: Optional[dict[str, Any]]) -> dict[str, list]:
    """The machine-state part of a "what changed" ({key: [reference, now]}): the ISA class, each
    probe figure beyond its tolerance (moved), the GPUs' state in words; rank 0's node against the
    reference's. {} when either side has no probe."""
    ref, cur = node_probes(reference_env), node_probes(current_env)
    if not ref or not cur:
        return {}
    a, b = ref[0], cur[0]
    out: dict[str, list] = {}
    if (a.get("isa") or {}).get("class") != (b.get("isa") or {}).get("class"):
        out["probe.isa"] = [(a.get("isa") or {}).get("class"), (b.get("isa") or {}).get("class")]
    out.update({f"probe.{name}_{'gbps' if name == 'triad' else 'gflops'}": [x, y] for name, x, y in moved(a, b)})
    x, y = best_figure(a, "host_dispatch"), best_figure(b, "host_dispatch")
    if x and y and abs(y / x - 1) * 100 > HOST_DISPATCH_PCT:     # the host's pace: what a host-bound step moves with
        out["probe.host_dispatch_mops"] = [x, y]
    if b.get("device") == "cuda":
        words = state_differences(a.get("gpus") or [], b.get("gpus") or [])
        if words:
            out["probe.gpu_state"] = [None, "; ".join(words)]
    return out


def not_comparable(reference_env: Optional[dict[str, Any]], current_env: Optional[dict[str, Any]],
                   dtypes: Optional[Collection[str]] = None) -> Optional[str]:
    """Why a reference measured on reference_env cannot judge a run on current_env ('not comparable:
    ...'), None when it can. Only for a run that carries a probe (see the module's docstring).
    `dtypes`: the matmul rates the run rests on (harness/verdict/compare.py run_dtypes); None: all the probes measured."""
    current = node_probes(current_env)
    if not current:
        return None
    reference = node_probes(reference_env)
    if not reference:
        return "not comparable: machine not measured (the reference carries no capability probe)"
    words: list[str] = []
    for i, probe in enumerate(current):   # each node against the reference's node of the same host, else its first
        ref = next((r for r in reference if r.get("host") == probe.get("host")), reference[0])
        for w in differences(ref, probe, dtypes):
            label = f"node {probe.get('host')}: " if len(current) > 1 else ""
            if w not in words and f"{label}{w}" not in words:
                words.append(f"{label}{w}")
    return f"not comparable: {'; '.join(words)}" if words else None


def capacity_gflops(probes: list[dict[str, Any]], dtype: str, ranks_per_node: int,
                    threads_per_rank: int) -> Optional[float]:
    """The run's measured matmul capacity, GFLOP/s over all its nodes: on cpu the per-core rate
    times the cores the ranks can use (min(usable CPUs, ranks x threads)); on cuda the GPU's rate
    times the GPUs used per node. None when a node's probe lacks the dtype."""
    total = 0.0
    for p in probes:
        rate = best_figure(p, "matmul", dtype)
        if rate is None:
            return None
        if p.get("device") == "cuda":
            total += rate * ranks_per_node
        else:
            usable = p.get("usable_cpus") or ranks_per_node * threads_per_rank
            total += rate * min(usable, ranks_per_node * threads_per_rank)
    return total or None


def efficiency_pct(tokens_per_s: float, parts: list[tuple[float, str]], probes: list[dict[str, Any]],
                   ranks_per_node: int, threads_per_rank: int) -> Optional[tuple[float, dict[str, Any]]]:
    """(matmul_eff_pct, its inputs): the time the run's model FLOPs would take at the matmul rates
    its machines measured, over the time they took. `parts`: (FLOPs per token, dtype) of each part
    (the student's training, a teacher's forward in its own dtype). None without a probe of a dtype."""
    ideal_s_per_token, rates = 0.0, {}
    for flops_per_token, dtype in parts:
        capacity = capacity_gflops(probes, dtype, ranks_per_node, threads_per_rank)
        if not capacity:
            return None
        rates[dtype] = round(capacity, 3)
        ideal_s_per_token += flops_per_token / (capacity * 1e9)
    return 100.0 * tokens_per_s * ideal_s_per_token, {"measured_gflops": rates,
                                                       "source": "model FLOPs at the probe's matmul rates / time taken"}


def mix_apart(reference_env: Optional[dict[str, Any]], current_env: Optional[dict[str, Any]],
              dtypes: list[str]) -> Optional[str]:
    """Why an efficiency over parts in several dtypes (a distillation: the student's fp32 training,
    the teacher's bf16 forward) cannot be judged across these two machines: the dtypes' measured
    rates stand in another ratio (beyond the probe's matmul tolerance), so the efficiency weighs its
    parts differently on each. Measured: an AVX2 EPYC's bf16 runs at 0.10x its fp32 (7.4 vs 71 GFLOP/s
    a core), an AVX-512 BF16 one's at 4.3x (489 vs 113); the teacher's forward is most of the ideal time
    on the first and almost none on the second, and a same-code kd run read 62 % and 39 %. None when
    one dtype, no probe on a side, or the ratios agree."""
    ref, cur = node_probes(reference_env), node_probes(current_env)
    used = [d for d in DTYPE_ORDER if d in dtypes]
    if len(used) < 2 or not ref or not cur:
        return None
    tolerance = TOLERANCE_PCT.get(cur[0].get("device") or "cpu", TOLERANCE_PCT["cpu"])["matmul"]
    base = used[0]
    for d in used[1:]:
        rates = [(best_figure(p, "matmul", d), best_figure(p, "matmul", base)) for p in (ref[0], cur[0])]
        if not all(a and b for a, b in rates):
            continue
        then, now = (a / b for a, b in rates)
        if abs(now / then - 1) * 100 > tolerance:
            return (f"its {d} and {base} parts run at another ratio here ({d}/{base} matmul {now:.3g} vs "
                    f"{then:.3g}), so the efficiency weighs them differently")
    return None


def summary_line(env: Optional[dict[str, Any]]) -> Optional[str]:
    """The probe in one line: 'probe (vm, 3.3 s): AVX2; fp32 matmul 80, bf16 1.2 GFLOP/s per core
    (spread 3 %, 2 %); triad 30 GB/s; host dispatch 0.86 Mop/s' (the last where the probe has it)."""
    probes = node_probes(env)
    if not probes:
        return None
    p = probes[0]
    device = p.get("device") or "cpu"
    mm = p["matmul"]
    rates = ", ".join(f"{d} {_num(best_figure(p, 'matmul', d) or 0)}" for d in mm)
    spreads = ", ".join(f"{(mm[d] or {}).get('spread_pct', 0):.0f} %" for d in mm)
    head = (p.get("isa") or {}).get("class") if device == "cpu" else p.get("gpu_name")
    triad = best_figure(p, "triad")
    more = f" (+{len(probes) - 1} node(s))" if len(probes) > 1 else ""
    took = max(x.get("took_s") or 0 for x in probes)
    host = best_figure(p, "host_dispatch")
    return (f"probe ({p.get('host')}{more}, {took:.1f} s a node): {head}; matmul {rates} "
            f"{UNIT_WORDS.get(device, 'GFLOP/s')} (spread {spreads}); triad {_num(triad or 0)} GB/s"
            + (f"; host dispatch {host:.2f} Mop/s" if host else ""))
