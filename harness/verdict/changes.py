"""What changed between a reference's environment fingerprint and a run's (a verdict's environment_diff,
`{key: [reference, now]}`), the machine first and the suite's commit last: each node's hardware (CPU
model, its kind, stepping and microcode where kept, cores, memory, GPU count and model; never load or
clocks), the probe's moved figures (harness/probe.py), the machine's fields of contract/fingerprint.py
COMPARED, each node interface's link rate (`links.node2/eth0: [1.0, 0.25]`), other work on the machine
during the run when it differs materially (`load.other_cpus`), the host's exchange latency when it moved
(`load.pulse_exchange_us`: a slow spell), a device slower than the rest read at once (`load.pulse_devices`),
a straggler rank that came, went or moved
(`load.straggler`, harness/held_up.py straggler), the software of COMPARED (driver, CUDA,
NCCL, PyTorch, DeepSpeed, transformers, Triton, Liger Kernel, torchao, the image), the packages that moved
from the lock (`package.sympy`), what ran of the training stack (`stack.attention_used: flash -> cudnn`),
the recorded variables (`env.TORCHINDUCTOR_DEBUG_COMPILE`), the settings outside the configuration key
(`measure.inject_delay_s`), and the suite's own commit with the commits between (or the content hash of a
copy of the suite that was not its git checkout, harness/provenance.py suite_identity)."""
from __future__ import annotations

import functools
import subprocess
from typing import Any, Optional

from benchmarks.node.machine import cpu_kind
from contract.fingerprint import COMPARED, DEEPSPEED_JSON, OUTPUT_MACHINE, STACK_COMPARED, STACK_WHEN_BOTH

from ..config.schema import REPO_ROOT
from ..held_up import straggler_words, who
from ..pace import EXCHANGE_MOVED, material_cpus, slow_device
from ..probe import probe_diff
from ..provenance import CONTENT_PREFIX

HARDWARE_FIELDS = ("gpu_model", "gpu_count", "num_nodes", "num_ranks")
"""Fingerprint fields of COMPARED that are the machine, listed before the software in a diff."""


def environment_diff(reference_env: Optional[dict[str, Any]], current_env: dict[str, Any]) -> dict[str, Any]:
    """What changed between the reference's fingerprint and this run's: {key: [reference, now]}."""
    if not reference_env:
        return {"reference": "no environment fingerprint (a published figure)"}
    diff: dict[str, Any] = {}
    ref_nodes, cur_nodes = _node_machines(reference_env), _node_machines(current_env)
    if ref_nodes and cur_nodes:   # the hardware and the machine's state first
        diff.update(_by_node("machine", ".", {h: hardware(m) for h, m in ref_nodes.items()},
                             {h: hardware(m) for h, m in cur_nodes.items()}))
    diff.update(probe_diff(reference_env, current_env))
    # a field one fingerprint lacks altogether was not kept yet when it was written: it says nothing
    hardware_first = [k for k in sorted(COMPARED, key=lambda k: k not in HARDWARE_FIELDS)
                      if k in reference_env and k in current_env]
    diff.update({k: [reference_env.get(k), current_env.get(k)] for k in hardware_first
                 if k in HARDWARE_FIELDS and reference_env.get(k) != current_env.get(k)})
    ref_links, cur_links = reference_env.get("links"), current_env.get("links")
    if isinstance(ref_links, dict) and isinstance(cur_links, dict):  # both sides read their links
        diff.update(_by_node("links", "/", _per_host(ref_links), _per_host(cur_links)))
    diff.update(_load_diff(reference_env.get("load"), current_env.get("load"), current_env))
    diff.update(_devices_diff(reference_env, current_env))
    diff.update({k: [reference_env.get(k), current_env.get(k)] for k in hardware_first
                 if k not in HARDWARE_FIELDS and reference_env.get(k) != current_env.get(k)})
    diff.update(package_diff(reference_env.get("lock_mismatches"), current_env.get("lock_mismatches")))
    diff.update(stack_diff(reference_env.get("stack"), current_env.get("stack")))
    diff.update(deepspeed_diff(reference_env.get(DEEPSPEED_JSON), current_env.get(DEEPSPEED_JSON)))
    ref_vars, cur_vars = reference_env.get("env", {}) or {}, current_env.get("env", {}) or {}
    diff.update({f"env.{k}": [ref_vars.get(k), cur_vars.get(k)] for k in sorted(set(ref_vars) | set(cur_vars))
                 if ref_vars.get(k) != cur_vars.get(k)})
    ref_set, cur_set = reference_env.get("settings") or {}, current_env.get("settings") or {}
    diff.update({k: [ref_set[k], cur_set[k]] for k in sorted(set(ref_set) & set(cur_set)) if ref_set[k] != cur_set[k]})
    diff.update(_commit_diff(reference_env.get("suite_commit"), current_env.get("suite_commit")))
    if saved_output(reference_env):   # what a saved nccl-tests output did not print is unknown, not absent
        diff = {k: v for k, v in diff.items() if not (isinstance(v, list) and v and v[0] is None)}
    return diff


