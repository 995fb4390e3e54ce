"""How a collective runs at scale on a declared topology: the algorithm and protocol NCCL would pick
and its time, from NCCL's own tuning model; and how a measured gloo curve carries to another
number of ranks. Pure.

NCCL (src/graph/tuning.cc of NVIDIA/nccl at 5067397, 2026-06-11: ncclTopoTuneModel, which fills
the per-algorithm bandwidths and latencies, and ncclTopoGetAlgoTime, which NCCL minimises per call):
- time = latency + bytes / algbw, the algorithm x protocol of least time is what NCCL launches.
- ring, any op: latency = base + (nsteps - nInterSteps) x max(intra-hop, 3 x net overhead) +
  nInterSteps x net-hop, nsteps = 2(n-1) for all_reduce, n-1 for all_gather / reduce_scatter,
  nInterSteps = 2(nodes-1) resp. nodes-1; a multi-node Simple all_reduce's latency x 1.4 (A100
  and newer: "plateau effect of ring"). Bandwidth: the bus bandwidth, so a ring's busbw holds with
  node count and only its latency grows (linearly in ranks).
- tree (all_reduce only, here across nodes): latency = base + 2 x ((gpus/node - 1) x intra-hop +
  log2(nodes) x net-hop); bandwidth 0.92 x the bus bandwidth (Simple), x 0.5 to algbw (the whole
  buffer goes up and down the tree), and x NCCL's static per-size correction (0.5-0.9 for 4 KiB to
  64 MiB). So the tree wins once latency matters: many nodes, mid-size messages.
- all_gather and reduce_scatter have no tree: a ring over every rank, no hierarchy (PAT only with
  one GPU per node, NVLS / CollNet need switch support the platforms do not declare).
- Protocols: Simple, LL128 (0.92 of the bandwidth, lower latency), LL (0.5 on rings, 1/3.8 on
  trees), each under NCCL's caps per architecture (LL's whole bandwidth, LL128's and the tree's per
  channel), with 2 channels per rail.
- Rails: a ring or tree crossing nodes is bounded by the node's NICs together (one channel pair per
  rail, rail-aligned, NCCL's default placement): the declared inter_node_bw_gbps per node. The rail
  count sets the channels (2 per rail), which only decides where the ring's plateau applies.

gloo (the cpu platforms): its all_reduce and all_gather are rings; a curve measured at m ranks is
carried to n ranks by the ring's alpha-beta form, t = a x steps + b x bytes x factor (a, b fitted
to the measured curve itself): the latency part grows with the steps, the bandwidth part with
nccl-tests' factor, so busbw holds for large messages and falls for small ones. Its broadcast is a
binomial tree: time x ceil(log2 n) / ceil(log2 m).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..collectives import busbw_factor

NCCL_SOURCE = "NCCL's tuning model (src/graph/tuning.cc, NVIDIA/nccl 5067397)"
PROTOCOLS = ("LL", "LL128", "Simple")
BASE_LATENCY_US = {"tree": {"LL": 6.8, "LL128": 14.0, "Simple": 8.4},
                   "ring": {"LL": 6.6, "LL128": 14.0, "Simple": 8.4}}
"""tuning.cc baseLatencies, us."""
HW_LATENCY_US = {"nvlink": {"tree": {"LL": 0.6, "LL128": 1.25, "Simple": 4.0}, "ring": {"LL": 0.6, "LL128": 1.9, "Simple": 3.4}},
                 "pci": {"tree": {"LL": 1.0, "LL128": 1.9, "Simple": 4.0}, "ring": {"LL": 1.0, "LL128": 2.5, "Simple": 5.7}},
                 "net": {"tree": {"LL": 5.0, "LL128": 8.5, "Simple": 14.0}, "ring": {"LL": 2.7, "LL128": 4.0, "Simple": 14.0}}}
"""tuning.cc hwLatencies per hop, us (NVLINK, PCI, NET)."""
NET_OVERHEAD_US = 1.0
"""getNetOverhead on x86 Intel (2.0 on AMD), x 3 for Simple: the floor of a multi-node ring's intra-node hop."""
TREE_CORRECTION = {
    "LL": (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0, 1.0),
    "LL128": (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0, 1.0),
    "Simple": (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9, .9)}
