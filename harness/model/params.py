"""The performance model's global parameters: the few numbers it cannot derive from a
configuration, each with its value and where it comes from. FITTED ones were fitted once to the
published SC'25 PMBS tables by reference_results/sources/sc25-pmbs/fit_model.py (rerun it to
refit; `python -m harness model --validate` reports how well they do with every published cell
held out of the efficiency calibration). DECLARED ones come from a cited figure, not a fit.

They apply to GPU platforms (device cuda). On the cpu platform the collectives are gloo's,
synchronous and measured (busbw curves), and ZeRO-3's bookkeeping is part of the measured
per-stage efficiency, so none of them is used there.
Pure data, no I/O.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .memory import FRAGMENTATION_FRACTION


@dataclass(frozen=True)
class Param:
    name: str
    value: float
    unit: str
    kind: str
    """fitted | declared"""
    source: str


@dataclass(frozen=True)
class ModelParams:
    fabric_efficiency: dict[str, float] = field(default_factory=lambda: {"ib": 1.0, "roce": 0.15, "tcp": 0.15})
    """Achieved fraction of the declared per-direction inter-node bandwidth (platform.inter_node_bw_gbps)
    for the large collectives of training, per fabric. FITTED on the published Model 1 and Model 2
    tables (every point of a grid, each scored by leave-one-out): InfiniBand its line rate (1.0,
    the grid's bound: the ib-a100 cells need no more than 200 GB/s per node), RoCE 0.15 (30 GB/s
    per node): the roce-a100 cells run 3-25 % slower than
    ib-a100's on the same GPUs and NVLink, most where ZeRO-3 gathers every layer on demand.
    tcp: not fitted (no published cell), RoCE's."""
    zero3_fetch_overhead_s: float = 0.09
    """Seconds per ZeRO-3 collective call (each prefetched parameter gather and each gradient
    reduce-scatter bucket) that no computation hides: DeepSpeed's per-module fetch, release and
    bookkeeping around the NCCL call. FITTED on the published Model 2 ZeRO-3 cells (2-3x slower
    than ZeRO-1 at the same micro-batch, an overhead that scales with micro-steps, not bytes)."""
    intra_node_latency_s: float = 10e-6
    """Latency of one collective inside a node (NVLink). DECLARED: the order of nccl-tests'
    small-message times within a DGX node (about 10 us); not fitted."""
    inter_node_latency_s: float = 30e-6
    """Latency of one collective across nodes (IB/RoCE). DECLARED: the order of nccl-tests'
    small-message times between two nodes (tens of us); not fitted."""
    outliers: tuple[tuple[str, str, int, int], ...] = (("roce-a100", "llama-8b-kd", 2, 64),)
    """Published cells never used to calibrate another (platform, benchmark, ZeRO stage, micro-batch):
    roce-a100 ZeRO-2 mb 64 (25.74 samples/s) is 2.4x below ib-a100's 62.13 and 2.3x below its own
    ZeRO-1 at the same micro-batch, where every other roce-a100 cell is within 25 % of ib-a100's:
    an outlier of the paper's own. It is still predicted and reported."""

    def table(self) -> list[Param]:
        """Every parameter, for printing."""
        fit = "reference_results/sources/sc25-pmbs/fit_model.py on the published Model 1 and Model 2 tables"
        out = [Param(f"fabric_efficiency.{k}", v, "x inter_node_bw_gbps", "fitted" if k != "tcp" else "assumed",
                     fit if k != "tcp" else "no published tcp cell: RoCE's value") for k, v in self.fabric_efficiency.items()]
        out += [Param("zero3_fetch_overhead_s", self.zero3_fetch_overhead_s, "s per ZeRO-3 collective call", "fitted",
                      fit + " (ZeRO-3 cells)"),
                Param("memory_model.FRAGMENTATION_FRACTION", FRAGMENTATION_FRACTION, "of device memory", "fitted",
                      fit + " (the OOM boundary: any value in about 0.065-0.187 calls all 34 cells)"),
                Param("intra_node_latency_s", self.intra_node_latency_s, "s per collective", "declared",
                      "order of nccl-tests small-message time within a node"),
                Param("inter_node_latency_s", self.inter_node_latency_s, "s per collective", "declared",
                      "order of nccl-tests small-message time across nodes")]
        return out


PARAMS = ModelParams()
"""The shipped values."""

IDEAL = ModelParams(fabric_efficiency={"ib": 1.0, "roce": 1.0, "tcp": 1.0}, zero3_fetch_overhead_s=0.0,
                    intra_node_latency_s=0.0, inter_node_latency_s=0.0)
"""No fitted term and no latency: the model's pure formulas (bytes x factor / declared bandwidth),
what the unit tests check the formulas with."""
