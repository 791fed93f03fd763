"""Dense peak FLOP/s per GPU and dtype, and nominal links, from the data file hardware.toml.

``lookup_peak`` matches a ``torch.cuda.get_device_name()`` string against each entry's
``match`` regular expressions (full match, case-insensitive). An unknown GPU, a CPU, or a
dtype without a number gives None: MFU is then reported "n/a" -- there is deliberately no
fallback peak (STYLE.md, anti-patterns).
"""
from __future__ import annotations

import functools
import os
import re
import tomllib
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import Any

from core.errors import ConfigError, ParseError

HARDWARE_TOML = Path(files("core") / "hardware.toml")  # package data (pyproject.toml), found through the package
DTYPES = ("bf16", "fp16", "tf32", "fp32")
_ENTRY_KEYS = {"name", "match", "source", "memory_gib", "fabric", "pcie", *DTYPES}


@dataclass(frozen=True, kw_only=True)
class Peak:
    """flops: dense peak FLOP/s of one GPU; source: datasheet URL and title; entry: table id."""

    flops: float
    source: str
    entry: str
    name: str


@dataclass(frozen=True, kw_only=True)
class _Entry:
    key: str
    name: str
    patterns: tuple[re.Pattern[str], ...]
    flops: dict[str, float]
    source: str
    memory_gib: float | None = None  # runner plan: usable device memory
    fabric: str | None = None  # runner plan: [link.<id>] of the scale-up link inside a node
    pcie: str | None = None  # runner plan: [link.<id>] of its PCIe generation


def build_hardware_table(data: dict[str, Any], *, origin: str = "hardware.toml") -> tuple[_Entry, ...]:
    """Validate the parsed TOML (``[gpu.<id>]`` tables) into entries.

    Raises ConfigError listing every problem (unknown keys, missing match/source, bad regex,
    non-positive peaks).
    """
    problems: list[str] = []
    entries = []
    for key, raw in (data.get("gpu") or {}).items():
        where = f"{origin} [gpu.{key}]"
        unknown = sorted(set(raw) - _ENTRY_KEYS)
        if unknown:
            problems.append(f"{where}: unknown keys {unknown} (valid: {sorted(_ENTRY_KEYS)})")
        if not raw.get("match") or not raw.get("source"):
            problems.append(f"{where}: needs non-empty 'match' and 'source'")
            continue
        try:
            patterns = tuple(re.compile(p, re.IGNORECASE) for p in raw["match"])
        except re.error as e:
            problems.append(f"{where}: bad match pattern ({e})")
            continue
        flops = {d: float(raw[d]) for d in DTYPES if d in raw}
        if any(v <= 0 for v in flops.values()):
            problems.append(f"{where}: peaks must be positive")
        entries.append(_Entry(key=key, name=raw.get("name", key), patterns=patterns, flops=flops, source=raw["source"],
                              memory_gib=raw.get("memory_gib"), fabric=raw.get("fabric"), pcie=raw.get("pcie")))
    if not entries and not problems:
        problems.append(f"{origin}: no [gpu.<id>] entries")
    if problems:
        raise ConfigError("; ".join(problems))
    return tuple(entries)


_USER_FILES: list[Path] = []  # set by the commands' --hardware FILE (use_hardware_file), in order given
_TOP_KEYS = {"schema_version", "gpu", "link"}


def merge_hardware_data(base: dict[str, Any], extra: dict[str, Any], *, origin: str) -> dict[str, Any]:
    """``extra``'s [gpu.<id>] / [link.<id>] tables over ``base``'s: an id both have takes extra's keys
    over base's, a new id is added; extra's ids come first, so its match patterns win.
    Raises ConfigError naming ``origin`` for unknown top-level keys or non-table entries."""
    problems = [f"{origin}: unknown key {k!r} (valid: {sorted(_TOP_KEYS)})" for k in sorted(set(extra) - _TOP_KEYS)]
    merged: dict[str, Any] = {"schema_version": base.get("schema_version")}
    for section in ("gpu", "link"):
        ours, theirs = base.get(section) or {}, extra.get(section) or {}
        if not isinstance(theirs, dict):
            problems.append(f"{origin}: [{section}] must hold [{section}.<id>] tables")
            continue
        bad = [k for k, v in theirs.items() if not isinstance(v, dict)]
        problems += [f"{origin}: {section}.{k} must be a table ([{section}.{k}])" for k in bad]
        table = {k: {**ours.get(k, {}), **v} for k, v in theirs.items() if k not in bad}
        table.update({k: v for k, v in ours.items() if k not in table})
        merged[section] = table
    if problems:
        raise ConfigError("; ".join(problems))
    return merged