"""tuning.cc treeCorrectionFactor: the tree all_reduce's bandwidth by log2(bytes / 64)."""
RING_BW = {"LL": 0.5, "LL128": 0.92, "Simple": 1.0}
TREE_BW = {"LL": 1.0 / 3.8, "LL128": 120.0 / 128.0, "Simple": 0.92}
LL_MAX_GBPS = {"ampere": (87.7, 39.0, 20.4), "hopper": (141.0, 39.0, 20.4)}
"""tuning.cc llMaxBws: LL's whole bandwidth, by 1 / 2 / more nodes (one node: the GPU's row; across
nodes: the CPU's, Intel's here)."""
PER_CHANNEL_MAX_GBPS = {  # tuning.cc perChMax*Bws, by 1 / 2 / more nodes
    "ampere": {("ring", "LL128"): (20.0, 20.0, 20.0), ("tree", "LL128"): (20.0, 20.0, 20.0),
               ("tree", "Simple"): (24.0, 23.6, 17.8)},
    "hopper": {("ring", "LL128"): (36.7, 36.7, 36.7), ("tree", "LL128"): (36.7, 36.7, 29.0),
               ("tree", "Simple"): (38.7, 41.4, 36.0)}}


def _cap(t: "Topology", algorithm: str, proto: str) -> float:
    """The bus bandwidth NCCL's model allows the algorithm x protocol at most, GB/s."""
    col = min(t.nodes, 3) - 1
    if proto == "LL":
        return LL_MAX_GBPS[t.arch][col]
    per = PER_CHANNEL_MAX_GBPS[t.arch].get((algorithm, proto))
    return math.inf if per is None else t.channels * per[col]


