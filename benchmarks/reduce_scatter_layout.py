"""Where each gradient element goes in the reduce-scatter gradient reduction
(benchmarks/reduce_scatter.py): one bucket's pieces per destination rank (the per-bucket path),
and the equal windows of every rank's partition (ZeRO-1's balanced path). Pure, no torch: the
performance model (harness/perfmodel.py) uses the same definitions.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


# --- the layout of one bucket: pure, no torch ---------------------------------------------------

@dataclass(frozen=True)
class Piece:
    """A run of one parameter's gradient that belongs to one rank's partition."""
    dst: int              # data-parallel rank whose partition holds these elements
    index: int            # the parameter's position in the bucket
    param_offset: int     # first element, within the parameter
    bucket_offset: int    # first element, within the flat bucket
    numel: int


@dataclass(frozen=True)
class Layout:
    """Where each piece goes in the reduce-scatter input: chunk `dst`, at `chunk_offsets[i]`."""
    world_size: int
    chunk_numel: int                  # every chunk padded to this (the longest destination)
    chunk_offsets: tuple[int, ...]    # per piece, within its destination's chunk
    dst_numel: tuple[int, ...]        # real elements per destination

    @property
    def real_numel(self) -> int:
        return sum(self.dst_numel)

    @property
    def padded_numel(self) -> int:
        return self.world_size * self.chunk_numel


def plan_layout(pieces: Sequence[Piece], world_size: int) -> Layout:
    """Each destination's pieces back to back in bucket order, chunks padded to equal length."""
    fill = [0] * world_size
    offsets = []
    for p in pieces:
        if not 0 <= p.dst < world_size:
            raise ValueError(f"piece for rank {p.dst} outside the group of {world_size}")
        offsets.append(fill[p.dst])
        fill[p.dst] += p.numel
    return Layout(world_size, max(fill, default=0), tuple(offsets), tuple(fill))


def split_param(index: int, bucket_offset: int, numel: int,
                starts: Sequence[tuple[int, int]]) -> list[Piece]:
    """A parameter's pieces from (partition id, offset in the parameter) of each partition it
    touches, as average_tensor computes them: each runs to the next partition's offset."""
    starts = sorted(starts, key=lambda t: t[1])
    pieces = []
    for k, (dst, offset) in enumerate(starts):
        end = starts[k + 1][1] if k + 1 < len(starts) else numel
        if end > offset:
            pieces.append(Piece(dst, index, offset, bucket_offset + offset, end - offset))
    return pieces


# --- the balanced ZeRO-1 windows of one parameter group: pure, no torch ----------------------

def window_numel(partition_numel: int, bucket_numel: int, world_size: int, align: int = 2) -> int:
    """W, the elements of every rank's partition reduced by one window's reduce-scatter: as many
    as let the N chunks fill one DeepSpeed bucket (reduce_bucket_size // N), rounded down to a
    multiple of `align` (DeepSpeed's nccl_start_alignment_factor, 2, which its partitions keep),
    at least `align`, at most the partition (0 for an empty one)."""
    if partition_numel <= 0:
        return 0
    if world_size < 1 or bucket_numel < 1 or align < 1:
        raise ValueError(f"world_size={world_size}, bucket_numel={bucket_numel}, align={align}: must be >= 1")
    return min(partition_numel, max(align, bucket_numel // world_size // align * align))


@dataclass(frozen=True)
class Segment:
    """A run of one parameter's gradient inside one chunk of a window."""
    chunk: int            # r: the rank whose partition holds these elements (the chunk's position)
    param: int            # the parameter, as the caller numbers it
    param_offset: int     # first element, within the parameter
    chunk_offset: int     # first element, within chunk r of the window (0 <= .. < the window's numel)
    numel: int


@dataclass(frozen=True)
class Window:
    """One reduce-scatter: input [chunk_0 | ... | chunk_{N-1}], chunk r = flat elements
    [r P + offset, r P + offset + numel); a segment goes to input position chunk x numel + chunk_offset."""
    offset: int
    numel: int
    world_size: int
    segments: tuple[Segment, ...]     # ordered by (chunk, chunk_offset)

    @property
    def real_numel(self) -> int:
        return sum(s.numel for s in self.segments)

    @property
    def padded_numel(self) -> int:
        return self.world_size * self.numel


def plan_windows(spans: Sequence[tuple[int, int, int]], partition_numel: int, world_size: int,
                 window: int) -> list[Window]:
    """The windows of one parameter group that hold any of `spans` (parameter, first element in
    the flat group, elements), in offset order. The flat group is N x partition_numel elements,
    rank r's partition [r P, (r+1) P); window k covers [r P + k W, r P + min((k+1) W, P)) of every
    partition r. Elements of no span (alignment padding, parameters left out) are the input's zeros."""
    n, p = world_size, partition_numel
    if n < 1 or p < 1 or not 1 <= window <= p:
        raise ValueError(f"world_size={n}, partition_numel={p}, window={window}: need 1 <= window <= partition")
    by_window: dict[int, list[Segment]] = {}
    for param, start, numel in spans:
        if numel < 0 or start < 0 or start + numel > n * p:
            raise ValueError(f"parameter {param}: elements [{start}, {start + numel}) outside the flat group "
                             f"of {n} x {p}")
        pos, end = start, start + numel
        while pos < end:
            r, within = divmod(pos, p)
            k, in_window = divmod(within, window)
            stop = min(end, r * p + min((k + 1) * window, p))
            by_window.setdefault(k, []).append(Segment(r, param, pos - start, in_window, stop - pos))
            pos = stop
    windows = []
    for k in sorted(by_window):
        segments = tuple(sorted(by_window[k], key=lambda s: (s.chunk, s.chunk_offset)))
        for a, b in zip(segments, segments[1:]):
            if a.chunk == b.chunk and a.chunk_offset + a.numel > b.chunk_offset:
                raise ValueError(f"parameters {a.param} and {b.param} overlap in the flat group")
        windows.append(Window(k * window, min(window, p - k * window), n, segments))
    return windows