def saved_output(env: dict[str, Any]) -> bool:
    """A fingerprint of an imported nccl-tests output (contract.fingerprint IMPORTED_FIELDS): what the output
    printed (NCCL, CUDA, the GPUs, hosts), None for the rest; no rank ever read its host or world size."""
    machine = env.get("machine")
    return ((isinstance(machine, dict) and machine.get("source") == OUTPUT_MACHINE)
            or ("nccl_tests" in env and "host" not in env and "world_size" not in env))


def package_diff(ref: Any, cur: Any) -> dict[str, Any]:
    """`package.NAME: [reference's, now]` for each package whose installed version moved, read from
    both sides' lock_mismatches (the packages whose version differs from requirements.lock, as each
    rank saw them; a package a side does not list is at the lock's pin, which the other side names).
    The fields a comparison names on their own (torch, deepspeed, transformers, triton, liger-kernel,
    torchao) are left to them; nothing when either side did not read its packages."""
    if not isinstance(ref, dict) or not isinstance(cur, dict):
        return {}
    out: dict[str, Any] = {}
    for name in sorted(set(ref) | set(cur)):
        a, b = ref.get(name), cur.get(name)
        if name.lower().replace("-", "_") in COMPARED or not all(isinstance(x, dict) for x in (a or {}, b or {})):
            continue
        was = a.get("seen") if a else (b or {}).get("lock")
        now = b.get("seen") if b else (a or {}).get("lock")
        if was != now:
            out[f"package.{name}"] = [was, now]
    return out


def stack_diff(ref: Any, cur: Any) -> dict[str, Any]:
    """`stack.FIELD: [reference's, now]` for each of STACK_COMPARED that differs between the two records'
    training stacks (environment.stack: the compile mode, backend and path, the SDPA backend that ran,
    Liger's kernels, the FP8 linears; the host threads where both hold them), a list said as its items ('flash', 'flash, math'); nothing when
    either side has no stack (a record from before it was kept)."""
    if not isinstance(ref, dict) or not isinstance(cur, dict):
        return {}

    def said(value: Any) -> Any:
        return ", ".join(map(str, value)) if isinstance(value, list) else value
    return {f"stack.{k}": [said(ref.get(k)), said(cur.get(k))] for k in STACK_COMPARED
            if said(ref.get(k)) != said(cur.get(k)) and (k not in STACK_WHEN_BOTH or (k in ref and k in cur))}


def deepspeed_diff(ref: Any, cur: Any) -> dict[str, Any]:
    """`deepspeed.KEY: [reference's, now]` for each dotted key of the DeepSpeed JSON that differs, None where
    one side lacks it; nothing when either record has no environment.deepspeed_json (from before it was kept)."""
    if not isinstance(ref, dict) or not isinstance(cur, dict):
        return {}
    return {f"deepspeed.{k}": [ref.get(k), cur.get(k)] for k in sorted(set(ref) | set(cur)) if ref.get(k) != cur.get(k)}


def _load_diff(ref: Optional[dict[str, Any]], cur: Optional[dict[str, Any]], env: dict[str, Any]) -> dict[str, Any]:
    """load.other_cpus and load.steal_cpus (a virtual machine's hypervisor running its other guests),
    each when both sides measured it and it differs by a material share of the machine
    (probe.material_cpus); the host's exchange latency when it moved EXCHANGE_MOVED or more; the straggler."""
    cpus = hardware(env.get("machine") or {}).get("logical_cpus") or 1
    out: dict[str, Any] = {}
    for key in ("other_cpus", "steal_cpus"):
        a, b = (ref or {}).get(key), (cur or {}).get(key)
        if isinstance(a, (int, float)) and isinstance(b, (int, float)) and abs(a - b) >= material_cpus(cpus):
            out[f"load.{key}"] = [a, b]
    a, b = (ref or {}).get("pulse_exchange_us"), (cur or {}).get("pulse_exchange_us")
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and a > 0 and b > 0 and \
            max(a, b) / min(a, b) >= EXCHANGE_MOVED:
        out["load.pulse_exchange_us"] = [a, b]
    out.update(_straggler_diff((ref or {}).get("straggler"), (cur or {}).get("straggler")))
    return out


def _devices_diff(reference_env: dict[str, Any], current_env: dict[str, Any]) -> dict[str, Any]:
    """load.pulse_devices when one side's slowest device, every rank's read at once, lay beyond the pulse's noise
    below its fastest and the other's did not, or another device did (harness/pace.py slow_device); nothing where
    either side did not read them (a record from before, a collective sweep)."""
    if not all(((e.get("load") or {}).get("pulse_devices")) for e in (reference_env, current_env)):
        return {}

    def words(env: dict[str, Any]) -> str:
        slow = slow_device(env)
        return ("none slower than the noise" if slow is None else
                f"rank {slow[0]} ({slow[1]}) at {slow[2]:.2f}x the fastest")
    then, now = words(reference_env), words(current_env)
    return {"load.pulse_devices": [then, now]} if then != now else {}