@dataclass(frozen=True)
class Topology:
    """What NCCL's model needs of a platform."""
    nodes: int
    gpus_per_node: int
    busbw_gbps: float
    """The bus bandwidth a ring reaches: intra-node on one node, else min(intra, NICs x fabric)."""
    intra: str = "nvlink"
    """nvlink | pci: the intra-node hop."""
    rails: int = 0
    """NICs per node (0: one per GPU)."""
    arch: str = "hopper"
    """ampere | hopper: which row of NCCL's per-architecture caps."""

    @property
    def ranks(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def channels(self) -> int:
        return 2 * (self.rails or self.gpus_per_node)


@dataclass(frozen=True)
class Choice:
    algorithm: str
    protocol: str
    time_s: float
    latency_s: float

    @property
    def name(self) -> str:
        return f"{self.algorithm}/{self.protocol}"


def _log2i(x: int) -> int:
    return max(x, 1).bit_length() - 1


def _ring(op: str, size: int, t: Topology, proto: str) -> Choice:
    n, nodes = t.ranks, t.nodes
    nsteps = 2 * (n - 1) if op == "all_reduce" else n - 1
    inter_steps = 0 if nodes == 1 else (2 * (nodes - 1) if op == "all_reduce" else nodes - 1)
    hop = HW_LATENCY_US["net" if nodes > 1 else t.intra]["ring"][proto]
    intra = HW_LATENCY_US[t.intra]["ring"][proto]
    if nodes > 1:
        intra = max(intra, NET_OVERHEAD_US * (3 if proto == "Simple" else 1))
    # with one GPU per node, NCCL takes the tree's net latency for the inter-node hop
    net = HW_LATENCY_US["net"]["tree" if t.gpus_per_node == 1 else "ring"][proto]
    lat = BASE_LATENCY_US["ring"][proto] + ((nsteps - inter_steps) * intra + inter_steps * net if nodes > 1
                                            else nsteps * hop)
    if proto == "Simple" and nodes > 1 and op == "all_reduce" and size / (t.channels * n) >= 64:
        lat *= 1.4
    algbw = min(t.busbw_gbps * RING_BW[proto], _cap(t, "ring", proto)) / busbw_factor(op, n)
    return Choice("ring", proto, lat * 1e-6 + size / (algbw * 1e9), lat * 1e-6)


def _tree(size: int, t: Topology, proto: str) -> Choice:
    net = HW_LATENCY_US["net"]["tree"][proto]
    intra = HW_LATENCY_US[t.intra]["tree"][proto]
    lat = BASE_LATENCY_US["tree"][proto] + 2 * ((t.gpus_per_node - 1) * intra + _log2i(t.nodes) * net)
    k = _log2i(size >> 6)
    corr = TREE_CORRECTION[proto][k] if 0 <= k < 23 else 1.0
    algbw = min(t.busbw_gbps * TREE_BW[proto], _cap(t, "tree", proto)) * 0.5 * corr
    return Choice("tree", proto, lat * 1e-6 + size / (algbw * 1e9), lat * 1e-6)


def nccl_choice(op: str, size: int, t: Topology) -> Choice:
    """The algorithm x protocol of least modelled time for one message of `size` bytes (nccl-tests'
    size), as NCCL picks it; broadcast and other ops run as rings."""
    options = [_ring(op, size, t, p) for p in PROTOCOLS]
    if op == "all_reduce" and t.nodes > 1:
        options += [_tree(size, t, p) for p in PROTOCOLS]
    return min(options, key=lambda c: c.time_s)


# ---- a measured (gloo) curve at another number of ranks -------------------------------------------

def ring_steps(op: str, n: int) -> int:
    return 2 * (n - 1) if op == "all_reduce" else max(n - 1, 1)


def alpha_beta(points: tuple[tuple[int, float], ...], op: str, n: int) -> tuple[float, float]:
    """(a, b) of t(S) = a x steps(n) + b x S x factor(n) fitted to a measured busbw curve at n ranks
    (time from busbw: S x factor / busbw), least squares on relative error; a, b >= 0."""
    f, st = busbw_factor(op, n), ring_steps(op, n)
    rows = [(st, s * f, s * f / (bw * 1e9)) for s, bw in points]
    # minimise sum((a x u + b x v) / t - 1)^2: normal equations of the weighted problem
    suu = sum((u / t) ** 2 for u, _, t in rows)
    svv = sum((v / t) ** 2 for _, v, t in rows)
    suv = sum(u * v / t ** 2 for u, v, t in rows)
    su = sum(u / t for u, _, t in rows)
    sv = sum(v / t for _, v, t in rows)
    det = suu * svv - suv ** 2
    if det <= 0:
        return 0.0, 1.0 / (max(bw for _, bw in points) * 1e9)
    a, b = (su * svv - sv * suv) / det, (sv * suu - su * suv) / det
    if a < 0:
        a, b = 0.0, sv / svv
    if b <= 0:
        b = 1.0 / (max(bw for _, bw in points) * 1e9)
    return a, b


def carried_points(points: tuple[tuple[int, float], ...], op: str, m: int, n: int,
                   gloo: bool = False) -> tuple[tuple[int, float], ...]:
    """A busbw curve measured at m ranks, carried to n ranks as a ring: each point's measured time
    t_m(S) -> t_m(S) x factor(n)/factor(m) + a x (steps(n) - steps(m) x factor(n)/factor(m)), i.e.
    the bandwidth part scaled by the factor and the latency part by the steps (alpha_beta's a).
    gloo's broadcast is no ring but a binomial tree: ceil(log2 n) rounds of whole-buffer sends, so its
    time grows as those rounds (t_m x rounds(n)/rounds(m); measured here: 0.12, 0.06, 0.06 GB/s on 2,
    3, 4 nodes)."""
    if m == n:
        return points
    if gloo and op == "broadcast":
        rounds_m, rounds_n = (max(1, math.ceil(math.log2(k))) for k in (m, n))
        return tuple((s, bw * rounds_m / rounds_n) for s, bw in points)
    a, _ = alpha_beta(points, op, m)
    rf = busbw_factor(op, n) / busbw_factor(op, m)
    extra = a * (ring_steps(op, n) - ring_steps(op, m) * rf)
    out = []
    for s, bw in points:
        t_n = (s * busbw_factor(op, m) / (bw * 1e9)) * rf + extra
        out.append((s, s * busbw_factor(op, n) / t_n / 1e9))
    return tuple(out)
