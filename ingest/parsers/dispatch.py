"""Dispatch: detect a text's kind and run that kind's parser (``parse_text``). Kept apart from
``ingest.parsers`` so the parsers import it and this module imports them without a circle.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Iterable

from ingest.parsers import (
    HEAD_CHARS, LineParser, ParseResult, collect_env, deepspeed, detect_kind, failures, flight_recorder, megatron,
    nccl, nccl_ras, nsys_stats, nvidia_smi, profiler_table, pyspy, run_parsers, torchtitan,
)

PARSERS: dict[str, Callable[..., ParseResult]] = {  # kind -> its parser
    "nccl": nccl.parse_nccl, "megatron": megatron.parse_megatron, "deepspeed": deepspeed.parse_deepspeed,
    "torchtitan": torchtitan.parse_torchtitan, "nvidia_smi_topo": nvidia_smi.parse_nvidia_smi_topo,
    "nvidia_smi_q": nvidia_smi.parse_nvidia_smi_q, "collect_env": collect_env.parse_collect_env,
    "failures": failures.parse_failures, "profiler_table": profiler_table.parse_profiler_table,
    "nsys_stats": nsys_stats.parse_nsys_stats, "flight_recorder": flight_recorder.parse_flight_recorder,
    "pyspy": pyspy.parse_pyspy, "nccl_ras": nccl_ras.parse_nccl_ras,
}


def parse_text(text: str | Iterable[str], *, source: str, kind: str | None = None) -> ParseResult:
    """Detect (unless ``kind`` is given) and parse. Unknown or not-yet-parsed kinds return no
    records, every non-blank line unparsed and a warning saying so. Never raises on content."""
    if kind is None:
        if not isinstance(text, str):
            raise TypeError("pass kind= when streaming text")
        kind = detect_kind(text[:HEAD_CHARS])
    parser = PARSERS.get(kind or "")
    if parser is not None:
        return parser(text, source=source)
    kind = kind or "unknown"  # no parser: the base LineParser recognises no line
    what = f"kind {kind!r} has no parser yet" if kind != "unknown" else "unknown kind (no known signature in the first 64 KiB)"
    return dataclasses.replace(run_parsers(text, [LineParser(source)], kind=kind), warnings=[what])


PARSED_KINDS = (*PARSERS, "chrome_trace")  # chrome traces: ingest.traces reads them as JSON
