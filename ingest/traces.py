"""Step-time breakdown from torch.profiler (Kineto) Chrome traces, one trace per rank.

Records in, records out: ``compute_step_breakdown`` reduces a trace's event dicts
(ingest.trace_reader.iter_trace_events streams them, never the whole file in memory)
those events to ``StepBreakdownRow`` / ``KernelSummaryRow`` / ``TimelineSpanRow`` records
(core/records.py). Files are opened only by ``ingest.io.open_trace_events``.

Two timelines:

* **GPU** (the trace has ``kernel`` / ``gpu_memcpy`` / ``gpu_memset`` events): every GPU event is
  assigned to the profiler step whose CPU ``ProfilerStep#k`` range holds the CUDA runtime/driver
  call that launched it (matched by ``args.correlation``); the last ProfilerStep is dropped, as
  HolisticTraceAnalysis does (hta/common/trace.py ``_filter_irrelevant_gpu_kernels``) because its
  kernels may run past the end of the trace. Kernel classes follow HTA's hta/utils/utils.py
  (``get_kernel_type``: communication = ``^nccl.*Kernel``, memory = ``^Memcpy|^Memset|^dma``,
  computation = neither and not matching ``NCCL_COMPUTE_KERNEL_RE``; the remainder, e.g. names
  holding ``Sync``, are "other" kernels that count as busy but neither compute nor comm).
* **CPU** (no GPU events: gloo runs): the host ops of the thread that records ``ProfilerStep#k``.

Deliberately not here: opening files, plotting, rounding, and any per-collective analysis
(ingest/thirdparty.py and the NCCL parsers own that). Times are integer nanoseconds internally
(exact partition arithmetic) and seconds in the records.
"""
from __future__ import annotations

import dataclasses
import re
from array import array
from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np

from core.i18n import Message, N_
from core.records import (BREAKDOWN_CATEGORIES, PHASE_RANGES, PLANT_EXTRA_MATMUL_RANGE, KernelSummaryRow,
                          StepBreakdownRow, TimelineSpanRow)
from ingest.intervals import EMPTY, I64, clip, intersect, measure, merge_gaps, minus, tile, union, union_of

# --- patterns (one table; a new kernel family is one line) -----------------------------------

# HTA hta/utils/utils.py, verbatim: NCCL_KERNEL_RE, MEMORY_KERNEL_RE, NCCL_COMPUTE_KERNEL_RE.
COMM_KERNEL_RE = re.compile(r"^nccl.*Kernel")
MEMORY_KERNEL_RE = re.compile(r"(^Memcpy)|(^Memset)|(^dma)")
NON_COMPUTE_KERNEL_RE = re.compile(r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)")
# Point-to-point NCCL kernels (pipeline activations): ncclKernel_SendRecv_*, ncclDevKernel_SendRecv,
# ncclKernel_Send*/Recv*.
P2P_KERNEL_RE = re.compile(r"SendRecv|Send|Recv")

# KernelSummaryRow.kernel_class, first match wins (comm and memory as above, then):
#  attention: FlashAttention (flash_fwd/bwd, flash::), xFormers/cutlass "fmha", cuDNN SDPA
#    ("cudnn_generated_fort_native_sdpa", "sdpa"), PyTorch mem-efficient attention
#    ("_efficient_attention", "attention_kernel"), Megatron fused softmax of attention scores
#    ("scaled_masked_softmax", "scaled_upper_triang_masked_softmax"), cuDNN SDPA backward helpers
#    ("cudnn::fusion::compute_dot_do_o_specialized", "cudnn::fusion::convert_dq_to_16bits").
#  gemm: cuBLAS/cuBLASLt/CUTLASS matmuls: "gemm", "gemv", "cutlass", "cublas", "xmma"
#    (sm80/sm90_xmma_*), "nvjet" (Hopper cuBLAS), "wgmma", "matmul", "splitKreduce".
#  loss (before attention and elementwise, so a log-softmax is not an attention softmax): cross
#    entropy and its pieces -- "cross_entropy", log-softmax ("log_softmax", cuDNN/ATen
#    "LogSoftMax" epilogues), "nll_loss", Liger-Kernel's Triton kernels ("liger"), and Inductor's
#    fused kernels named after them (triton_*_fused_*_log_softmax*, *nll_loss*).
#  optimizer: multi-tensor kernels of fused/foreach AdamW and of gradient clipping (norms and
#    scaling run in the optimizer phase too): "multi_tensor_apply", "adam", "foreach".
#  elementwise: PyTorch TensorIterator and friends: "elementwise", "vectorized", "unrolled",
#    "reduce", "pointwise", Triton "triton_(poi|red|per)", layer/RMS norm (incl. the
#    "GammaBetaBackward" kernels of LayerNorm backward), other softmax, dropout,
#    fills/copies/index/cat/scatter/gather.
LOSS_KERNEL_RE = re.compile(r"cross_?entropy|log_?softmax|nll_?loss|liger", re.I)
KERNEL_CLASS_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("comm", COMM_KERNEL_RE),
    ("memory", MEMORY_KERNEL_RE),
    ("loss", LOSS_KERNEL_RE),
    ("optimizer", re.compile(r"multi_tensor_apply|adam|foreach", re.I)),
    ("attention", re.compile(
        r"flash|fmha|sdpa|attention|attn|scaled_dot_product|masked_softmax|upper_triang|"
        r"cudnn::fusion::(compute_dot_do_o|convert_dq)", re.I)),
    ("gemm", re.compile(r"gemm|gemv|cutlass|cublas|xmma|nvjet|wgmma|matmul|splitKreduce", re.I)),
    ("elementwise", re.compile(
        r"elementwise|vectorized|unrolled|reduce|pointwise|triton_(poi|red|per)|norm|softmax|"
        r"dropout|fill|copy|index|cat_|scatter|gather|GammaBeta", re.I)),
)
# Host ops on CPU timelines (KernelSummaryRow of a CPU trace): same classes, host names (leaf ops:
# aten::_log_softmax, aten::nll_loss_forward, aten::_foreach_lerp_ ...).
HOST_CLASS_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("comm", re.compile(r"^(c10d::|_?c10d_functional::|gloo:|nccl:|record_param_comms)")),
    ("memory", re.compile(r"^aten::(copy_|to|_to_copy|empty|empty_strided|clone|zero_|zeros)$")),
    ("loss", LOSS_KERNEL_RE),  # aten::_log_softmax, aten::nll_loss_forward, their backwards
    ("optimizer", re.compile(r"^aten::_(foreach_\w+|fused_adamw?_?)$|adam", re.I)),  # AdamW and clipping
    ("attention", re.compile(r"attention|scaled_dot_product|flash", re.I)),
    ("gemm", re.compile(r"^aten::(mm|addmm|bmm|baddbmm|matmul|linear)$")),
    ("elementwise", re.compile(r"^aten::")),
)

# CPU timeline: communication ops of the training thread (gloo / c10d / functional collectives,
# the profiler's record_param_comms) and, on other threads, the gloo worker ranges
# ("gloo:all_reduce" on pt_gloo_runloop threads). P2P: send/recv (pipeline stages).
CPU_COMM_RE = HOST_CLASS_PATTERNS[0][1]
CPU_P2P_RE = re.compile(r"send|recv", re.I)
DATA_RANGE = "data"
OPTIMIZER_RANGE = "optimizer"
# a planted extra matmul (runner.plants, the matrix's plant table) is compute wherever the step runs it
CPU_COMPUTE_RANGES = (frozenset(PHASE_RANGES) - {DATA_RANGE}) | {PLANT_EXTRA_MATMUL_RANGE}

_GPU_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
_LAUNCH_CATS = frozenset({"cuda_runtime", "cuda_driver"})
_HOST_CATS = frozenset({"cpu_op", "user_annotation"})
_STEP_PREFIX = "ProfilerStep#"
NS_PER_US = 1000
# An event more than this far from the trace's median start (or lasting longer) is an outlier: a
# trace covers seconds to hours, and a stray clock value (a zero ts in an epoch-clock trace, a
# garbage number) would otherwise stretch the windows and overflow int64 nanoseconds. Absolute
# values are not bounded: Kineto wrote Unix-epoch microseconds (~1.7e15) in every ts until it
# moved to ts relative to ``baseTimeNanoseconds``.
OUTLIER_SPAN_US = 2 * 86_400e6  # two days
EPOCH_MIN_US = 946_684_800e6  # 2000-01-01T00:00Z: a median ts (plus base) past it is Unix-epoch time
_INF = float("inf")


# --- collection: one pass over the events, keep only what the analysis needs -------------------

