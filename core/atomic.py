"""Atomic file writes: the one way this project writes a file (temp file + ``os.replace``).

Only file-writing primitives live here (reading, loading and table writing are ``ingest.io``'s):
one file (``atomic_writer``) and a set of a folder's entries (``staged_folder``).
Deliberately not here: what is written (JSON layout, Parquet tables) beyond plain bytes and JSON.
"""
from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from core.errors import ConfigError


@contextlib.contextmanager
def atomic_writer(path: str | os.PathLike[str], *, text: bool = False):
    """Open a new file that becomes ``path`` only when the ``with`` block ends without error.

    The one way this project writes a file atomically. The temp file is created exclusively
    (``mkstemp``: O_EXCL, a random name, in the target's directory so the rename stays on one
    file system), so a symlink planted at a predictable name is never followed; ``os.replace``
    then swaps the directory entry (a symlink at ``path`` itself is replaced, not written
    through). The final file gets the mode the user's umask gives a new file (mkstemp's 0600
    would hide results from the group). On any error, the temp file is removed and the error
    re-raised with ``filename`` set, so a full disk names the file. Yields a binary file
    object (text with ``text=True``, UTF-8)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w" if text else "wb", **({"encoding": "utf-8"} if text else {})) as f:
            yield f
        os.chmod(tmp, 0o666 & ~umask())
        os.replace(tmp, path)
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(e, OSError) and e.filename is None:
            e.filename = str(path)
        raise


def umask() -> int:
    """The process umask (mode bits removed from new files)."""
    mask = os.umask(0o022)  # reading the umask means setting it; put it straight back
    os.umask(mask)
    return mask


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (``atomic_writer``). Returns the path."""
    with atomic_writer(path) as f:
        f.write(data)
    return Path(path)


def write_json_atomic(path: str | os.PathLike[str], data: Any) -> Path:
    """Write ``data`` as indented JSON to ``path`` atomically (``atomic_writer``)."""
    return write_bytes_atomic(path, (json.dumps(data, indent=2) + "\n").encode("utf-8"))


@contextlib.contextmanager
def staged_folder(out: str | os.PathLike[str], *, marker: str, entries: Sequence[str], hint: str):
    """Write a new set of ``entries`` (file or folder names) of the folder ``out`` as one set.

    ``out`` must be missing, empty or hold ``marker`` (a folder this tool made); otherwise
    ConfigError ``out: ...; hint`` and nothing is touched. The marker is created and locked
    (flock) for the whole write: a second writer of ``out`` gets ConfigError at once. Yields an
    empty staging folder inside ``out``; when the ``with`` block ends without error, every entry
    of ``out`` named in ``entries`` is replaced by the staged one of that name or removed when
    none was staged, with SIGINT/SIGTERM held off, so a stopped write leaves the previous set
    whole or the new one, never a mix. The staging folder is removed in any case (one left by a
    killed writer, at the next write)."""
    import fcntl
    import shutil
    import signal

    out = Path(out)
    check_staged_folder(out, marker=marker, hint=hint)
    out.mkdir(parents=True, exist_ok=True)
    fd = os.open(out / marker, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o666 & ~umask())
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConfigError(f"{out}: another process is writing it now (it holds {out / marker}); wait for it "
                              "to finish, or choose another folder") from None
        for left in out.glob(".stage-*"):  # of a writer killed before it could clean up
            shutil.rmtree(left, ignore_errors=True)
        stage = Path(tempfile.mkdtemp(dir=out, prefix=".stage-"))
        try:
            yield stage
            held = {signal.SIGINT, signal.SIGTERM}
            old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, held)
            try:
                for name in entries:
                    target, new = out / name, stage / name
                    if target.exists() or target.is_symlink():
                        os.replace(target, stage / f"{name}.previous")
                    if new.exists():
                        os.replace(new, target)
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
        finally:
            shutil.rmtree(stage, ignore_errors=True)
    finally:
        os.close(fd)


def check_staged_folder(out: str | os.PathLike[str], *, marker: str, hint: str) -> None:
    """ConfigError ``out: ...; hint`` unless ``out`` is missing, an empty folder or a folder
    holding ``marker`` (``staged_folder`` made it)."""
    out = Path(out)
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise ConfigError(f"{out}: not a folder; {hint}")
    if out.is_dir() and not (out / marker).is_file() and any(out.iterdir()):
        raise ConfigError(f"{out}: a folder this tool did not make (not empty, no {marker}); nothing was "
                          f"written; {hint}")
