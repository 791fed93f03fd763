"""Interval algebra on int64 nanoseconds: sets of sorted, disjoint, half-open intervals [s, e)
as (starts, ends) arrays, and their measure inside windows -- what the step breakdown, the
cross-rank attribution and the what-if replay are computed with.

Pure numpy, no I/O. Deliberately not here: what the intervals mean (ingest.traces,
ingest.attribution, ingest.whatif).
"""
from __future__ import annotations

import numpy as np

I64 = np.int64
EMPTY = (np.zeros(0, I64), np.zeros(0, I64))
_NEG, _POS = np.iinfo(np.int64).min // 4, np.iinfo(np.int64).max // 4


def union(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Merge possibly overlapping intervals into sorted disjoint ones (touching ones fuse)."""
    keep = ends > starts
    if not keep.all():
        starts, ends = starts[keep], ends[keep]
    if starts.size == 0:
        return EMPTY
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    reach = np.maximum.accumulate(e)
    new = np.empty(s.size, bool)
    new[0] = True
    new[1:] = s[1:] > reach[:-1]
    first = np.flatnonzero(new)
    last = np.append(first[1:] - 1, s.size - 1)
    return s[first], reach[last]


def union_of(*sets: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    return union(np.concatenate([s for s, _ in sets]), np.concatenate([e for _, e in sets]))


def intersect(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Intersection of two sorted disjoint interval sets (a sweep over the 4 boundary kinds)."""
    if a[0].size == 0 or b[0].size == 0:
        return EMPTY
    pos = np.concatenate([a[0], b[0], a[1], b[1]])
    delta = np.concatenate([np.ones(a[0].size + b[0].size, np.int8), -np.ones(a[1].size + b[1].size, np.int8)])
    order = np.lexsort((delta, pos))  # at equal positions ends (-1) first: half-open intervals
    pos, depth = pos[order], np.cumsum(delta[order])
    both = np.flatnonzero(depth[:-1] == 2)
    return union(pos[both], pos[both + 1])


def complement(a: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    s = np.concatenate([[_NEG], a[1]]).astype(I64)
    e = np.concatenate([a[0], [_POS]]).astype(I64)
    keep = e > s
    return s[keep], e[keep]


def minus(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    if a[0].size == 0 or b[0].size == 0:
        return a
    return intersect(a, complement(b))


def measure(a: tuple[np.ndarray, np.ndarray], lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """|a ∩ [lo_i, hi_i)| for each window i (ns), vectorised: F(hi) - F(lo), F(t) = |a ∩ (-inf, t)|."""
    lo, hi = np.asarray(lo, I64), np.asarray(hi, I64)
    s, e = a
    if s.size == 0:
        return np.zeros(lo.shape, I64)
    cum = np.concatenate([[0], np.cumsum(e - s)])

    def f(t: np.ndarray) -> np.ndarray:
        i = np.searchsorted(s, t, side="right") - 1
        ic = np.maximum(i, 0)
        inside = np.clip(t - s[ic], 0, e[ic] - s[ic])
        return np.where(i >= 0, cum[ic] + inside, 0)

    return np.maximum(f(hi) - f(lo), 0)


def clip(a: tuple[np.ndarray, np.ndarray], lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    return intersect(a, (np.array([lo], I64), np.array([hi], I64)))


def merge_gaps(a: tuple[np.ndarray, np.ndarray], max_spans: int) -> tuple[np.ndarray, np.ndarray]:
    """Merge gaps shorter than a doubling threshold (1 us, 2 us, ...) until <= max_spans spans."""
    s, e = a
    gap = 1000
    while s.size > max(max_spans, 1):
        s, e = union(s, e + gap)
        e = e - gap
        gap *= 2
    return s, e


def tile(s: np.ndarray, e: np.ndarray, cat: np.ndarray, max_spans: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Coarsen a tiling (contiguous segments, one category each) to <= max_spans segments:
    segments shorter than a doubling threshold (1 us, 2 us, ...) are absorbed by the segment
    before them, then equal neighbours fuse. The result still tiles the same span exactly;
    each category's share moves by at most the threshold per absorbed segment (display only)."""
    thr = 0
    while True:
        if s.size:
            fuse = np.zeros(s.size, bool)
            fuse[1:] = cat[1:] == cat[:-1]
            keep = np.flatnonzero(~fuse)
            s, e, cat = s[keep], np.append(e[keep[1:] - 1], e[-1]), cat[keep]
        if s.size <= max(max_spans, 1):
            return s, e, cat
        thr = thr * 2 or 1000
        keep = (e - s) >= thr
        keep[0] = True
        idx = np.flatnonzero(keep)
        s, e, cat = s[idx], np.append(e[idx[1:] - 1], e[-1]), cat[idx]