class _Names:
    """Interns event names to small ints (arrays hold ids, not strings)."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}
        self.names: list[str] = []

    def id(self, name: str) -> int:
        i = self.ids.get(name)
        if i is None:
            i = self.ids[name] = len(self.names)
            self.names.append(name)
        return i


@dataclass
class _Collected:
    names: _Names = field(default_factory=_Names)
    # GPU events: start (us, float), duration (us), launch correlation (-1: none), name id
    # (array.array: 8 bytes a value instead of a Python float object and a list slot)
    g_ts: array = field(default_factory=lambda: array("d"))
    g_dur: array = field(default_factory=lambda: array("d"))
    g_corr: array = field(default_factory=lambda: array("q"))
    g_name: array = field(default_factory=lambda: array("q"))
    # CUDA runtime/driver launches: start (us), correlation
    l_ts: array = field(default_factory=lambda: array("d"))
    l_corr: array = field(default_factory=lambda: array("q"))
    # host calls that wait for the device (cuda*Synchronize): start, duration (us)
    s_ts: array = field(default_factory=lambda: array("d"))
    s_dur: array = field(default_factory=lambda: array("d"))
    # host ops (cpu_op/user_annotation): start, duration, thread, name id, is-annotation
    h_ts: array = field(default_factory=lambda: array("d"))
    h_dur: array = field(default_factory=lambda: array("d"))
    h_tid: array = field(default_factory=lambda: array("q"))
    h_name: array = field(default_factory=lambda: array("q"))
    h_annot: array = field(default_factory=lambda: array("b"))
    # ProfilerStep#k ranges: (k, start, end, tid)
    steps: list[tuple[int, float, float, int]] = field(default_factory=list)
    # NCCL kernels' collective record (index into the g_* arrays -> (process group, in/out
    # elements, dtype)); Kineto copies these from record_param_comms into the kernel's args
    comm_args: dict[int, tuple[str, float, float, str]] = field(default_factory=dict)
    num_ignored: int = 0


def _collect(events: Iterable[dict[str, Any]]) -> _Collected:
    """One pass; per event only dict lookups and array appends (this loop is the hot path
    next to the JSON parser). Every value is converted before any append, so a malformed
    event never leaves the parallel arrays misaligned."""
    c = _Collected()
    gts, gdur, gcorr, gname = c.g_ts.append, c.g_dur.append, c.g_corr.append, c.g_name.append
    lts, lcorr = c.l_ts.append, c.l_corr.append
    hts, hdur, htid, hname, hannot = (c.h_ts.append, c.h_dur.append, c.h_tid.append, c.h_name.append,
                                      c.h_annot.append)
    intern = c.names.id
    ids = c.names.ids
    tids: dict[Any, int] = {}
    host_cats, launch_cats, gpu_cats = _HOST_CATS, _LAUNCH_CATS, _GPU_CATS
    lo, hi = -_INF, _INF  # finite numbers only (NaN fails both comparisons); outliers: _drop_outliers
    for ev in events:
        if ev.get("ph") != "X":
            continue
        cat = ev.get("cat")
        try:
            if cat in host_cats:
                ts, dur, name = float(ev["ts"]), float(ev.get("dur", 0.0)), ev["name"]
                if not (lo < ts < hi and 0.0 <= dur < hi):  # also rejects NaN
                    raise ValueError(ts, dur)
                if type(name) is not str:
                    name = str(name)
                tid = ev.get("tid")
                t = tids.get(tid)
                if t is None:
                    t = tids[tid] = len(tids)
                if name.startswith(_STEP_PREFIX):
                    c.steps.append((int(name[len(_STEP_PREFIX):]), ts, ts + dur, t))
                    continue
                i = ids.get(name)
                if i is None:
                    i = intern(name)
                hts(ts)
                hdur(dur)
                htid(t)
                hname(i)
                hannot(cat == "user_annotation")
            elif cat in launch_cats:
                ts, corr = float(ev["ts"]), int(ev["args"]["correlation"])
                if not (lo < ts < hi and -(1 << 62) < corr < (1 << 62)):
                    raise ValueError(ts, corr)
                name = ev.get("name")
                if type(name) is str and "ynchronize" in name:  # cudaStreamSynchronize & co.
                    dur = float(ev.get("dur", 0.0))
                    if 0.0 <= dur < hi:
                        c.s_ts.append(ts)
                        c.s_dur.append(dur)
                lts(ts)
                lcorr(corr)
            elif cat in gpu_cats:
                ts, dur, name = float(ev["ts"]), float(ev.get("dur", 0.0)), ev["name"]
                args = ev.get("args") or {}
                corr = int(args.get("correlation", -1))
                if not (lo < ts < hi and 0.0 <= dur < hi and -(1 << 62) < corr < (1 << 62)):
                    raise ValueError(ts, dur, corr)
                if type(name) is str and name.startswith("nccl") and "Process Group Name" in args:
                    c.comm_args[len(c.g_ts)] = _comm_args(args)
                gts(ts)
                gdur(dur)
                gcorr(corr)
                gname(intern(name if type(name) is str else str(name)))
        except (KeyError, TypeError, ValueError, OverflowError, AttributeError):
            c.num_ignored += 1
    return c


def _drop_outliers(c: _Collected) -> str | None:
    """Remove, in place, the events whose start lies more than OUTLIER_SPAN_US from the median
    start of all kept events (host ops, launches, GPU events, ProfilerStep ranges) or that last
    longer than OUTLIER_SPAN_US. Returns a warning counting and naming them, None when none."""
    host_ts, launch_ts, gpu_ts = (np.frombuffer(a, np.float64) for a in (c.h_ts, c.l_ts, c.g_ts))
    step_ts = np.array([s for _, s, _, _ in c.steps], np.float64)
    every = np.concatenate([host_ts, launch_ts, gpu_ts, step_ts])
    if every.size == 0:
        return None
    median = float(np.median(every))

    def bad(ts: np.ndarray, dur: np.ndarray | None = None) -> np.ndarray:
        out = np.abs(ts - median) > OUTLIER_SPAN_US
        return out | (dur > OUTLIER_SPAN_US) if dur is not None else out

    h_bad = bad(host_ts, np.frombuffer(c.h_dur, np.float64))
    l_bad = bad(launch_ts)
    g_bad = bad(gpu_ts, np.frombuffer(c.g_dur, np.float64))
    s_bad = [abs(s - median) > OUTLIER_SPAN_US or e - s > OUTLIER_SPAN_US for _, s, e, _ in c.steps]
    num = int(h_bad.sum() + l_bad.sum() + g_bad.sum()) + sum(s_bad)
    if not num:
        return None
    names = c.names.names
    examples = ([f"{names[i]!r} at ts={host_ts[j]:.17g} us" for j, i in
                 zip(np.flatnonzero(h_bad)[:3].tolist(), np.frombuffer(c.h_name, np.int64)[h_bad][:3].tolist())]
                + [f"ProfilerStep#{k} at ts={s:.17g} us" for (k, s, _, _), b in zip(c.steps, s_bad) if b][:3]
                + [f"{names[i]!r} at ts={gpu_ts[j]:.17g} us" for j, i in
                   zip(np.flatnonzero(g_bad)[:3].tolist(), np.frombuffer(c.g_name, np.int64)[g_bad][:3].tolist())]
                + [f"a CUDA launch at ts={t:.17g} us" for t in launch_ts[l_bad][:3].tolist()])

    def keep(arr: array, mask: np.ndarray) -> array:
        out = array(arr.typecode)
        out.frombytes(np.frombuffer(arr, arr.typecode)[~mask].tobytes())
        return out

    c.h_ts, c.h_dur, c.h_tid, c.h_name, c.h_annot = (keep(a, h_bad) for a in (c.h_ts, c.h_dur, c.h_tid, c.h_name,
                                                                              c.h_annot))
    c.l_ts, c.l_corr = keep(c.l_ts, l_bad), keep(c.l_corr, l_bad)
    new_index = np.cumsum(~g_bad) - 1
    c.comm_args = {int(new_index[i]): a for i, a in c.comm_args.items() if not g_bad[i]}
    c.g_ts, c.g_dur, c.g_corr, c.g_name = (keep(a, g_bad) for a in (c.g_ts, c.g_dur, c.g_corr, c.g_name))
    c.steps = [st for st, b in zip(c.steps, s_bad) if not b]
    return Message(N_("%(num)s event(s) more than %(days)s days from the trace's median time (%(median)s us) or longer "
                      "than that were left out as clock outliers: %(examples)s"), num=num,
                   days=f"{OUTLIER_SPAN_US / 86_400e6:g}", median=f"{median:.17g}", examples="; ".join(examples[:5]))


_DTYPE_BYTES = {"Float": 4, "BFloat16": 2, "Half": 2, "Double": 8, "Int": 4, "Long": 8, "Byte": 1, "Char": 1,
                "Bool": 1, "Float8_e4m3fn": 1, "Float8_e5m2": 1}


def _coll_bytes(kind: str, args: tuple[str, float, float, str] | None) -> float:
    """Bytes of one collective in nccl-tests' convention (runner commbench's nbytes): the
    gathered output for all-gather, the input otherwise. NaN when the trace does not say."""
    if args is None or args[3] not in _DTYPE_BYTES:
        return float("nan")
    nelems = args[2] if kind == "all_gather" else args[1]
    return nelems * _DTYPE_BYTES[args[3]]


def _comm_args(args: dict[str, Any]) -> tuple[str, float, float, str]:
    """(process group name, in elements, out elements, dtype) of an NCCL kernel's args; NaN
    where a count is missing or not a number."""
    def num(key: str) -> float:
        try:
            return float(args.get(key))
        except (TypeError, ValueError):
            return float("nan")
    return str(args.get("Process Group Name")), num("In msg nelems"), num("Out msg nelems"), str(args.get("dtype"))


# --- analysis -----------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class TraceBreakdown:
    """Result of ``compute_step_breakdown`` for one rank's trace.

    steps: one StepBreakdownRow per analysed step, by step number. kernels: one KernelSummaryRow
    per kernel (GPU) or leaf host op (CPU) name, by total time descending, then name. spans: TimelineSpanRow
    of the representative (median-duration) step. timeline: "gpu", "cpu" or None (nothing to
    analyse). warnings: why steps or events were left out (caveats for the note).
    """

    steps: tuple[StepBreakdownRow, ...]
    kernels: tuple[KernelSummaryRow, ...]
    spans: tuple[TimelineSpanRow, ...]
    timeline: str | None
    warnings: tuple[str, ...] = ()
    # the rank's interval sets and collectives, for the cross-rank pass (ingest.attribution)
    rank_timeline: RankTimeline | None = None
    # how the steps were found: "marks" (ProfilerStep#k), "annotation" / "kernels" (a repeating
    # host range / GPU kernel pattern, step_split_name), "window" (one step); None: no steps
    step_split: str | None = None
    step_split_name: str | None = None


# collective kind from an NCCL kernel or gloo range name (runner commbench's op names)
_COLL_KINDS = (("all_reduce", re.compile(r"all_?reduce", re.I)), ("all_gather", re.compile(r"all_?gather", re.I)),
               ("reduce_scatter", re.compile(r"reduce_?scatter", re.I)), ("all_to_all", re.compile(r"all_?to_?all", re.I)),
               ("broadcast", re.compile(r"broadcast", re.I)), ("send_recv", re.compile(r"send|recv", re.I)),
               ("reduce", re.compile(r"reduce", re.I)))


def collective_kind(name: str) -> str:
    """runner commbench's op name for a collective kernel/range name ("other" if none fits)."""
    return next((k for k, pat in _COLL_KINDS if pat.search(name)), "other")


