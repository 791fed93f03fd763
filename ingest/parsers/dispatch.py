"""Dispatch: detect a text's kind and run that kind's parser (``parse_text``).

Kept apart from the package's protocol (``ingest.parsers``: LineParser, ParseResult, rules) so
the parsers import the protocol and this module imports the parsers, without an import circle.
"""
from __future__ import annotations

from typing import Callable, Iterable

from ingest.parsers import (
    HEAD_CHARS, LineParser, ParseResult, collect_env, deepspeed, detect_kind, failures, flight_recorder, megatron,
    nccl, nccl_ras, nsys_stats, nvidia_smi, profiler_table, pyspy, run_parsers, torchtitan,
)


def _parsers() -> dict[str, Callable[..., ParseResult]]:
    return {
        "nccl": nccl.parse_nccl,
        "megatron": megatron.parse_megatron,
        "deepspeed": deepspeed.parse_deepspeed,
        "torchtitan": torchtitan.parse_torchtitan,
        "nvidia_smi_topo": nvidia_smi.parse_nvidia_smi_topo,
        "nvidia_smi_q": nvidia_smi.parse_nvidia_smi_q,
        "collect_env": collect_env.parse_collect_env,
        "failures": failures.parse_failures,
        "profiler_table": profiler_table.parse_profiler_table,
        "nsys_stats": nsys_stats.parse_nsys_stats,
        "flight_recorder": flight_recorder.parse_flight_recorder,
        "pyspy": pyspy.parse_pyspy,
        "nccl_ras": nccl_ras.parse_nccl_ras,
    }


def parse_text(text: str | Iterable[str], *, source: str, kind: str | None = None) -> ParseResult:
    """Detect (unless ``kind`` is given) and parse. Unknown or not-yet-parsed kinds return no
    records, every non-blank line unparsed and a warning saying so. Never raises on content."""
    if kind is None:
        if not isinstance(text, str):
            raise TypeError("pass kind= when streaming text")
        kind = detect_kind(text[:HEAD_CHARS])
    parser = _parsers().get(kind or "")
    if parser is not None:
        return parser(text, source=source)
    return no_parser_result(run_parsers(text, [_Nothing(source)], kind=kind or "unknown"))


def no_parser_result(result: ParseResult) -> ParseResult:
    """The result for a kind with no parser (``result``: its lines read by ``_Nothing``): no
    records, every non-blank line unparsed, one warning saying why."""
    kind = result.kind
    what = f"kind {kind!r} has no parser yet" if kind != "unknown" else "unknown kind (no known signature in the first 64 KiB)"
    return ParseResult(records=[], unparsed=result.unparsed, warnings=[what], kind=kind,
                       unparsed_lines=result.unparsed_lines, num_lines=result.num_lines)


class _Nothing(LineParser):

    def feed(self, lineno, body, ts, rank) -> bool:
        return False


PARSED_KINDS = ("nccl", "megatron", "deepspeed", "torchtitan", "nvidia_smi_topo", "nvidia_smi_q", "chrome_trace",
                "collect_env", "failures", "profiler_table", "nsys_stats", "flight_recorder", "pyspy", "nccl_ras")
