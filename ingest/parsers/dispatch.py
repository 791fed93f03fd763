"""Dispatch: route a text's lines to every parser whose grammar claims them (``parse_text``).
Kept apart from ``ingest.parsers`` so the parsers import it and this module imports them without a
circle.

A text is not one kind: each line goes to the parsers whose gate claims it (``build_chain``),
whatever else the file holds, and the file's kinds are the kinds whose parsers recognised lines.
Only whole-text formats are chosen from the head (``detect_kind``): a Chrome trace and a printed
flight-recorder dump (read as one literal), and an ``nvidia-smi -q`` report with its banner (read
with its indentation, which the line normaliser strips).
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Iterable

from ingest.parsers import (
    HEAD_CHARS, LineParser, ParseResult, collect_env, deepspeed, deepspeed_tables, detect_kind, failures,
    flight_recorder, fr_analyzer, hf_trainer, megatron, nanogpt, nccl, nccl_ras, nsys_stats, nvidia_smi, profiler_table, pyspy, run_parsers, torchtitan,
)

PARSERS: dict[str, Callable[..., ParseResult]] = {  # kind -> the parser of that kind alone (kind=...)
    "nccl": nccl.parse_nccl, "megatron": megatron.parse_megatron, "deepspeed": deepspeed.parse_deepspeed,
    "torchtitan": torchtitan.parse_torchtitan, "nvidia_smi_topo": nvidia_smi.parse_nvidia_smi_topo,
    "nvidia_smi_q": nvidia_smi.parse_nvidia_smi_q, "collect_env": collect_env.parse_collect_env,
    "failures": failures.parse_failures, "profiler_table": profiler_table.parse_profiler_table,
    "nsys_stats": nsys_stats.parse_nsys_stats, "flight_recorder": flight_recorder.parse_flight_recorder,
    "pyspy": pyspy.parse_pyspy, "nccl_ras": nccl_ras.parse_nccl_ras, "nanogpt": nanogpt.parse_nanogpt,
    "hf_trainer": hf_trainer.parse_hf_trainer,
}
WHOLE_TEXT_KINDS = ("flight_recorder", "nvidia_smi_q")  # parse_text reads these whole when the head says so

# Every line parser, in the order that settles a line two gates claim: the most specific grammar
# first, the failure scanner (which reads whatever the others leave) last. torchtitan's step lines
# (its logger's format, "step:" in the message) are no other grammar's, so it goes first: its lines
# are the most numerous in its logs and each parser before it costs every line a gate test.
CHAIN: tuple[type[LineParser], ...] = (
    torchtitan.TorchtitanParser, nccl.NcclParser, nccl_ras.RasParser, megatron.MegatronParser,
    deepspeed.DeepSpeedParser, deepspeed_tables.FlopsProfileParser, deepspeed_tables.CommsLogParser,
    deepspeed_tables.AutotuningParser,
    nanogpt.NanoGptParser, hf_trainer.HfTrainerParser,
    pyspy.PySpyParser, collect_env.CollectEnvParser, profiler_table.ProfilerTableParser,
    nsys_stats.NsysStatsParser, nvidia_smi.TopoParser, nvidia_smi.SmiQParser, fr_analyzer.FrAnalyzerParser,
    failures.FailureScanner,
)


def build_chain(source: str) -> list[LineParser]:
    """One fresh instance of every line parser (CHAIN), for one text."""
    return [cls(source) for cls in CHAIN]


def parse_text(text: str | Iterable[str], *, source: str, kind: str | None = None) -> ParseResult:
    """Parse a text: ``kind`` None (or "routed"): a whole-text format the head names (a str's first
    HEAD_CHARS; pass ``kind`` when streaming) is read whole, any other text line by line through
    every parser (``build_chain``), a Chrome trace not at all (ingest.traces reads it); ``kind`` a key of PARSERS: that parser alone
    (an ``nvidia-smi -q`` report: with the chain after it, for the lines that are not the report's); any other
    ``kind``: no records, every non-blank line unparsed and a warning. Never raises on content."""
    if kind is None:
        kind = detect_kind(text[:HEAD_CHARS]) if isinstance(text, str) else None
        kind = kind if kind in (*WHOLE_TEXT_KINDS, "chrome_trace") else "routed"
    if kind == "routed":
        return run_parsers(text, build_chain(source))
    if kind == "nvidia_smi_q":  # the report read with its indentation, any other line (an interleaved log) by the chain
        others = tuple(p for p in build_chain(source) if not isinstance(p, nvidia_smi.SmiQParser))
        return nvidia_smi.parse_nvidia_smi_q(text, source=source, others=others)
    parser = PARSERS.get(kind)
    if parser is not None:
        return parser(text, source=source)
    what = f"kind {kind!r} has no parser yet"
    return dataclasses.replace(run_parsers(text, [LineParser(source)], kind=kind), warnings=[what])


PARSED_KINDS = (*PARSERS, "chrome_trace")  # chrome traces: ingest.traces reads them as JSON