# what a replay work item is (ReplayInput.cat); ingest.whatif changes their durations
WORK_CATS = ("compute", "other", "launch_gaps", "data_stall", "pipeline", "transfer")
NO_LAUNCH = np.iinfo(np.int64).min


@dataclass(frozen=True, kw_only=True)
class ReplayInput:
    """One rank's analysed window as a chain of items for ingest.whatif's replay: int64 ns on the
    rank's clock (as RankTimeline), sorted by start, disjoint. kind 0: work of fixed duration,
    category ``WORK_CATS[cat]``; kind 1: a wait for collective ``coll`` (index into the
    RankTimeline's coll_* arrays), which ends when that collective does. launch: host launch time
    of a GPU work item's first kernel (NO_LAUNCH on CPU timelines, where host time is work items
    of its own). step: index into RankTimeline.steps. coll_launch: each collective's host launch
    (NO_LAUNCH: none). sync_start/sync_end: host calls that waited for the device
    (cuda*Synchronize); data_start/data_end: host batch fetches (GPU; on CPU they are items)."""

    start: np.ndarray
    end: np.ndarray
    kind: np.ndarray
    cat: np.ndarray
    coll: np.ndarray
    launch: np.ndarray
    step: np.ndarray
    coll_launch: np.ndarray
    sync_start: np.ndarray
    sync_end: np.ndarray
    data_start: np.ndarray
    data_end: np.ndarray


_EMPTY_I = np.zeros(0, np.int64)


def _wait_items(block: tuple[np.ndarray, np.ndarray], coll_end: np.ndarray, tol_ns: int) -> list[tuple[int, int, int]]:
    """(start, end, collective index or -1) pieces of the exposed-wait intervals: each piece ends
    where a collective ends (within tol_ns of the interval's end); what follows the last such end
    is exposed transfer of unknown source (-1)."""
    order = np.argsort(coll_end, kind="stable")
    ends = coll_end[order]
    out = []
    for x, y in zip(block[0].tolist(), block[1].tolist()):
        i0, i1 = np.searchsorted(ends, x, side="right"), np.searchsorted(ends, y + tol_ns, side="right")
        cur = x
        for j in range(i0, i1):
            e = min(int(ends[j]), y)
            out.append((cur, e, int(order[j])))
            cur = e
        if cur < y:
            out.append((cur, y, -1))
    return out


def _replay_input(*, lo: np.ndarray, hi: np.ndarray, work: list[tuple[int, int, int, int]],
                  waits: list[tuple[int, int, int]], coll_launch: np.ndarray, sync: tuple[np.ndarray, np.ndarray],
                  data: tuple[np.ndarray, np.ndarray]) -> ReplayInput:
    """work: (start, end, WORK_CATS index, launch); waits: _wait_items' pieces (-1: transfer work)."""
    rows = [(s, e, 0, c, -1, l) for s, e, c, l in work]
    rows += [(s, e, 1, 0, c, NO_LAUNCH) if c >= 0 else (s, e, 0, WORK_CATS.index("transfer"), -1, NO_LAUNCH)
             for s, e, c in waits]
    rows.sort(key=lambda r: (r[0], r[1]))
    a = np.array(rows, np.int64).reshape(-1, 6)
    step = np.clip(np.searchsorted(lo, a[:, 0], side="right") - 1, 0, max(lo.size - 1, 0))
    return ReplayInput(start=a[:, 0], end=a[:, 1], kind=a[:, 2], cat=a[:, 3], coll=a[:, 4], launch=a[:, 5],
                       step=step, coll_launch=coll_launch, sync_start=sync[0], sync_end=sync[1],
                       data_start=data[0], data_end=data[1])


@dataclass(frozen=True, kw_only=True)
class RankTimeline:
    """One rank's analysed steps as interval sets (int64 ns on the rank's own clock, base
    subtracted) and its collectives, for ingest.attribution. Per step i: window [lo_i, hi_i);
    compute, data_stall, pipeline_wait (PP ranks: exposed P2P kernels on GPU timelines, P2P
    ops on CPU ones), gaps (device idle outside data fetches and pipeline waits), rest
    (exposed memcpy/other kernels; host ops outside the phases on CPU) -- with exposed (collectives, not P2P on PP ranks) these tile the
    window. exposed_set / gap_set: the intervals behind exposed and gaps. Collectives
    (coll_*): one entry per collective kernel (GPU) or gloo worker range (CPU) in an analysed
    step, P2P left out on PP ranks: step, process group, kind (collective_kind), bytes (NaN:
    unknown), start and end."""

    timeline: str
    steps: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    compute: np.ndarray
    exposed: np.ndarray
    pipeline_wait: np.ndarray
    data_stall: np.ndarray
    gaps: np.ndarray
    rest: np.ndarray
    exposed_set: tuple[np.ndarray, np.ndarray]
    gap_set: tuple[np.ndarray, np.ndarray]
    coll_step: np.ndarray
    coll_group: tuple[str, ...]
    coll_kind: tuple[str, ...]
    coll_nbytes: np.ndarray
    coll_start: np.ndarray
    coll_end: np.ndarray
    # the trace time (us) of ns 0; its Unix-epoch time when the trace's clock is epoch time
    # (absolute ts, or ts relative to a known baseTimeNanoseconds), else None; how the steps
    # were found (TraceBreakdown.step_split)
    base_us: float = 0.0
    epoch_origin_us: float | None = None
    step_split: str | None = None
    replay: ReplayInput | None = None  # the chain ingest.whatif replays
    # PP ranks: per step, where the step's last P2P op ends (ns; -1: none): the waits after it
    # are the pipeline's drain (ingest.attribution)
    p2p_last: np.ndarray | None = None


