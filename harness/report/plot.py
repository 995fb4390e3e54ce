"""Bus-bandwidth plots: busbw (GB/s, 1e9 B/s, nccl-tests' definition) against message size.

matplotlib is imported inside the function (it costs ~0.5 s) and always renders with Agg: no
display, no network, the same PNG on a laptop and a cluster node.
"""
from __future__ import annotations

import io
from pathlib import Path

from ..atomic import write_bytes_atomic
from ..collectives import size_label

_MAX_TICKS = 16


def ceiling_lines(ceilings_gbps: dict[str, float]) -> list[tuple[str, float]]:
    """(label, GB/s) of each declared link bandwidth worth drawing, highest first; a zero (not
    declared, e.g. inter-node on a single-node platform) is left out."""
    return [(f"{name} {bw:g} GB/s", bw)
            for name, bw in sorted(ceilings_gbps.items(), key=lambda kv: -kv[1]) if bw > 0]


def _tick_exponents(lo: int, hi: int) -> list[int]:
    """Powers of two covering [lo, hi], every 1st, 2nd, 5th or 10th so that 1K, 1M, 1G stay on
    the axis whenever a step of 1 or 2 is enough."""
    for step in (1, 2, 5, 10):
        ticks = [e for e in range(lo, hi + 1) if e % step == 0]
        if len(ticks) <= _MAX_TICKS:
            return ticks
    return ticks


def busbw_plot(series: dict[str, list[tuple[int, float]]], path: Path, *, title: str,
               ceilings_gbps: dict[str, float]) -> Path:
    """One line per collective of (size_bytes, busbw_gbps) points, on a log2 size axis, with each
    non-zero declared link bandwidth as a labelled horizontal ceiling; written atomically as PNG."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib.figure import Figure
    from matplotlib.ticker import FixedLocator, NullLocator

    sizes = [s for points in series.values() for s, _ in points]
    if any(s <= 0 for s in sizes):
        raise ValueError(f"message sizes must be > 0 bytes for a log axis, got {min(sizes)}")
    fig = Figure(figsize=(10, 5.5), dpi=120, layout="constrained")
    ax = fig.add_subplot()
    peak = 0.0
    for name, points in series.items():
        pts = sorted(points)
        if pts:
            ax.plot([s for s, _ in pts], [b for _, b in pts], marker="o", markersize=4, label=name)
            peak = max(peak, max(b for _, b in pts))
    ceilings = ceiling_lines(ceilings_gbps)
    for i, (label, bw) in enumerate(ceilings):
        ax.axhline(bw, color=("black", "dimgray", "gray")[i % 3], linestyle=("--", ":", "-.")[i % 3],
                   linewidth=1.2, label=label)
        ax.annotate(label, xy=(0.99, bw), xycoords=("axes fraction", "data"), xytext=(0, 3),
                    textcoords="offset points", ha="right", fontsize=9)
    ax.set_xscale("log", base=2)
    if sizes:
        exps = _tick_exponents(min(sizes).bit_length() - 1, (max(sizes) - 1).bit_length())
        ax.xaxis.set_major_locator(FixedLocator([2.0 ** e for e in exps]))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xticklabels([size_label(2 ** e) for e in exps])
        ax.set_xlim(min(sizes) / 1.4, max(sizes) * 1.4)
    ax.set_ylim(0, max([peak, *(bw for _, bw in ceilings), 1e-3]) * 1.12)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("bus bandwidth (GB/s, 1 GB = 1e9 B)")
    ax.set_title(title)
    ax.grid(True, which="major", alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9)

    png = io.BytesIO()
    fig.savefig(png, format="png")  # rendered fully before anything is written
    return write_bytes_atomic(Path(path), png.getvalue())