@functools.cache
def load_hardware_data() -> dict[str, Any]:
    """The shipped hardware.toml with every --hardware FILE merged over it (merge_hardware_data)."""
    data = load_hardware_toml(HARDWARE_TOML)
    for path in _USER_FILES:
        data = merge_hardware_data(data, load_hardware_toml(path), origin=str(path))
    return data


def use_hardware_file(path: str | os.PathLike[str]) -> None:
    """Merge a user's hardware file (their GPUs and links, same format as hardware.toml) over the
    shipped table for the rest of the process. Raises ParseError / ConfigError naming the file."""
    _USER_FILES.append(Path(path))
    _clear_caches()
    try:
        _default_table()
        load_links()
    except Exception:
        _USER_FILES.pop()
        _clear_caches()
        raise


@dataclass(frozen=True, kw_only=True)
class Link:
    """A nominal interconnect (hardware.toml [link.<id>]): bus_bw_gbps GB/s per GPU one way."""

    key: str
    name: str
    bus_bw_gbps: float
    latency_us: float
    scope: str  # "intra" | "inter"
    per: str  # "gpu" | "node"
    source: str


@functools.cache
def load_links(path: Path | None = None) -> dict[str, Link]:
    """hardware.toml's [link.<id>] tables (path None: the shipped file with any --hardware FILE
    merged over it). Raises ConfigError listing malformed entries."""
    links, problems = {}, []
    data = load_hardware_toml(path) if path is not None else load_hardware_data()
    origin = path or hardware_origin()
    for key, raw in (data.get("link") or {}).items():
        try:
            links[key] = Link(key=key, name=raw["name"], bus_bw_gbps=float(raw["bus_bw_gbps"]),
                              latency_us=float(raw["latency_us"]), scope=raw["scope"], per=raw.get("per", "gpu"),
                              source=raw["source"])
        except (KeyError, TypeError, ValueError) as e:
            problems.append(f"{origin} [link.{key}]: {e!r}; needs name, bus_bw_gbps, latency_us, scope, source")
    if problems:
        raise ConfigError("; ".join(problems))
    return links


def _clear_caches() -> None:
    load_hardware_data.cache_clear()
    _default_table.cache_clear()
    load_links.cache_clear()


def hardware_origin() -> str:
    """The file errors in the merged table are charged to: the last --hardware FILE, else hardware.toml."""
    return str(_USER_FILES[-1]) if _USER_FILES else str(HARDWARE_TOML)


@functools.cache
def _default_table() -> tuple[_Entry, ...]:
    return build_hardware_table(load_hardware_data(), origin=hardware_origin())


def lookup_peak(gpu_name: str | None, dtype: str | None, *, table: tuple[_Entry, ...] | None = None) -> Peak | None:
    """Dense peak FLOP/s of one ``gpu_name`` GPU for ``dtype`` ("bf16", "fp16", "tf32", "fp32").

    Returns None for None/empty/CPU names, unknown GPUs and dtypes the entry has no number for.
    table: from ``build_hardware_table`` (default: hardware.toml with any --hardware FILE merged over it).
    Raises ConfigError when the table is invalid.
    """
    if not gpu_name or not dtype:
        return None
    name = gpu_name.strip()
    for entry in table if table is not None else _default_table():
        if any(p.fullmatch(name) for p in entry.patterns):
            flops = entry.flops.get(dtype)
            return Peak(flops=flops, source=entry.source, entry=entry.key, name=entry.name) if flops else None
    return None


def lookup_gpu(key_or_name: str, *, table: tuple[_Entry, ...] | None = None) -> _Entry | None:
    """The hardware.toml entry whose id (``h100_sxm``) or match pattern (``NVIDIA H100 80GB HBM3``)
    fits ``key_or_name``; None when none does."""
    entries = table if table is not None else _default_table()
    for entry in entries:
        if entry.key == key_or_name.strip().lower() or any(p.fullmatch(key_or_name.strip()) for p in entry.patterns):
            return entry
    return None


def gpu_keys(*, table: tuple[_Entry, ...] | None = None) -> tuple[str, ...]:
    """Every entry id of hardware.toml, in file order."""
    return tuple(e.key for e in (table if table is not None else _default_table()))


def load_hardware_toml(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read hardware.toml as a dict (validated by build_hardware_table). Raises ParseError."""
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        hint = "restore hardware.toml from the repository" if Path(path) == HARDWARE_TOML else "check the path"
        raise ParseError(f"{path}: no such file; {hint}") from None
    except IsADirectoryError:
        raise ParseError(f"{path}: is a directory, not a hardware TOML file") from None
    except tomllib.TOMLDecodeError as e:
        raise ParseError(f"{path}: malformed TOML ({e}); fix the file") from None
