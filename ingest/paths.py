"""Names and paths that must stay inside a campaign directory.

A run name becomes a directory name (``<campaign>/<run>``), so it must be one plain path
component: not empty, no ``/`` or ``\\``, not ``.`` or ``..``, no NUL or newline. Every
path the tools derive from a campaign's own files (campaign.json run names, spec.json names)
is checked here before it is opened. Deliberately not here: any file I/O.
"""
from __future__ import annotations

import os
from pathlib import Path

from core.errors import ConfigError

MAX_RUN_NAME_CHARS = 200


def run_name_problem(name: object) -> str | None:
    """Why ``name`` is not a plain run name (one path component), or None when it is."""
    if not isinstance(name, str):
        return f"run name {name!r:.60}: expected a string, got {type(name).__name__}"
    shown = repr(name[:60])
    if not name or name in (".", ".."):
        return f"run name {shown}: must be a plain name (letters, digits, '-', '_', '.')"
    if "/" in name or "\\" in name or os.sep in name:
        return f"run name {shown}: must be a plain name, not a path (no '/')"
    if any(c in name for c in "\0\n\r") or not name.isprintable():
        return f"run name {shown}: has control characters"
    if len(name) > MAX_RUN_NAME_CHARS:
        return f"run name {shown}...: longer than {MAX_RUN_NAME_CHARS} characters"
    return None


def check_run_name(name: object, *, where: str) -> str:
    """``name`` when it is a plain run name; ConfigError ``where: why`` otherwise."""
    problem = run_name_problem(name)
    if problem:
        raise ConfigError(f"{where}: {problem}; the campaign is damaged or not ours")
    return str(name)


def resolved(path: str | os.PathLike[str]) -> Path | None:
    """``path`` absolute with its symlinks followed (``Path.resolve``); None when they loop (Python
    3.11 raises RuntimeError there, 3.13 OSError ELOOP)."""
    try:
        return Path(path).resolve()
    except (RuntimeError, OSError):
        return None


def resolve_under(root: Path, *parts: str) -> Path:
    """``root / parts`` resolved (symlinks followed), which must stay under ``root`` resolved.
    ConfigError naming the path otherwise (a symlink loop included)."""
    base = Path(root).resolve()
    path = resolved(base.joinpath(*parts))
    if path is None:
        raise ConfigError(f"{Path(root).joinpath(*parts)}: a symlink loop; not followed (remove the link)")
    if not path.is_relative_to(base):
        raise ConfigError(f"{Path(root).joinpath(*parts)}: resolves to {path}, outside the campaign {base}; not followed")
    return path


# The records of a run folder that the tools read; each, and the folder, must stay in the campaign.
RUN_RECORDS = ("spec.json", "status.json", "run_info.json", "checkpoint.json")


def check_run_inside(root: Path, name: str) -> None:
    """The run folder ``root/name`` and its records (RUN_RECORDS) resolve inside ``root``:
    ConfigError naming the first link that leaves (``resolve_under``) otherwise."""
    for record in ("", *RUN_RECORDS):
        resolve_under(root, name, *([record] if record else []))


def is_inside(path: Path, folder: Path) -> bool:
    """``path`` resolves (symlinks followed, no loop) to somewhere under ``folder`` resolved."""
    target, base = resolved(path), resolved(folder)
    return target is not None and base is not None and target.is_relative_to(base)