def _straggler_diff(ref: Optional[dict[str, Any]], cur: Optional[dict[str, Any]]) -> dict[str, Any]:
    """load.straggler when a rank (a node) stood out on one side only, or another on each (harness/held_up.py
    straggler); nothing where either side did not measure it."""
    if not isinstance(ref, dict) or not isinstance(cur, dict):
        return {}
    if not (ref["stands_out"] or cur["stands_out"]):
        return {}
    if ref["stands_out"] and cur["stands_out"] and who(ref) == who(cur):
        return {}
    return {"load.straggler": [straggler_words(ref), straggler_words(cur)]}


def _commit_diff(ref: Optional[str], cur: Optional[str]) -> dict[str, Any]:
    """suite_commit when it differs (a commit, or the content hash of a copy of the suite outside its checkout:
    another hash is another suite), and how many commits lie between when both are commits this checkout has."""
    if not ref or not cur or ref == cur:
        return {}
    out: dict[str, Any] = {"suite_commit": [ref, cur]}
    if ref.startswith(CONTENT_PREFIX) or cur.startswith(CONTENT_PREFIX):
        return out   # a hash has no place in the history: no count
    between = commits_between(ref.removesuffix("-dirty"), cur.removesuffix("-dirty"))
    if between is not None:
        out["suite_commit.commits_between"] = between
    return out


@functools.lru_cache(maxsize=64)
def commits_between(old: str, new: str) -> Optional[int]:
    """`git rev-list --count old..new` in this checkout (None when it lacks either commit); asked once
    per pair (every verdict of a comparison names what changed)."""
    try:
        proc = subprocess.run(["git", "rev-list", "--count", f"{old}..{new}"], cwd=REPO_ROOT,
                              capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return int(proc.stdout) if proc.returncode == 0 and proc.stdout.strip().isdigit() else None


def hardware(machine: dict[str, Any]) -> dict[str, Any]:
    """The machine fields (benchmarks/node/machine.py) a "what changed" compares, node by node: those
    that set performance and stay put between runs; never load, current clocks or free memory."""
    cpu, gpus = machine.get("cpu") or {}, machine.get("gpus")
    mem = cpu.get("mem_total_gib")
    out = {"cpu_model": cpu.get("model"), "logical_cpus": cpu.get("logical_cpus"),
           "mem_total_gib": round(mem) if isinstance(mem, (int, float)) else None,   # kernels move it by MiBs
           "gpu_count": len(gpus) if isinstance(gpus, list) else None,
           "gpu_model": ", ".join(sorted({str(g.get("name")) for g in gpus})) if gpus else None}
    ident = cpu.get("id")
    if isinstance(ident, dict):   # only where kept: a record from before says nothing of them (_by_node)
        out.update({"cpu_kind": cpu_kind(cpu), **{f"cpu_{k}": ident.get(k) for k in ("stepping", "microcode")}})
    return out


def _node_machines(env: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """{host: machine} of every node; a record from before `nodes` has rank 0's machine only."""
    if env.get("nodes"):
        return {n["host"]: n.get("machine") or {} for n in env["nodes"]}
    return {env.get("host") or "?": env["machine"]} if env.get("machine") else {}


def _per_host(links: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """{"host/iface": rate} -> {host: {iface: rate}} (a host name never holds a '/')."""
    out: dict[str, dict[str, Any]] = {}
    for key, rate in links.items():
        host, _, iface = key.partition("/")
        out.setdefault(host, {})[iface] = rate
    return out


def _by_node(prefix: str, sep: str, ref: dict[str, dict[str, Any]], cur: dict[str, dict[str, Any]]) -> dict[str, list]:
    """{f"{prefix}.{host}{sep}{field}": [reference, now]} for each value that differs. On other
    hosts than the reference's (another allocation) host is '*' and the values are the distinct
    values over the nodes, so that identical nodes under new names are no change."""
    if set(ref) == set(cur):   # a field one side never kept (the CPU's id before it was read) says nothing
        keys = sorted({(h, f) for h in ref for f in ref[h] if f in cur[h]})
        return {f"{prefix}.{h}{sep}{f}": [ref[h].get(f), cur[h].get(f)] for h, f in keys
                if ref[h].get(f) != cur[h].get(f)}

    def spread(side: dict[str, dict[str, Any]], f: str) -> list:
        return sorted({values.get(f) for values in side.values()},
                      key=lambda v: (v is None, type(v).__name__, 0 if v is None else v))

    fields = sorted({f for values in ref.values() for f in values} & {f for values in cur.values() for f in values})
    spreads = {f: [spread(ref, f), spread(cur, f)] for f in fields}
    return {f"{prefix}.*{sep}{f}": pair for f, pair in spreads.items() if pair[0] != pair[1]}
