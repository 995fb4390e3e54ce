"""Where each gradient element goes in the reduce-scatter gradient reduction
(benchmarks/reduce_scatter/install.py): one bucket's pieces per destination rank (the per-bucket path),
and the equal windows of every rank's partition (ZeRO-1's balanced path). Pure, no torch: the
performance model (harness/model/perfmodel.py) uses the same definitions.
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


def _check_span(what: str, start: int, numel: int, n: int, size: int) -> None:
    """ValueError unless elements [start, start + numel) lie in a flat group of n ranks x size."""
    if numel < 0 or start < 0 or start + numel > n * size:
        raise ValueError(f"{what}: elements [{start}, {start + numel}) outside the flat group of {n} x {size}")


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
        _check_span(f"parameter {param}", start, numel, n, p)
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


# --- ZeRO-2's balanced bucket shards: pure, no torch ---------------------------------------------
#
# ZeRO-2 reduces each bucket as backward fills it. The balanced path reduce-scatters the bucket
# itself in N equal shards (rank r receives the reduced elements [r s, (r+1) s) of the bucket,
# s = balanced_bucket_elements(b, N) / N), accumulates its shards over the micro-steps of an
# optimizer step, and at the accumulation boundary sends each element to the rank whose DeepSpeed
# partition holds it with ONE all-to-all (plan_bucket_shards says which element goes where).

def balanced_bucket_elements(bucket_numel: int, n: int, align: int = 2) -> int:
    """Input elements of one ZeRO-2 bucket's balanced reduce-scatter: the bucket's `bucket_numel`
    gradient elements padded with zeros to a multiple of N x `align` (DeepSpeed's
    nccl_start_alignment_factor, 2, so that every shard starts aligned). Each rank receives
    1/N of it (bucket_shard_numel) and sends (N-1)/N of it (NCCL ring): (N-1)/N of the bucket
    bytes plus at most N x align - 1 padding elements, whatever the bucket's place in DeepSpeed's
    partitions. 0 for an empty bucket."""
    if n < 1 or align < 1:
        raise ValueError(f"n={n}, align={align}: must be >= 1")
    if bucket_numel <= 0:
        return 0
    unit = n * align
    return -(-bucket_numel // unit) * unit


def bucket_shard_numel(bucket_numel: int, n: int, align: int = 2) -> int:
    """s: the elements of a bucket each rank receives from its balanced reduce-scatter (its shard),
    padding included (only the last ranks' shards hold padding)."""
    return balanced_bucket_elements(bucket_numel, n, align) // n


def padded_bucket_elements(spans: Sequence[tuple[int, int, int]], partition_numel: Sequence[int],
                           n: int) -> int:
    """For comparison: the input elements of the per-bucket reduce-scatter that the balanced path
    replaced for ZeRO-2 (and that ZeRO-1 still uses where its balanced windows do not apply):
    plan_layout packs each destination rank's pieces of the bucket into one chunk and pads every
    chunk to the longest, N x max_r(elements of the bucket in rank r's partition). `spans`: the
    bucket's gradients as (parameter group, first element in the group's flat buffer, elements);
    `partition_numel`: DeepSpeed's partition size per group."""
    shares = [0] * n
    for dst, _group, _offset, numel in _partition_runs(spans, partition_numel, n):
        shares[dst] += numel
    return n * max(shares, default=0)


def _partition_runs(spans: Sequence[tuple[int, int, int]], partition_numel: Sequence[int], n: int):
    """(destination rank, group, offset in its partition, elements) of each span, cut at the
    partition boundaries, in span order."""
    for group, start, numel in spans:
        size = partition_numel[group]
        _check_span(f"group {group}", start, numel, n, size)
        pos, end = start, start + numel
        while pos < end:
            dst, offset = divmod(pos, size)
            run = min(end - pos, size - offset)
            yield dst, group, offset, run
            pos += run


@dataclass(frozen=True)
class ShardSegment:
    """A run of gradient elements that one rank reduces in its shard of one bucket and another (or
    the same) rank's DeepSpeed partition holds."""
    src: int              # the rank whose shard of the bucket holds these elements
    bucket: int           # the bucket's position in backward (0, 1, ...)
    shard_offset: int     # first element, within src's shard of the bucket
    numel: int
    group: int            # optimizer parameter group
    dst: int              # the rank whose partition of the group holds these elements
    dst_offset: int       # first element, within dst's partition of the group


@dataclass(frozen=True)
class ShardPlan:
    """Where every gradient element of a backward's buckets goes in ZeRO-2's balanced path.

    Rank r's accumulator holds, destination by destination (rank 0's elements first, then rank
    1's, ...; within a destination in (bucket, shard offset) order), the real elements of its
    shards of every bucket (the shards' padding is dropped): accumulator_numel(r) elements, about
    Psi/N. The boundary all-to-all sends accumulator chunk d to rank d (input split sizes
    send_numel[r]); rank d receives from each rank r its chunk (output split sizes
    [send_numel[r][d] for r]) in the same order, and receive_runs(d) says where in its partitions
    each received run goes."""
    world_size: int
    shard_numel: tuple[int, ...]          # s per bucket
    bucket_numel: tuple[int, ...]         # real elements per bucket
    segments: tuple[ShardSegment, ...]    # ordered by (src, dst, bucket, shard_offset)

    @property
    def send_numel(self) -> tuple[tuple[int, ...], ...]:
        """[src][dst]: elements src's accumulator holds for dst's partition (src == dst: kept)."""
        m = [[0] * self.world_size for _ in range(self.world_size)]
        for s in self.segments:
            m[s.src][s.dst] += s.numel
        return tuple(tuple(row) for row in m)

    def accumulator_numel(self, rank: int) -> int:
        """Elements of `rank`'s accumulator: the all-to-all's input (what the instrument records)."""
        return sum(self.send_numel[rank])

    def accumulator_runs(self, rank: int) -> list[list[tuple[int, int, int]]]:
        """Per bucket: (offset in the shard, offset in the accumulator, elements) of each run of
        `rank`'s shard, to add the reduced shard into the accumulator (segments contiguous in both
        merged: about one run per destination rank)."""
        runs: list[list[tuple[int, int, int]]] = [[] for _ in self.shard_numel]
        offset = 0
        for s in self.segments:
            if s.src == rank:
                bucket = runs[s.bucket]
                last = bucket[-1] if bucket else None
                if last and last[0] + last[2] == s.shard_offset and last[1] + last[2] == offset:
                    bucket[-1] = (last[0], last[1], last[2] + s.numel)
                else:
                    bucket.append((s.shard_offset, offset, s.numel))
                offset += s.numel
        return runs

    def receive_runs(self, rank: int) -> list[tuple[int, int, int, int]]:
        """(offset in the all-to-all output, group, offset in `rank`'s partition of the group,
        elements) of every run `rank` receives, sources in rank order (runs contiguous in both
        merged)."""
        runs: list[tuple[int, int, int, int]] = []
        offset = 0
        for s in sorted((s for s in self.segments if s.dst == rank), key=lambda s: s.src):  # stable
            if runs and runs[-1][1] == s.group and runs[-1][2] + runs[-1][3] == s.dst_offset:
                runs[-1] = (runs[-1][0], s.group, runs[-1][2], runs[-1][3] + s.numel)
            else:
                runs.append((offset, s.group, s.dst_offset, s.numel))
            offset += s.numel
        return runs


def plan_bucket_shards(buckets: Sequence[Sequence[tuple[int, int, int]]], partition_numel: Sequence[int],
                       n: int, align: int = 2) -> ShardPlan:
    """The ShardPlan of a backward's buckets, in the order backward reduces them. Each bucket: its
    gradients in bucket order as (parameter group, first element in the group's flat buffer,
    elements); `partition_numel`: DeepSpeed's partition size P per group (the flat group is N x P
    elements, rank d's partition [d P, (d+1) P)). Bucket element j (of b) is reduced into the
    shard of rank j // s at offset j % s (s = bucket_shard_numel(b, N, align))."""
    if n < 1:
        raise ValueError(f"n={n}: must be >= 1")
    segments: list[ShardSegment] = []
    shard_numel, bucket_numel = [], []
    for k, spans in enumerate(buckets):
        b = sum(numel for _, _, numel in spans)
        s = bucket_shard_numel(b, n, align)
        shard_numel.append(s)
        bucket_numel.append(b)
        pos = 0                                       # in the bucket
        for dst, group, offset, numel in _partition_runs(spans, partition_numel, n):
            while numel:
                src, shard_offset = divmod(pos, s)
                run = min(numel, s - shard_offset)
                segments.append(ShardSegment(src, k, shard_offset, run, group, dst, offset))
                pos, offset, numel = pos + run, offset + run, numel - run
    segments.sort(key=lambda s: (s.src, s.dst, s.bucket, s.shard_offset))
    return ShardPlan(n, tuple(shard_numel), tuple(bucket_numel), tuple(segments))


def boundary_all_to_all_elements(buckets: Sequence[Sequence[tuple[int, int, int]]],
                                 partition_numel: Sequence[int], n: int, align: int = 2) -> list[int]:
    """Per rank, EXACT: the gradient elements it sends to other ranks in ZeRO-2's boundary
    all-to-all (its accumulator minus the elements of its own partition); arguments as
    plan_bucket_shards. The all-to-all's input (the instrument's message size) is the whole
    accumulator, ShardPlan.accumulator_numel. Upper bound without the buckets: each rank sends at
    most its accumulator, sum over buckets of bucket_shard_numel(b, N) ~ Psi/N elements, and on
    average (N-1)/N of it when the buckets lie evenly over the partitions."""
    send = plan_bucket_shards(buckets, partition_numel, n, align).send_numel
    return [sum(row) - row[r] for r, row in enumerate(send)]


def accumulator_elements(bucket_numels: Sequence[int], n: int, align: int = 2) -> int:
    """Upper bound of one rank's bucket-sharded accumulator (persistent through a step's backward
    passes, in DeepSpeed's gradient accumulation dtype), and of its all-to-all receive buffer at
    the boundary: sum over buckets of bucket_shard_numel(b, N, align), about Psi/N."""
    return sum(bucket_shard_numel(b, n, align) for b in bucket_numels)
