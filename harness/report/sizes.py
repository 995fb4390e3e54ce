"""A collective's busbw per message size, now against the reference's (`compare --sizes`): the figures
behind a verdict judged by size (harness/verdict/by_size.py), so a team sees which sizes moved."""
from __future__ import annotations

from ..verdict.by_size import size_text
from .legend import config_key
from .summary import text_table
from .verdicts import _x


def size_tables(verdicts: list, ref_name: str = "reference") -> str:
    """One table per verdict that carries sizes: size, busbw now, the reference's, now/ref; '' when none does.
    A configuration judged on both bandwidth metrics shows once."""
    blocks, seen = [], set()
    for v in verdicts:
        key = config_key(v.platform, v.benchmark, v.config)
        if not v.sizes or key in seen:
            continue
        seen.add(key)
        rows = [[size_text(f["size_bytes"]), f"{f['now_gbps']:.4g}", f"{f['reference_gbps']:.4g}",
                 _x(f["now_gbps"] / f["reference_gbps"]) if f["reference_gbps"] > 0 else "-"] for f in v.sizes]
        config = " ".join(f"{k}={val}" for k, val in sorted(v.config.items()))
        blocks.append(f"{v.platform}/{v.benchmark} ({config}): {v.verdict} on {v.metric}; busbw GB/s by message size\n"
                      + text_table(["size", "now", ref_name, f"now/{ref_name}"], rows, markdown=False))
    return "\n\n".join(blocks)