def _last_end(a: tuple[np.ndarray, np.ndarray], lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Per window [lo_i, hi_i): where the last interval of ``a`` inside it ends (-1: none)."""
    s, e = a
    j = np.searchsorted(s, hi, side="left") - 1
    ok = (j >= 0) & (e[np.maximum(j, 0)] > lo) if s.size else np.zeros(lo.size, bool)
    return np.where(ok, np.minimum(e[np.maximum(j, 0)] if s.size else lo, hi), -1).astype(I64)


def _coll_order(c_step: np.ndarray, c_start: np.ndarray) -> np.ndarray:
    """The order RankTimeline keeps its collectives in: by step, then start."""
    return np.lexsort((c_start, c_step))


def _rank_timeline(*, timeline: str, steps: np.ndarray, lo: np.ndarray, hi: np.ndarray, compute: np.ndarray,
                   exposed_set: tuple[np.ndarray, np.ndarray], pipeline_set: tuple[np.ndarray, np.ndarray],
                   data_set: tuple[np.ndarray, np.ndarray], covered: tuple[np.ndarray, np.ndarray],
                   coll: tuple[np.ndarray, list[str], list[str], np.ndarray, np.ndarray, np.ndarray],
                   base_us: float) -> RankTimeline:
    """covered: everything that is not a gap (busy device / running host op, data, pipeline
    waits); gaps = windows minus covered."""
    windows = union(lo, hi)
    gap_set = minus(windows, covered)
    length = hi - lo
    exposed = measure(exposed_set, lo, hi)
    pipeline_wait = measure(pipeline_set, lo, hi)
    data_stall = measure(data_set, lo, hi)
    gaps = measure(gap_set, lo, hi)
    rest = length - compute - exposed - pipeline_wait - data_stall - gaps
    assert (rest >= 0).all(), "attribution partition broke"
    c_step, c_group, c_kind, c_bytes, c_start, c_end = coll
    order = _coll_order(c_step, c_start)
    return RankTimeline(timeline=timeline, steps=steps, lo=lo, hi=hi, compute=compute, exposed=exposed,
                        pipeline_wait=pipeline_wait, data_stall=data_stall, gaps=gaps, rest=rest,
                        exposed_set=exposed_set, gap_set=gap_set, coll_step=c_step[order],
                        coll_group=tuple(c_group[i] for i in order), coll_kind=tuple(c_kind[i] for i in order),
                        coll_nbytes=c_bytes[order], coll_start=c_start[order], coll_end=c_end[order], base_us=base_us)


def _ns(us: np.ndarray, base: float) -> np.ndarray:
    return np.rint((us - base) * NS_PER_US).astype(I64)


def _profiler_steps(c: _Collected) -> tuple[np.ndarray, np.ndarray, np.ndarray, int | None]:
    """ProfilerStep#k ranges of the training thread (the thread holding most of them): step
    numbers, starts and ends (us, float), sorted by start; one range per step number."""
    if not c.steps:
        return np.zeros(0, I64), np.zeros(0), np.zeros(0), None
    tids = [t for *_, t in c.steps]
    tid = max(set(tids), key=tids.count)
    seen: dict[int, tuple[float, float]] = {}
    for k, s, e, t in c.steps:
        if t == tid and k not in seen:
            seen[k] = (s, e)
    rows = sorted(seen.items(), key=lambda kv: kv[1][0])
    return (np.array([k for k, _ in rows], I64), np.array([v[0] for _, v in rows]),
            np.array([v[1] for _, v in rows]), tid)


# --- steps of a trace without ProfilerStep marks ------------------------------------------------

MAX_SPLIT_CANDIDATES = 64  # repeating names tried per thread / kernel sequence, fewest occurrences first


@dataclass(frozen=True, kw_only=True)
class _Split:
    """Steps found in an unmarked trace: method ("annotation" or "kernels"), the repeating
    name, and the step ranges (host us, sorted, disjoint) with the thread they were read on."""

    method: str
    name: str
    step_s: np.ndarray
    step_e: np.ndarray
    tid: int | None


def _period(seq: np.ndarray, occ: np.ndarray) -> int | None:
    """Length of the repeating segment when ``seq`` (name ids) repeats with a period that starts
    at each position in ``occ`` (>= 2 positions), else None. Repeating: at least half of the
    complete segments (occurrence to next occurrence) are the same sequence, and the last,
    possibly cut, segment agrees with it over their common length."""
    segs = [seq[a:b].tobytes() for a, b in zip(occ[:-1].tolist(), occ[1:].tolist())]
    modal = max(set(segs), key=segs.count)
    if 2 * segs.count(modal) < len(segs):
        return None
    last = seq[int(occ[-1]):].tobytes()
    n = min(len(last), len(modal))
    return len(modal) // seq.itemsize if last[:n] == modal[:n] else None


def _periodic_starts(seq: np.ndarray, candidates: list[int]) -> tuple[int, np.ndarray, int] | None:
    """The first candidate name id (in the order given) whose occurrences cut ``seq`` into a
    repeating segment: (name id, start positions of the periods, period length). The periods
    start at the trace's first element when the elements before the first occurrence are the
    tail of a period (the trace starts where an iteration starts), else at the occurrences."""
    for name in candidates[:MAX_SPLIT_CANDIDATES]:
        occ = np.flatnonzero(seq == name)
        if occ.size < 2:
            continue
        period = _period(seq, occ)
        if period is None:
            continue
        lead = int(occ[0])
        tail = seq[int(occ[0]) + period - lead:int(occ[0]) + period]
        if 0 < lead < period and np.array_equal(np.sort(seq[:lead]), np.sort(tail)):  # the same ops, any order
            occ = occ - lead
        return name, occ, period
    return None


def _order_candidates(seq: np.ndarray) -> list[int]:
    """Name ids of ``seq`` occurring at least twice, fewest occurrences first (a once-per-step
    name before a per-layer one), then by first position."""
    ids, first, counts = np.unique(seq, return_index=True, return_counts=True)
    keep = counts >= 2
    order = np.lexsort((first[keep], counts[keep]))
    return ids[keep][order].tolist()


def _split_by_annotation(c: _Collected) -> _Split | None:
    """Steps from a host range that repeats at the top level of a thread: user annotations
    (``record_function``) on any thread first (threads with the most host ops first), then
    cpu_op names. Step i runs from period start i to period start i+1; the last one to the end
    of its period's last top-level op."""
    h_ts, h_dur = np.frombuffer(c.h_ts, np.float64), np.frombuffer(c.h_dur, np.float64)
    h_tid, h_name = np.frombuffer(c.h_tid, np.int64), np.frombuffer(c.h_name, np.int64)
    h_annot = np.frombuffer(c.h_annot, np.int8).astype(bool)
    if h_ts.size == 0:
        return None
    threads = []
    for tid in np.argsort(-np.bincount(h_tid), kind="stable").tolist():
        idx = np.flatnonzero(h_tid == tid)
        if idx.size < 2:
            break
        end = h_ts[idx] + h_dur[idx]
        idx = idx[np.lexsort((-end, h_ts[idx]))]
        reach = np.maximum.accumulate(h_ts[idx] + h_dur[idx])
        top = np.ones(idx.size, bool)
        top[1:] = h_ts[idx][1:] >= reach[:-1]
        threads.append((tid, idx[top]))
    for annotations in (True, False):
        for tid, idx in threads:
            seq = h_name[idx]
            annot = set(seq[h_annot[idx]].tolist())
            found = _periodic_starts(seq, [n for n in _order_candidates(seq) if (n in annot) == annotations])
            if found is None:
                continue
            name, starts, period = found
            s, e = h_ts[idx], h_ts[idx] + h_dur[idx]
            step_s = s[starts]
            step_e = np.append(step_s[1:], e[int(starts[-1]):min(int(starts[-1]) + period, seq.size)].max())
            return _Split(method="annotation", name=c.names.names[name], step_s=step_s, step_e=step_e, tid=int(tid))
    return None


def _split_by_kernels(c: _Collected) -> _Split | None:
    """Steps from the repeating pattern of the GPU events in launch order: the period starts at a
    recurring kernel (fewest occurrences first); step i runs from the launch of period i's first
    event to the launch of period i+1's, the last one past its last launch."""
    g_corr, g_name = np.frombuffer(c.g_corr, np.int64), np.frombuffer(c.g_name, np.int64)
    l_ts, l_corr = np.frombuffer(c.l_ts, np.float64), np.frombuffer(c.l_corr, np.int64)
    if g_corr.size < 2 or l_corr.size == 0:
        return None
    order = np.argsort(l_corr, kind="stable")
    lc, lt = l_corr[order], l_ts[order]
    pos = np.clip(np.searchsorted(lc, g_corr), 0, lc.size - 1)
    matched = lc[pos] == g_corr
    # collectives and copies left out of the pattern: their launch order among the compute
    # kernels follows the gradient buckets' readiness and the data loader, which vary by step
    loose = np.array([bool(COMM_KERNEL_RE.match(n) or MEMORY_KERNEL_RE.match(n)) for n in c.names.names] or [False])
    matched &= ~loose[g_name]
    launch, seq = lt[pos][matched], g_name[matched]
    by_launch = np.argsort(launch, kind="stable")
    launch, seq = launch[by_launch], seq[by_launch]
    found = _periodic_starts(seq, _order_candidates(seq))
    if found is None:
        return None
    name, starts, period = found
    step_s = launch[starts]
    last = launch[min(int(starts[-1]) + period, seq.size) - 1]
    step_e = np.append(step_s[1:], last + 1.0)  # a launch is a point: keep the last inside
    return _Split(method="kernels", name=c.names.names[name], step_s=step_s, step_e=step_e, tid=None)


def _classify(names: list[str], table: tuple[tuple[str, re.Pattern[str]], ...]) -> list[str]:
    out = []
    for name in names:
        out.append(next((cls for cls, pat in table if pat.search(name)), "other"))
    return out


# classes that claim the ops nested inside them on CPU timelines (outermost wins)
_CONTEXT_CLASSES = ("comm", "loss", "optimizer", "attention", "gemm")


def _host_self_times(s: np.ndarray, e: np.ndarray, name_ids: list[int],
                     name_classes: list[str]) -> tuple[np.ndarray, list[str]]:
    """Self time (ns) and class of host ops sorted by (start, -end) on one thread: duration less
    the direct children's durations; class = that of the outermost enclosing op whose own class is
    in _CONTEXT_CLASSES, else the op's own."""
    n = s.size
    self_ns = (e - s).astype(np.int64)
    cls: list[str] = [""] * n
    stack: list[int] = []
    for i in range(n):
        while stack and s[i] >= e[stack[-1]]:
            stack.pop()
        own = name_classes[name_ids[i]]
        if stack:
            parent = stack[-1]
            self_ns[parent] -= min(e[i], e[parent]) - s[i]
            inherited = cls[parent] if cls[parent] in _CONTEXT_CLASSES else None
            cls[i] = inherited or own
        else:
            cls[i] = own
        stack.append(i)
    return np.maximum(self_ns, 0), cls


def _kernel_rows(*, run: str, rank: int, names: list[str], classes: list[str], name_ids: np.ndarray,
                 dur_ns: np.ndarray, num_steps: int,
                 op_classes: list[str] | None = None) -> tuple[KernelSummaryRow, ...]:
    """Per-name sums; with ``op_classes`` (one class per event) per (name, class) instead."""
    if name_ids.size == 0:
        return ()
    if op_classes is not None:
        keys = sorted(set(zip(name_ids.tolist(), op_classes)))
        key_index = {k: j for j, k in enumerate(keys)}
        ids = np.array([key_index[k] for k in zip(name_ids.tolist(), op_classes)], np.int64)
        return _kernel_rows(run=run, rank=rank, names=[names[n] for n, _ in keys], classes=[c for _, c in keys],
                            name_ids=ids, dur_ns=dur_ns, num_steps=num_steps)
    calls = np.bincount(name_ids, minlength=len(names))
    total = np.bincount(name_ids, weights=dur_ns.astype(np.float64), minlength=len(names))
    used = np.flatnonzero(calls)
    used = sorted(used.tolist(), key=lambda i: (-total[i], names[i]))
    return tuple(KernelSummaryRow(run=run, rank=rank, name=names[i], kernel_class=classes[i],
                                  num_calls=int(calls[i]), total_s=float(total[i]) / 1e9, num_steps=num_steps)
                 for i in used)


def _span_rows(*, run: str, rank: int, step: int, lo: int, hi: int,
               sets: dict[str, tuple[np.ndarray, np.ndarray]], max_spans: int) -> tuple[TimelineSpanRow, ...]:
    assert set(sets) == {*BREAKDOWN_CATEGORIES, "hidden_comm"}, sorted(sets)
    # the five categories tile [lo, hi); hidden_comm is an overlay on compute
    clipped = [(i, clip(sets[c], lo, hi)) for i, c in enumerate(BREAKDOWN_CATEGORIES)]
    ts = np.concatenate([a for _, (a, _) in clipped])
    te = np.concatenate([b for _, (_, b) in clipped])
    tc = np.concatenate([np.full(a.size, i) for i, (a, _) in clipped])
    order = np.argsort(ts, kind="stable")
    hidden = merge_gaps(clip(sets["hidden_comm"], lo, hi), max_spans // 4)
    ts, te, tc = tile(ts[order], te[order], tc[order], max_spans - hidden[0].size)
    rows = [TimelineSpanRow(run=run, rank=rank, step=step, category=BREAKDOWN_CATEGORIES[c], start_s=a, end_s=b)
            for a, b, c in zip(((ts - lo) / 1e9).tolist(), ((te - lo) / 1e9).tolist(), tc.tolist())]
    rows += [TimelineSpanRow(run=run, rank=rank, step=step, category="hidden_comm", start_s=a, end_s=b)
             for a, b in zip(((hidden[0] - lo) / 1e9).tolist(), ((hidden[1] - lo) / 1e9).tolist())]
    rows.sort(key=lambda r: (r.start_s, r.category))
    return tuple(rows)


def _step_rows(*, run: str, rank: int, timeline: str, steps: np.ndarray, length: np.ndarray, compute: np.ndarray,
               exposed: np.ndarray, bubble: np.ndarray, data_stall: np.ndarray, other: np.ndarray,
               hidden: np.ndarray, idle: np.ndarray, num_kernels: np.ndarray) -> tuple[StepBreakdownRow, ...]:
    """One StepBreakdownRow per analysed step from per-step integer-ns arrays (same order)."""
    return tuple(
        StepBreakdownRow(run=run, rank=rank, step=int(steps[i]), timeline=timeline,
                         step_time_s=int(length[i]) / 1e9, compute_s=int(compute[i]) / 1e9,
                         exposed_comm_s=int(exposed[i]) / 1e9, bubble_s=int(bubble[i]) / 1e9,
                         data_stall_s=int(data_stall[i]) / 1e9, other_s=int(other[i]) / 1e9,
                         hidden_comm_s=int(hidden[i]) / 1e9, idle_s=int(idle[i]) / 1e9,
                         num_kernels=int(num_kernels[i]))
        for i in range(len(steps)))


def _median_index(durations: np.ndarray) -> int:
    """Index of the lower-median duration (a real step, not an average of two)."""
    order = np.argsort(durations, kind="stable")
    return int(order[(durations.size - 1) // 2])


def compute_step_breakdown(events: Iterable[dict[str, Any]], *, run: str, rank: int, pp_degree: int,
                           max_spans: int = 2000, unmarked: str = "skip",
                           base_time_ns: int | None = None) -> TraceBreakdown:
    """Where each profiled step's time went on one rank: GPU timeline if the trace has GPU
    events, else the CPU timeline of the training thread.

    events: the trace's event dicts (``iter_trace_events``), consumed once; only GPU events,
    launch (runtime/driver) calls and host ops are kept, as flat arrays. pp_degree: the run's
    pipeline degree; bubble_s is 0 unless pp_degree > 1. max_spans: cap on TimelineSpanRow
    records (segments shorter than a doubling threshold, from 1 us, are absorbed by their
    predecessor until it holds; the spans still tile the step).

    GPU step k (launched inside ProfilerStep#k; the last ProfilerStep is dropped as in HTA):
    interval [end of the previous analysed step, last end of k's GPU events] -- the boundaries
    of the recorder's CUDA end events, so the GPU idle while the host fetches step k's batch
    (its ``data`` range) is step k's data stall; the first analysed step starts at its first
    GPU event (the profiler's warm-up step before it is not traced) and the last one ends at
    the dropped step's first GPU event when that is later, so the analysed window is HTA's
    and its total matches the recorder's over the same steps (the two leading data fetches
    outside/inside the window balance). Sets over all analysed
    GPU events, clipped to the interval: C = compute kernels, M = comm (``^nccl.*Kernel``),
    P = P2P comm kernels, A = all, D = host ``data`` ranges. Then compute = |C|,
    exposed_comm = |M \\ C| - bubble's P2P part, hidden_comm = |M ∩ C|, idle = |W \\ A|,
    data_stall = |(W \\ A) ∩ D|, bubble (pp > 1) = |P \\ C| + |(R \\ A) \\ D| with R the span
    from the step's first to its last compute kernel, other = the rest (exposed memcpy/memset,
    other kernels, idle outside R and the data range). Summed over the steps, compute and idle
    equal HTA's get_temporal_breakdown (hta/analyzers/breakdown_analysis.py) compute_time and
    idle_time, and step_time - compute - idle its non_compute_time, up to (a) HTA's default
    rounding of every start up and end down to whole microseconds (HTA_DISABLE_NS_ROUNDING=1
    turns it off; with ~9k kernels a step of 1-3 us it moves ~1.7 pp from compute to idle) and
    (b) HTA's cut-off, which keeps the first copies of the dropped step launched before its
    GPU-side ProfilerStep annotation starts (~0.1 pp on the H200 traces).

    CPU step k: the ProfilerStep#k range W on the training thread. comm = the thread's
    communication ops (CPU_COMM_RE) plus gloo worker-thread comm ranges while the training
    thread runs no op (a blocked wait, as DDP's reducer does); on pp ranks the send/recv part
    of comm is bubble; data_stall = the ``data`` range; compute = forward/backward/optimizer
    ranges minus comm and data; other = the rest. hidden_comm = worker-thread comm while the
    training thread runs an op; idle = time the training thread runs no op.

    unmarked: what to do with a trace without ProfilerStep#k ranges (a user's own trace,
    profiled without a schedule): "skip" (no steps, a warning), "whole" (the whole trace is
    one window, step 0: from its first host op or launch to its last, on the thread with the
    most host ops; said in a warning) or "split": steps 0..n-1 cut where (a) a host range
    repeats at the top level of a thread (a ``record_function`` annotation such as
    "train_step" or "Optimizer.step#AdamW.step", else a cpu_op name) with the same sequence of
    top-level ops between its occurrences, else (b) where the GPU events, in launch order,
    repeat with a kernel that recurs, else (c) one window as "whole". The method used is
    ``TraceBreakdown.step_split`` and said in a warning; with a GPU timeline the last period is
    dropped as a last ProfilerStep is.

    Timestamps: any finite ts is accepted (Kineto's relative microseconds, or the absolute
    Unix-epoch microseconds, ~1.7e15, older Kineto wrote); every time is taken relative to the
    trace's own first event. Events more than OUTLIER_SPAN_US from the median ts, or longer,
    are left out and named in a warning. base_time_ns: the document's ``baseTimeNanoseconds``
    (ts are relative to it) when known; with it, or with epoch ts, the rank timeline records
    its epoch origin (``RankTimeline.epoch_origin_us``).

    Never raises on content: steps without events and malformed events become warnings.
    Raises ValueError for pp_degree < 1 or an unknown ``unmarked``. Returns TraceBreakdown
    (times in seconds).
    """
    if pp_degree < 1:
        raise ValueError(f"pp_degree must be >= 1, got {pp_degree}")
    if unmarked not in UNMARKED_CHOICES:
        raise ValueError(f"unmarked must be one of {UNMARKED_CHOICES}, got {unmarked!r}")
    c = _collect(events)
    warnings: list[str] = []
    if c.num_ignored:
        warnings.append(Message(N_("%(num)s complete events without usable ts/dur/name/args were ignored"), num=c.num_ignored))
    outliers = _drop_outliers(c)
    if outliers:
        warnings.append(outliers)
    result = _breakdown(c, run=run, rank=rank, pp_degree=pp_degree, max_spans=max_spans, unmarked=unmarked,
                        warnings=warnings)
    return _with_clock(result, c, base_time_ns=base_time_ns)


UNMARKED_CHOICES = ("skip", "whole", "split")
STEP_SPLIT_PREFIX = "no ProfilerStep marks: steps split by"
WHOLE_TRACE_WARNING = Message(N_("no ProfilerStep marks: the whole trace is analysed as one window (step 0), from its "
                                 "first host op or launch to its last"))
WINDOW_WARNING = Message(N_("no ProfilerStep marks, no repeating annotation and no repeating kernel pattern: the whole "
                            "trace is analysed as one window (step 0), from its first host op or launch to its last"))
# a split trace's steps are not ProfilerSteps: _steps_breakdown's warnings as the split words them
_SPLIT_WORDING = {
    N_("%(num)s GPU events were launched outside every ProfilerStep of the trace; left out as in HTA"):
        N_("%(num)s GPU events were launched outside every step of the trace; left out as in HTA"),
    N_("no GPU event was launched inside an analysed ProfilerStep"): N_("no GPU event was launched inside an analysed step"),
    N_("ProfilerStep(s) %(steps)s launched no GPU event; not analysed"): N_("step(s) %(steps)s launched no GPU event; not analysed"),
}


def _steps_breakdown(c: _Collected, step_k, step_s, step_e, tid: int, *, run: str, rank: int, pp_degree: int,
                     max_spans: int, warnings: list[str]) -> TraceBreakdown:
    """The GPU breakdown of the given steps when the trace has device events, else the CPU one."""
    if len(c.g_ts):
        return _gpu_breakdown(c, step_k, step_s, step_e, run=run, rank=rank, pp_degree=pp_degree,
                              max_spans=max_spans, warnings=warnings)
    return _cpu_breakdown(c, step_k, step_s, step_e, tid, run=run, rank=rank, pp_degree=pp_degree,
                          max_spans=max_spans, warnings=warnings)


def _breakdown(c: _Collected, *, run: str, rank: int, pp_degree: int, max_spans: int, unmarked: str,
               warnings: list[str]) -> TraceBreakdown:
    step_k, step_s, step_e, tid = _profiler_steps(c)
    if step_k.size:
        result = _steps_breakdown(c, step_k, step_s, step_e, tid, run=run, rank=rank, pp_degree=pp_degree,
                                  max_spans=max_spans, warnings=warnings)
        return dataclasses.replace(result, step_split="marks")
    if unmarked == "split":
        split = _split_by_annotation(c) or (_split_by_kernels(c) if len(c.g_ts) else None)
        if split is not None:
            n = split.step_s.size
            period_ms = float(np.median(np.diff(split.step_s))) / 1e3 if n > 1 else float("nan")
            what = Message(N_("annotation")) if split.method == "annotation" else Message(N_("kernel"))
            said = Message(N_("no ProfilerStep marks: steps split by the repeating %(what)s %(name)s (%(num)s periods, one "
                              "every %(period)s ms, the last one not analysed as with marks)") if len(c.g_ts) else
                           N_("no ProfilerStep marks: steps split by the repeating %(what)s %(name)s (%(num)s periods, one "
                              "every %(period)s ms)"), what=what, name=repr(split.name), num=n, period=f"{period_ms:.3g}")
            own: list[str] = []
            result = _steps_breakdown(c, np.arange(n, dtype=I64), split.step_s, split.step_e, split.tid, run=run,
                                      rank=rank, pp_degree=pp_degree, max_spans=max_spans, warnings=own)
            own = [Message(_SPLIT_WORDING[w.msgid], **w.params) if isinstance(w, Message) and w.msgid in _SPLIT_WORDING
                   else w.replace("ProfilerStep(s)", "step(s)").replace("ProfilerStep", "step") for w in own]
            return dataclasses.replace(result, warnings=tuple(warnings + [said] + own), step_split=split.method,
                                       step_split_name=split.name)
    if unmarked in ("whole", "split") and (len(c.h_ts) or len(c.l_ts)):
        result = _whole_trace_breakdown(c, run=run, rank=rank, pp_degree=pp_degree, max_spans=max_spans,
                                        warnings=warnings,
                                        said=WINDOW_WARNING if unmarked == "split" else WHOLE_TRACE_WARNING)
        if result is not None:
            return dataclasses.replace(result, step_split="window")
    warnings.append(Message(N_("no ProfilerStep#<k> range in the trace: cannot split it into steps (profile with "
                               "torch.profiler's schedule and call prof.step())")))
    return TraceBreakdown(steps=(), kernels=(), spans=(), timeline=None, warnings=tuple(warnings))


def _with_clock(result: TraceBreakdown, c: _Collected, *, base_time_ns: int | None) -> TraceBreakdown:
    """Say on the rank timeline whether its clock is Unix-epoch time (shared by every rank whose
    host clock is synchronised) and where its zero lies."""
    tl = result.rank_timeline
    if tl is None:
        return result
    offset_us = base_time_ns / NS_PER_US if base_time_ns else 0.0
    epoch = tl.base_us + offset_us >= EPOCH_MIN_US
    return dataclasses.replace(result, rank_timeline=dataclasses.replace(
        tl, epoch_origin_us=tl.base_us + offset_us if epoch else None, step_split=result.step_split))


def _whole_trace_breakdown(c: _Collected, *, run: str, rank: int, pp_degree: int, max_spans: int,
                           warnings: list[str], said: str = WHOLE_TRACE_WARNING) -> TraceBreakdown | None:
    """compute_step_breakdown's one-window reading: one synthetic step 0 over the whole
    trace (every launch and host op inside it), then the same GPU or CPU breakdown."""
    h_ts, h_dur = np.frombuffer(c.h_ts, np.float64), np.frombuffer(c.h_dur, np.float64)
    l_ts = np.frombuffer(c.l_ts, np.float64)
    starts = np.concatenate([h_ts, l_ts])
    ends = np.concatenate([h_ts + h_dur, l_ts])
    if not starts.size:
        return None
    h_tid = np.frombuffer(c.h_tid, np.int64)
    tid = int(np.bincount(h_tid).argmax()) if h_tid.size else 0
    lo, hi = float(starts.min()), float(ends.max()) + 1.0  # launches are points: keep the last inside
    step_k, step_s, step_e = np.zeros(1, I64), np.array([lo]), np.array([hi])
    own: list[str] = []
    result = _steps_breakdown(c, step_k, step_s, step_e, tid, run=run, rank=rank, pp_degree=pp_degree,
                              max_spans=max_spans, warnings=own)
    own = [w for w in own if not w.startswith("only one ProfilerStep")]
    return dataclasses.replace(result, warnings=tuple(warnings + [said] + own))


def _gpu_breakdown(c: _Collected, step_k: np.ndarray, step_s: np.ndarray, step_e: np.ndarray, *,
                   run: str, rank: int, pp_degree: int, max_spans: int, warnings: list[str]) -> TraceBreakdown:
    g_ts, g_dur = np.frombuffer(c.g_ts, np.float64), np.frombuffer(c.g_dur, np.float64)
    g_corr, g_name = np.frombuffer(c.g_corr, np.int64), np.frombuffer(c.g_name, np.int64)
    l_ts, l_corr = np.frombuffer(c.l_ts, np.float64), np.frombuffer(c.l_corr, np.int64)
    num_analysed = step_k.size - 1 if step_k.size > 1 else 1
    if step_k.size == 1:
        warnings.append(Message(N_("only one ProfilerStep in the trace; it is analysed although its last kernels may be "
                                   "cut off (HTA warns the same)")))
    # launch time of each GPU event via its correlation id
    order = np.argsort(l_corr, kind="stable")
    lc, lt = l_corr[order], l_ts[order]
    pos = np.clip(np.searchsorted(lc, g_corr), 0, max(lc.size - 1, 0))
    matched = (lc.size > 0) & (lc[pos] == g_corr) if lc.size else np.zeros(g_corr.size, bool)
    launch = np.where(matched, lt[pos] if lc.size else 0.0, np.nan)
    # the step whose ProfilerStep range holds the launch
    si = np.searchsorted(step_s, launch, side="right") - 1
    sic = np.maximum(si, 0)
    launched_in = matched & (si >= 0) & (launch < step_e[sic])
    # HTA drops the last ProfilerStep (its kernels may run past the end of the trace); its
    # first GPU event still marks where the analysed window ends
    in_step = launched_in & (si < num_analysed)
    in_next = launched_in & (si == num_analysed)
    step_k, step_s, step_e = step_k[:num_analysed], step_s[:num_analysed], step_e[:num_analysed]
    num_unlaunched = int((~matched).sum())
    if num_unlaunched:
        warnings.append(Message(N_("%(num)s GPU events have no launch (correlation) in the trace; left out"), num=num_unlaunched))
    # the dropped last step's events are left out by design (as in HTA); others are worth a word
    num_outside = int((matched & ~in_step & ~in_next).sum())
    if num_outside:
        warnings.append(Message(N_("%(num)s GPU events were launched outside every ProfilerStep of the trace; left out as "
                                   "in HTA"), num=num_outside))
    if not in_step.any():
        warnings.append(Message(N_("no GPU event was launched inside an analysed ProfilerStep")))
        return TraceBreakdown(steps=(), kernels=(), spans=(), timeline="gpu", warnings=tuple(warnings))
    ev_step, ts_us, dur_us, name = sic[in_step], g_ts[in_step], g_dur[in_step], g_name[in_step]
    base = float(ts_us.min())
    start = _ns(ts_us, base)
    end = start + np.maximum(np.rint(dur_us * NS_PER_US).astype(I64), 0)

    names = c.names.names
    is_comm = np.array([bool(COMM_KERNEL_RE.match(n)) for n in names], bool)
    is_mem = np.array([bool(MEMORY_KERNEL_RE.match(n)) for n in names], bool)
    is_compute = np.array([not NON_COMPUTE_KERNEL_RE.match(n) for n in names], bool) & ~is_comm & ~is_mem
    is_p2p = is_comm & np.array([bool(P2P_KERNEL_RE.search(n)) for n in names], bool)

    # analysed steps: those that launched at least one GPU event, in step order
    used = np.unique(ev_step)
    first = np.full(step_k.size, np.iinfo(np.int64).max, I64)
    np.minimum.at(first, ev_step, start)
    # Step k ends when its last GPU event ends (where the recorder's CUDA end event sits) and
    # starts where step k-1 ended, so the idle gap while the host builds step k's batch belongs
    # to step k (its data stall). The first analysed step starts at its first GPU event: the
    # profiler's warm-up step before it is not in the trace.
    # The last analysed step ends where the dropped step's GPU work starts (if later), so the
    # window is HTA's: the GPU idle while the host fetched the dropped step's batch is counted
    # in it, balancing the first step's own fetch, which precedes the trace's first kernel.
    last = np.full(step_k.size, np.iinfo(np.int64).min, I64)
    np.maximum.at(last, ev_step, end)
    hi = np.maximum.accumulate(last[used])
    if in_next.any():
        hi[-1] = max(int(hi[-1]), int(_ns(g_ts[in_next], base).min()))
    lo = np.append(min(int(first[used][0]), int(hi[0])), hi[:-1])
    num_kernels = np.bincount(ev_step, minlength=step_k.size)[used]
    if used.size < step_k.size:
        missing = sorted(set(step_k.tolist()) - set(step_k[used].tolist()))
        warnings.append(Message(N_("ProfilerStep(s) %(steps)s launched no GPU event; not analysed"), steps=missing))

    A = union(start, end)
    cm = is_compute[name]
    C = union(start[cm], end[cm])
    mm = is_comm[name]
    M = union(start[mm], end[mm])
    MC = union_of(M, C)
    # host data-loading ranges (any thread; the runner annotates them on the training thread)
    data_id = c.names.ids.get(DATA_RANGE)
    h_name = np.frombuffer(c.h_name, np.int64)
    dm = (h_name == data_id) if data_id is not None else np.zeros(h_name.size, bool)
    d_ts = np.frombuffer(c.h_ts, np.float64)[dm]
    D = union(_ns(d_ts, base), _ns(d_ts + np.frombuffer(c.h_dur, np.float64)[dm], base))
    DA = intersect(D, A)

    length = hi - lo
    compute = measure(C, lo, hi)
    exposed_all = measure(MC, lo, hi) - compute
    hidden = measure(M, lo, hi) + compute - measure(MC, lo, hi)
    busy = measure(A, lo, hi)
    idle = length - busy
    data_stall = measure(D, lo, hi) - measure(DA, lo, hi)
    bubble = np.zeros_like(length)
    span_sets: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    exposed_set = minus(M, C)
    idle_set_data = minus(D, A)
    if pp_degree > 1:
        pm = is_p2p[name]
        P = union(start[pm], end[pm])
        p2p_exposed = measure(union_of(P, C), lo, hi) - compute
        # R: from the first to the last compute kernel inside each window
        cs, ce = C
        i0 = np.searchsorted(ce, lo, side="right")
        i1 = np.searchsorted(cs, hi, side="left") - 1
        ok = (i0 <= i1) & (i0 < cs.size) & (i1 >= 0)
        r0 = np.where(ok, np.maximum(cs[np.minimum(i0, cs.size - 1)] if cs.size else lo, lo), lo)
        r1 = np.where(ok, np.minimum(ce[np.maximum(i1, 0)] if cs.size else lo, hi), lo)
        r1 = np.maximum(r1, r0)
        idle_r = (r1 - r0) - measure(A, r0, r1)
        stall_r = measure(D, r0, r1) - measure(DA, r0, r1)
        bubble = p2p_exposed + idle_r - stall_r
        exposed_comm = exposed_all - p2p_exposed
        R = union(r0[ok], r1[ok])
        bubble_set = union_of(minus(P, C), minus(minus(R, A), D))
        exposed_set = minus(exposed_set, P)
    else:
        exposed_comm = exposed_all
        bubble_set = EMPTY
    other = length - compute - exposed_comm - bubble - data_stall
    assert (other >= 0).all() and (idle >= 0).all() and (data_stall >= 0).all(), "partition broke"

    rows = _step_rows(run=run, rank=rank, timeline="gpu", steps=step_k[used], length=length, compute=compute,
                      exposed=exposed_comm, bubble=bubble, data_stall=data_stall, other=other, hidden=hidden,
                      idle=idle, num_kernels=num_kernels)
    # pipeline waits for the cross-rank pass: exposed P2P kernels only (a receive waits on the
    # device); idle between kernels inside the step is host launch time there, as elsewhere
    p2p_wait = minus(union(start[is_p2p[name]], end[is_p2p[name]]), C) if pp_degree > 1 else EMPTY
    # collectives for the cross-rank pass: comm kernels (P2P ones are pipeline traffic on PP ranks)
    coll_mask = is_comm[name] & (~is_p2p[name] if pp_degree > 1 else True)
    orig = np.flatnonzero(in_step)[coll_mask]
    args = [c.comm_args.get(int(i)) for i in orig]
    kinds = [collective_kind(names[n]) for n in name[coll_mask].tolist()]
    nbytes = np.array([_coll_bytes(k, a) for k, a in zip(kinds, args)], np.float64)
    groups = [a[0] if a else "?" for a in args]
    used_pos = np.searchsorted(used, ev_step[coll_mask])
    rank_tl = _rank_timeline(
        timeline="gpu", steps=step_k[used], lo=lo, hi=hi, compute=compute, exposed_set=exposed_set,
        pipeline_set=p2p_wait, data_set=idle_set_data, covered=union_of(A, D),
        coll=(step_k[used][used_pos], groups, kinds, nbytes, start[coll_mask], end[coll_mask]), base_us=base)
    launch_us = launch[in_step]
    launch_ns = np.full(launch_us.size, NO_LAUNCH, I64)
    launch_ns[~np.isnan(launch_us)] = _ns(launch_us[~np.isnan(launch_us)], base)
    nc = np.flatnonzero(~coll_mask)
    nc = nc[np.lexsort((-end[nc], start[nc]))]
    # the dropped step's first kernel: where the last window ends, and when its launch came
    nxt = np.flatnonzero(in_next)
    first_next = nxt[np.argmin(g_ts[nxt])] if nxt.size else None
    work = [] if first_next is None else [(int(hi[-1]), int(hi[-1]), WORK_CATS.index("other"),
                                           int(_ns(launch[first_next:first_next + 1], base)[0]))]
    if nc.size:
        run_max = np.maximum.accumulate(end[nc])
        first_of = np.flatnonzero(np.append(True, start[nc][1:] >= run_max[:-1]))
        c_end = np.maximum.reduceat(end[nc], first_of)
        has_compute = np.maximum.reduceat(is_compute[name[nc]].astype(np.int8), first_of)
        has_p2p = np.maximum.reduceat(is_p2p[name[nc]].astype(np.int8), first_of)
        cats = np.where(has_compute > 0, WORK_CATS.index("compute"),
                        np.where(has_p2p > 0, WORK_CATS.index("pipeline"), WORK_CATS.index("other")))
        work += list(zip(start[nc][first_of].tolist(), c_end.tolist(), cats.tolist(),
                         launch_ns[nc][first_of].tolist()))
    blk = minus(exposed_set, union(start[nc], end[nc]))
    s_ts = np.frombuffer(c.s_ts, np.float64)
    sync_s = _ns(s_ts, base)
    sync_e = sync_s + np.rint(np.frombuffer(c.s_dur, np.float64) * NS_PER_US).astype(I64)
    c_order = _coll_order(step_k[used][used_pos], start[coll_mask])
    replay = _replay_input(lo=lo, hi=hi, work=work, waits=_wait_items(blk, rank_tl.coll_end, 2_000),
                           coll_launch=launch_ns[coll_mask][c_order], sync=(sync_s, sync_e), data=D)
    rank_tl = dataclasses.replace(rank_tl, replay=replay, p2p_last=_last_end(P, lo, hi) if pp_degree > 1 else None)
    classes = _classify(names, KERNEL_CLASS_PATTERNS)
    kernels = _kernel_rows(run=run, rank=rank, names=names, classes=classes, name_ids=name,
                           dur_ns=end - start, num_steps=len(rows))
    j = _median_index(length)
    lo_j, hi_j = int(lo[j]), int(hi[j])
    window = (np.array([lo_j], I64), np.array([hi_j], I64))
    sets = {"compute": C, "hidden_comm": intersect(M, C), "exposed_comm": exposed_set,
            "bubble": bubble_set, "data_stall": idle_set_data}
    sets["other"] = minus(window, union_of(C, exposed_set, bubble_set, idle_set_data))
    spans = _span_rows(run=run, rank=rank, step=int(step_k[used[j]]), lo=lo_j, hi=hi_j, sets=sets,
                       max_spans=max_spans)
    return TraceBreakdown(steps=rows, kernels=kernels, spans=spans, timeline="gpu", warnings=tuple(warnings),
                          rank_timeline=rank_tl)


def _cpu_replay_input(lo: np.ndarray, hi: np.ndarray, *, wait: tuple[np.ndarray, np.ndarray],
                      classes: tuple[tuple[str, tuple[np.ndarray, np.ndarray]], ...],
                      coll_end: np.ndarray) -> ReplayInput:
    """A CPU rank's windows tiled into replay items: exposed collective waits, then each class's
    set in priority order, the rest "other" (host ops outside the phases)."""
    windows = union(lo, hi)
    sets = [wait, *(st for _, st in classes)]
    cuts = np.unique(np.concatenate([windows[0], windows[1], *(a for st in sets for a in st)]))
    a, b = cuts[:-1], cuts[1:]
    mid = a + (b - a) // 2

    def inside(st: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
        i = np.searchsorted(st[0], mid, side="right") - 1
        return (i >= 0) & (mid < st[1][np.maximum(i, 0)]) if st[0].size else np.zeros(mid.size, bool)

    keep = inside(windows) & (b > a)
    label = np.full(mid.size, WORK_CATS.index("other"), np.int64)
    for name, st in reversed(classes):
        label[inside(st)] = WORK_CATS.index(name)
    is_wait = inside(wait)
    label[is_wait] = -1
    a, b, label = a[keep], b[keep], label[keep]
    # merge touching pieces of one class
    new = np.append(True, (label[1:] != label[:-1]) | (a[1:] != b[:-1]))
    first = np.flatnonzero(new)
    last = np.append(first[1:] - 1, a.size - 1)
    work = [(int(a[i]), int(b[j]), int(label[i]), NO_LAUNCH) for i, j in zip(first, last) if label[i] >= 0]
    waited = [i for i in range(first.size) if label[first[i]] < 0]
    blk = (a[first[waited]], b[last[waited]])
    return _replay_input(lo=lo, hi=hi, work=work, waits=_wait_items(blk, coll_end, 200_000), coll_launch=np.full(
        coll_end.size, NO_LAUNCH, np.int64), sync=(_EMPTY_I, _EMPTY_I), data=(_EMPTY_I, _EMPTY_I))


def _cpu_breakdown(c: _Collected, step_k: np.ndarray, step_s: np.ndarray, step_e: np.ndarray, tid: int | None,
                   *, run: str, rank: int, pp_degree: int, max_spans: int, warnings: list[str]) -> TraceBreakdown:
    base = float(step_s[0])
    lo, hi = _ns(step_s, base), _ns(step_e, base)
    h_ts, h_dur = np.frombuffer(c.h_ts, np.float64), np.frombuffer(c.h_dur, np.float64)
    h_tid, h_name = np.frombuffer(c.h_tid, np.int64), np.frombuffer(c.h_name, np.int64)
    h_annot = np.frombuffer(c.h_annot, np.int8).astype(bool)
    start = _ns(h_ts, base)
    end = start + np.maximum(np.rint(h_dur * NS_PER_US).astype(I64), 0)
    names = c.names.names
    name_comm = np.array([bool(CPU_COMM_RE.search(n)) for n in names], bool)
    name_p2p = name_comm & np.array([bool(CPU_P2P_RE.search(n)) for n in names], bool)
    name_fbo = np.array([n in CPU_COMPUTE_RANGES for n in names], bool)
    name_data = np.array([n == DATA_RANGE for n in names], bool)
    if not names:
        name_comm = name_p2p = name_fbo = name_data = np.zeros(1, bool)
        h_name = np.zeros(0, np.int64)

    on_t = h_tid == tid
    ops_t = on_t & ~h_annot
    comm_t = on_t & name_comm[h_name]
    comm_bg = ~on_t & name_comm[h_name]
    B = union(np.concatenate([start[ops_t], start[comm_t]]), np.concatenate([end[ops_t], end[comm_t]]))
    bg = union(start[comm_bg], end[comm_bg])
    comm = union_of(union(start[comm_t], end[comm_t]), minus(bg, B))
    p2p_t, p2p_bg = comm_t & name_p2p[h_name], comm_bg & name_p2p[h_name]
    P = union_of(union(start[p2p_t], end[p2p_t]), minus(union(start[p2p_bg], end[p2p_bg]), B))
    dm = on_t & h_annot & name_data[h_name]
    D = union(start[dm], end[dm])
    fm = on_t & h_annot & name_fbo[h_name]
    F = union(start[fm], end[fm])

    comm_nd = minus(comm, D)
    bubble_set = minus(P, D) if pp_degree > 1 else EMPTY
    exposed_set = minus(comm_nd, bubble_set)
    compute_set = minus(minus(F, D), comm)
    length = hi - lo
    data_stall = measure(D, lo, hi)
    bubble = measure(bubble_set, lo, hi)
    exposed = measure(exposed_set, lo, hi)
    compute = measure(compute_set, lo, hi)
    other = length - compute - exposed - bubble - data_stall
    hidden = measure(intersect(bg, B), lo, hi)
    idle = length - measure(B, lo, hi)
    assert (other >= 0).all(), "partition broke"

    op_start = start[ops_t]
    si = np.searchsorted(lo, op_start, side="right") - 1
    in_step = (si >= 0) & (op_start < hi[np.maximum(si, 0)])
    num_ops = np.bincount(si[in_step], minlength=lo.size)
    rows = _step_rows(run=run, rank=rank, timeline="cpu", steps=step_k, length=length, compute=compute,
                      exposed=exposed, bubble=bubble, data_stall=data_stall, other=other, hidden=hidden, idle=idle,
                      num_kernels=num_ops)
    # collectives for the cross-rank pass: gloo's worker-thread ranges (the work itself; the
    # training thread's c10d op only enqueues it), P2P left out on PP ranks
    gloo = np.array([n.startswith("gloo:") for n in names], bool) if names else np.zeros(1, bool)
    cm = comm_bg & gloo[h_name] & (~name_p2p[h_name] if pp_degree > 1 else True)
    cs, ce = start[cm], end[cm]
    ci = np.searchsorted(lo, cs, side="right") - 1
    ok = (ci >= 0) & (cs < hi[np.maximum(ci, 0)])
    cnames = [names[n] for n in h_name[cm][ok].tolist()]
    rank_tl = _rank_timeline(
        timeline="cpu", steps=step_k, lo=lo, hi=hi, compute=compute, exposed_set=exposed_set,
        pipeline_set=bubble_set, data_set=D, covered=union_of(B, comm, D, F),
        coll=(step_k[ci[ok]], ["gloo"] * len(cnames), [collective_kind(n) for n in cnames],
              np.full(len(cnames), np.nan), cs[ok], ce[ok]), base_us=base)
    rank_tl = dataclasses.replace(rank_tl, p2p_last=_last_end(P, lo, hi) if pp_degree > 1 else None,
                                  replay=_cpu_replay_input(
        lo, hi, wait=exposed_set, classes=(("pipeline", bubble_set), ("data_stall", D), ("launch_gaps", rank_tl.gap_set),
                                           ("compute", compute_set)), coll_end=rank_tl.coll_end))
    # kernel summary: every host op of the training thread with its self time (its duration less
    # its direct children's), so nothing is counted twice (aten::linear -> aten::addmm), classed by
    # its outermost ancestor of a specific class (_host_self_times): the aten::lerp_ of a foreach
    # AdamW is optimizer time, the aten::bmm of a math-path attention attention time
    idx = np.flatnonzero(ops_t)
    idx = idx[np.lexsort((-end[idx], start[idx]))]  # by start, the enclosing op first
    s_t, e_t = start[idx], end[idx]
    sl = np.searchsorted(lo, s_t, side="right") - 1
    keep = (sl >= 0) & (s_t < hi[np.maximum(sl, 0)])
    name_classes = _classify(names, HOST_CLASS_PATTERNS)
    # ops inside the trainers' "optimizer" phase range (runner.strategies.common.phase) are optimizer
    # time whatever their name (a single-tensor AdamW's aten::lerp_), except communication
    om = on_t & h_annot & np.array([n == OPTIMIZER_RANGE for n in names] or [False], bool)[h_name]
    opt_s, opt_e = union(start[om], end[om])
    j = np.searchsorted(opt_s, s_t, side="right") - 1
    in_opt = (j >= 0) & (s_t < opt_e[np.maximum(j, 0)]) if opt_s.size else np.zeros(s_t.size, bool)
    self_ns, op_class = _host_self_times(s_t, e_t, h_name[idx].tolist(), name_classes)
    op_class = ["optimizer" if o and c != "comm" else c for o, c in zip(in_opt.tolist(), op_class)]
    kernels = _kernel_rows(run=run, rank=rank, names=names, classes=name_classes, name_ids=h_name[idx][keep],
                           dur_ns=self_ns[keep], num_steps=len(rows), op_classes=[op_class[i] for i in
                                                                                   np.flatnonzero(keep)])
    j = _median_index(length)
    lo_j, hi_j = int(lo[j]), int(hi[j])
    window = (np.array([lo_j], I64), np.array([hi_j], I64))
    sets = {"compute": compute_set, "hidden_comm": intersect(bg, B), "exposed_comm": exposed_set,
            "bubble": bubble_set, "data_stall": D}
    sets["other"] = minus(window, union_of(compute_set, exposed_set, bubble_set, D))
    spans = _span_rows(run=run, rank=rank, step=int(step_k[j]), lo=lo_j, hi=hi_j, sets=sets, max_spans=max_spans)
    return TraceBreakdown(steps=rows, kernels=kernels, spans=spans, timeline="cpu", warnings=tuple(warnings),
                          rank_timeline=rank_tl)
