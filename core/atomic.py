"""Atomic file writes: the one way this project writes a file (temp file + ``os.replace``).

Only file-writing primitives live here (reading, loading and table writing are ``ingest.io``'s).
Deliberately not here: what is written (JSON layout, Parquet tables) beyond plain bytes and JSON.
"""
from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any


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
