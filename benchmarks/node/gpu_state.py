"""Each GPU's machine state as `nvidia-smi -q` reports it (power limits, clocks and the reasons
they are held down, PCIe link, ECC errors, persistence and MIG modes) and, in words, how two
states differ (`state_differences`) or what is wrong with one alone (`state_problems`).

`nvidia-smi -q` prints an indented "Key : Value" tree whose keys move between drivers ('Clocks
Throttle Reasons' -> 'Clocks Event Reasons', 'Power Readings' > 'Enforced Power Limit' -> 'GPU Power
Readings' > 'Current Power Limit', 'Power Draw' -> 'Average Power Draw', volatile ECC 'Double Bit'
-> 'DRAM Uncorrectable', ...); `parse_query` reads the tree generically and takes each field from
the first spelling the text has. Unsaid or N/A is None. Stdlib only; no torch.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Optional

from benchmarks.node.network import run_quiet

QUERY_TIMEOUT_S = 20.0
KEYS = ("name", "bus_id", "persistence_mode", "mig_mode_current", "sm_clock_mhz", "sm_clock_max_mhz",
        "graphics_clock_mhz", "mem_clock_mhz", "power_draw_w", "power_limit_w", "power_limit_default_w",
        "power_limit_max_w", "throttle_reasons_active", "ecc_mode_current", "ecc_volatile_uncorrected",
        "pcie_gen_current", "pcie_gen_max", "pcie_gen_host_max", "pcie_width_current", "pcie_width_max",
        "temperature_c", "gpu_util_pct")
"""Every key of a parsed GPU. power_limit_w is the limit in force ('Current' / 'Enforced Power
Limit'; 'Power Limit' only where neither is printed); pcie_gen_max is the device's own max ('Device
Max', else 'Max'); throttle_reasons_active is None where the text has no reasons section."""
BENIGN_REASONS = ("Idle", "Applications Clocks Setting")  # active, yet nothing slows the GPU
BUSY_CLOCK_FRACTION = 0.9     # an SM clock at or above this fraction of its max: the GPU works
CLOCK_CHANGE_FRACTION = 0.1   # SM clocks closer than this (relative) are the same clock
REASON_NAMES = {n.lower(): n for n in (
    "Idle", "Applications Clocks Setting", "SW Power Cap", "HW Slowdown", "HW Thermal Slowdown",
    "HW Power Brake Slowdown", "Sync Boost", "SW Thermal Slowdown", "Display Clock Setting")}
REASON_NAMES.update({"gpu idle": "Idle", "display clocks setting": "Display Clock Setting"})
POWER = "GPU Power Readings|Power Readings > "
GEN = "PCI > GPU Link Info > PCIe Generation > "
WIDTH = "PCI > GPU Link Info > Link Width > "
FIELDS = {  # key: (path, 'A|B > C|D', alternatives tried in order; type)
    "name": ("Product Name", str), "bus_id": ("PCI > Bus Id", str),
    "persistence_mode": ("Persistence Mode", str), "mig_mode_current": ("MIG Mode > Current", str),
    "sm_clock_mhz": ("Clocks > SM", int), "sm_clock_max_mhz": ("Max Clocks > SM", int),
    "graphics_clock_mhz": ("Clocks > Graphics", int), "mem_clock_mhz": ("Clocks > Memory", int),
    "power_draw_w": (POWER + "Average Power Draw|Power Draw|Instantaneous Power Draw", float),
    "power_limit_w": (POWER + "Current Power Limit|Enforced Power Limit|Power Limit", float),
    "power_limit_default_w": (POWER + "Default Power Limit", float),
    "power_limit_max_w": (POWER + "Max Power Limit", float), "ecc_mode_current": ("ECC Mode > Current", str),
    "pcie_gen_current": (GEN + "Current|Device Current", int), "pcie_gen_max": (GEN + "Device Max|Max", int),
    "pcie_gen_host_max": (GEN + "Host Max", int),
    "pcie_width_current": (WIDTH + "Current", int), "pcie_width_max": (WIDTH + "Max", int),
    "temperature_c": ("Temperature > GPU Current Temp", int), "gpu_util_pct": ("Utilization > Gpu", int),
}
_LINE = re.compile(r"^(?P<indent> *)(?P<key>\S.*?)(?:\s+:(?P<value>.*))?$")
_GPU = re.compile(r"^GPU [0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f]$")
_NUMBER = re.compile(r"^[-+]?\d+(?:\.\d+)?")
_UNKNOWN = {"", "n/a", "[n/a]", "not found", "unknown error", "[unknown error]", "not supported"}


@dataclass
class _Node:
    key: str
    value: Optional[str] = None
    children: list[_Node] = field(default_factory=list)

    def child(self, names: str) -> Optional[_Node]:
        """The first child named one of 'A|B|C' (case and spacing ignored), tried in that order."""
        for name in (" ".join(n.split()).lower() for n in names.split("|")):
            found = next((c for c in self.children if c.key.lower() == name), None)
            if found is not None:
                return found
        return None


def _tree(text: str) -> _Node:
    root = _Node("")
    stack = [(-1, root)]
    for line in (raw.expandtabs(4).rstrip() for raw in text.splitlines()):
        match = _LINE.match(line) if line.strip() else None
        if match is None:
            continue
        value = None if match["value"] is None else match["value"].strip()
        node, indent = _Node(" ".join(match["key"].split()), value), len(match["indent"])
        while stack[-1][0] >= indent:
            stack.pop()
        stack[-1][1].children.append(node)
        stack.append((indent, node))
    return root


def _gpu_nodes(node: _Node) -> list[_Node]:
    """The 'GPU 00000000:xx:yy.z' sections, wherever the text's indentation put them."""
    return [g for c in node.children for g in ([c] if _GPU.match(c.key) and c.value is None else _gpu_nodes(c))]


def _pick(node: Optional[_Node], path: str) -> Optional[str]:
    """The first known value along 'A|B > C|D'."""
    step, _, rest = path.partition(" > ")
    for name in step.split("|"):
        c = node.child(name) if node is not None else None
        if c is not None and not rest:
            found = None if (c.value or "").strip().lower() in _UNKNOWN else c.value.strip()
        else:
            found = _pick(c, rest) if c is not None else None
        if found is not None:
            return found
    return None


def _convert(value: Optional[str], kind: type) -> Any:
    """'400.00 W' -> 400.0, '16x' -> 16, text stays text; None for no number."""
    if kind is str or value is None:
        return value
    match = _NUMBER.match(value)
    return kind(float(match.group())) if match else None


def _reasons(gpu: _Node) -> Optional[list[str]]:
    section = gpu.child("Clocks Event Reasons|Clocks Events Reasons|Clocks Throttle Reasons")
    if section is None or not section.children:
        return None
    active, todo = [], list(section.children)
    while todo:                                 # depth first, in the text's order
        node = todo.pop(0)
        if (node.value or "").lower() == "active":
            active.append(REASON_NAMES.get(node.key.lower(), node.key))
        todo[:0] = node.children
    return active


def _ecc_volatile_uncorrected(gpu: _Node) -> Optional[int]:
    """Sum of the volatile uncorrectable counts: 'Double Bit' > 'Total' (else its parts) on old
    drivers, every '... Uncorrectable ...' count on newer ones; None if none is a number."""
    errors = gpu.child("ECC Errors")
    volatile = errors.child("Volatile") if errors is not None else None
    counts: list[Optional[int]] = []
    for c in volatile.children if volatile is not None else []:
        if c.key.lower() == "double bit":
            total = _convert(_pick(c, "Total"), int)
            counts += [total] if total is not None else [_convert(p.value, int) for p in c.children]
        elif "uncorrectable" in c.key.lower():
            counts.append(_convert(c.value, int))
    known = [n for n in counts if n is not None]
    return sum(known) if known else None


def _gpu(node: _Node) -> dict[str, Any]:
    gpu = {key: _convert(_pick(node, path), kind) for key, (path, kind) in FIELDS.items()}
    gpu["bus_id"] = gpu["bus_id"] or node.key.split(" ", 1)[1]
    gpu["throttle_reasons_active"] = _reasons(node)
    gpu["ecc_volatile_uncorrected"] = _ecc_volatile_uncorrected(node)
    return {key: gpu[key] for key in KEYS}


def parse_query(text: str) -> list[dict[str, Any]]:
    """`nvidia-smi -q` text (all of it, or `-d` parts of it) -> one dict per GPU with KEYS, in
    the text's order; [] for text with no GPU section."""
    return [_gpu(node) for node in _gpu_nodes(_tree(text or ""))]


def query() -> Optional[list[dict[str, Any]]]:
    """This machine's GPUs (parse_query of `nvidia-smi -q`); None if nvidia-smi is missing,
    fails or runs past QUERY_TIMEOUT_S."""
    text = run_quiet(["nvidia-smi", "-q"], timeout_s=QUERY_TIMEOUT_S)
    return None if text is None else parse_query(text)


def _slowing(gpu: dict[str, Any]) -> list[str]:
    return [r for r in gpu.get("throttle_reasons_active") or [] if r not in BENIGN_REASONS]


def _idle(gpu: dict[str, Any]) -> bool:
    return "Idle" in (gpu.get("throttle_reasons_active") or [])


def _busy(gpu: dict[str, Any]) -> bool:
    """Working now: not Idle, and utilization above 0 or the SM clock near its max."""
    sm, top = gpu.get("sm_clock_mhz"), gpu.get("sm_clock_max_mhz")
    return not _idle(gpu) and bool(gpu.get("gpu_util_pct") or (sm and top and sm >= BUSY_CLOCK_FRACTION * top))


def _link(gen: Optional[int], width: Optional[int]) -> str:
    return " ".join(s for s in (gen and f"Gen{gen}", width and f"x{width}") if s)


def _differ(a: Any, b: Any) -> bool:
    return a is not None and b is not None and a != b


def _gpu_differences(ref: dict[str, Any], cur: dict[str, Any]) -> list[str]:
    out = [f"GPU model {cur['name']} vs {ref['name']}"] if _differ(cur.get("name"), ref.get("name")) else []
    limit, default = cur.get("power_limit_w"), cur.get("power_limit_default_w")
    if _differ(limit, ref.get("power_limit_w")):
        capped = f" (capped below its default {default:g} W)" if default and limit < default else ""
        out.append(f"GPU power limit {limit:g} vs {ref['power_limit_w']:g} W{capped}")
    new = [r for r in _slowing(cur) if r not in _slowing(ref)]
    gone = [r for r in _slowing(ref) if r not in _slowing(cur)]
    sm, sm_ref = cur.get("sm_clock_mhz"), ref.get("sm_clock_mhz")
    moved = _differ(sm, sm_ref) and abs(sm - sm_ref) > CLOCK_CHANGE_FRACTION * max(sm, sm_ref)
    known = sm is not None and sm_ref is not None
    worth = new or gone or (moved and not _idle(cur) and not _idle(ref))
    parts = [f"SM clock {sm} vs {sm_ref} MHz"] if known and worth else []
    parts += [f"throttled now: {', '.join(new)}"] if new else []
    parts += [f"throttled in the reference: {', '.join(gone)}"] if gone else []
    out += ["; ".join(parts)] if parts else []
    gen_counts = _busy(cur) and _busy(ref)      # idle links drop their generation
    gen, width, gen_ref, width_ref = (d.get(k) for d in (cur, ref) for k in ("pcie_gen_current", "pcie_width_current"))
    if _differ(width, width_ref) or (gen_counts and _differ(gen, gen_ref)):
        gen, gen_ref, top_gen = (gen, gen_ref, cur.get("pcie_gen_max")) if gen_counts else (None, None, None)
        top = f" (trained below its max {_link(top_gen, cur.get('pcie_width_max'))})"
        out.append(f"PCIe link {_link(gen, width)} vs {_link(gen_ref, width_ref)}"
                   + (top if _link_below(cur, gen_counts) else ""))
    for key, label in (("ecc_volatile_uncorrected", "ECC volatile uncorrected errors"),
                       ("ecc_mode_current", "ECC mode"), ("persistence_mode", "persistence mode"),
                       ("mig_mode_current", "MIG mode")):
        out += [f"{label} {cur[key]} vs {ref[key]}"] if _differ(cur.get(key), ref.get(key)) else []
    return out


def _link_below(gpu: dict[str, Any], gen_counts: bool) -> bool:
    gen, top_gen, width, top_width = (gpu.get(k) for k in (
        "pcie_gen_current", "pcie_gen_max", "pcie_width_current", "pcie_width_max"))
    return bool((width and top_width and width < top_width) or (gen_counts and gen and top_gen and gen < top_gen))


def state_differences(reference: list[dict[str, Any]], current: list[dict[str, Any]]) -> list[str]:
    """The machine-state differences that can explain a slower GPU, each worded 'current vs
    reference' (GPU i against GPU i, prefixed 'GPU i: ' when there are several): GPU count, model,
    power limit, SM clock with the throttle reasons that appeared or went, PCIe link, volatile
    uncorrected ECC errors, ECC, persistence and MIG modes. A fact either side does not know is
    not compared; nor are the SM clocks of idle GPUs, nor PCIe generations unless both GPUs are
    busy (idle GPUs lower both to save power). [] when nothing differs."""
    out = [f"GPU count {len(current)} vs {len(reference)}"] if len(current) != len(reference) else []
    several = max(len(reference), len(current)) > 1
    for i, (ref, cur) in enumerate(zip(reference, current)):
        out += [f"GPU {i}: {m}" if several else m for m in _gpu_differences(ref, cur)]
    return out


def _gpu_problems(gpu: dict[str, Any]) -> list[str]:
    out = []
    limit, default = gpu.get("power_limit_w"), gpu.get("power_limit_default_w")
    if limit is not None and default is not None and limit < default:
        out.append(f"GPU power limit {limit:g} W, below its default {default:g} W")
    if _slowing(gpu):
        sm, top = gpu.get("sm_clock_mhz"), gpu.get("sm_clock_max_mhz")
        clock = f" (SM clock {sm} of max {top} MHz)" if sm is not None and top is not None else ""
        out.append(f"throttled: {', '.join(_slowing(gpu))}{clock}")
    gen, top_gen, host = gpu.get("pcie_gen_current"), gpu.get("pcie_gen_max"), gpu.get("pcie_gen_host_max")
    if _link_below(gpu, _busy(gpu)):
        if not _busy(gpu) and gen and top_gen and gen < top_gen:   # idle and downshifted: gen says nothing
            gen = top_gen = None
        host_note = f" (the host allows Gen{host})" if gen and top_gen and host and host <= gen < top_gen else ""
        out.append(f"PCIe link {_link(gen, gpu.get('pcie_width_current'))}, below its max "
                   f"{_link(top_gen, gpu.get('pcie_width_max'))}{host_note}")
    errors = gpu.get("ecc_volatile_uncorrected")
    out += [f"{errors} volatile uncorrected ECC errors"] if errors else []
    return out


def state_problems(current: list[dict[str, Any]]) -> list[str]:
    """What is wrong with these GPUs on their own (prefixed 'GPU i: ' when there are several): a
    power limit below the default, active clock reasons other than BENIGN_REASONS, a PCIe link
    below its max, volatile uncorrected ECC errors. A narrower link is always reported; a lower
    PCIe generation only while the GPU is busy (utilization above 0 or the SM clock near its max,
    and not Idle), because idle GPUs legitimately drop their link generation to save power."""
    several = len(current) > 1
    return [f"GPU {i}: {m}" if several else m for i, gpu in enumerate(current) for m in _gpu_problems(gpu)]
