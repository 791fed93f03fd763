"""The one module of ingest/report that touches the file system.

Reads a campaign directory written by the runner (campaign.json, env.json, <run>/spec.json,
run_info.json, status.json, metrics/rank<r>.jsonl) or a folder of Parquet tables written by
``write_tables``, into one frozen ``Campaign``. Writes tables and report files atomically
(temp file in the target directory + ``os.replace``).

Deliberately not here: parsing of third-party logs (pure parsers elsewhere), any metric
computation, any formatting.
"""
from __future__ import annotations

import codecs
import errno
import dataclasses
import io
import re
import shlex
import json
import os
import stat
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported where used: reading a trace or a log needs neither (0.5 s, 80 MB)
    import pandas as pd

    from core.records import PlantTruth

from core.errors import NoDataError, ParseError, ToolError
from core.i18n import Message, MessageList, N_  # a problem is a caveat the note prints: a catalogue message
from core.redact import redact_value
from ingest.paths import check_run_inside, is_inside, resolved, run_name_problem
from core.atomic import write_bytes_atomic
from core.records import (
    SCHEMA_VERSION, CampaignRecord, CheckpointRecord, EnvRecord, FixedConfig, LoadedRun, ModelConfig, Plant, RunInfo,
    RunSpec, RunStatus, StepRow, campaign_record_from_dict, env_record_from_dict, plant_from_dict, record_problems,
    run_spec_from_dict, to_dict,
)

# RunSpec fields held in the runs table as JSON text (decoded by loaded_run_from_row)
SPEC_JSON_COLUMNS = ("options", "plant")
STEP_COLUMNS = tuple(f.name for f in dataclasses.fields(StepRow))
RUNS_TABLE, STEPS_TABLE = "runs.parquet", "steps.parquet"
_META_KEYS = ("schema_version", "campaign", "env", "problems")
# Integer fields of the flattened run row: nullable Int64 so a missing record reads NA, not NaN/0.
_INT_COLUMNS = tuple(
    f.name
    for cls in (RunSpec, FixedConfig, ModelConfig, RunStatus, RunInfo)
    for f in dataclasses.fields(cls)
    if f.type in ("int", "int | None")
) + ("tokens_per_step", "num_metric_files", "num_metric_rows", "ckpt_step", "ckpt_bytes_written", "ckpt_num_files")
# checkpoint.json fields in the run row, as ckpt_<field> (run/engine/schema_version are the spec's)
CHECKPOINT_COLUMNS = tuple(f"ckpt_{f.name}" for f in dataclasses.fields(CheckpointRecord)
                           if f.name not in ("schema_version", "run", "engine"))


@dataclass(frozen=True, kw_only=True)
class Campaign:
    """A loaded campaign.

    runs: one row per run, in campaign order. Columns: ``run``, the RunSpec fields with
      ``fixed`` and ``fixed.model`` flattened to their leaf names (``num_layers``,
      ``global_batch_size``, ``warmup_steps``...), ``options`` (JSON text), ``tokens_per_step``,
      RunStatus fields (``status``, ``exit_code``, ``cause``, ``duration_s``...; NA when
      status.json is missing), RunInfo fields (``num_params``, ``device_name``, ``num_gpus``...;
      NA when run_info.json is missing), CheckpointRecord fields as ``ckpt_<field>`` (tuples as
      JSON text; NA without checkpoint.json), ``num_metric_files``, ``num_metric_rows``. The
      table is what Parquet stores; the note reads its runs as records (``run_records``).
    steps: one row per (run, rank, step), columns = StepRow fields (all steps, warm-up included).
    campaign / env: campaign.json and env.json as records (core.records.CampaignRecord /
      EnvRecord; an empty EnvRecord when env.json is missing; wrong-typed values dropped, each
      with a caveat in ``problems``). campaign_json: campaign.json's object exactly as written,
      printed by the note's appendix and nothing else: read the fields from ``campaign``.
    problems: human-readable caveats found while loading (missing files of individual runs,
      values of the wrong type in env.json or campaign.json).
    """

    source: str
    campaign: CampaignRecord
    env: EnvRecord
    campaign_json: Mapping[str, Any]
    runs: pd.DataFrame
    steps: pd.DataFrame
    problems: tuple[str, ...] = ()
    # third-party profiler summaries (torch.profiler key_averages tables, nsys stats): the
    # ``kernels`` table's records (ingest.parsers.profiler_table / nsys_stats); None if none
    kernel_summaries: Any = None

    @property
    def name(self) -> str:
        return self.campaign.name or Path(self.source).name

    def run_records(self) -> tuple[LoadedRun, ...]:
        """The runs table as one LoadedRun per run (same order): the one place its JSON-text
        columns (the spec's ``options`` and ``plant``, the status's ``command`` and ``diagnosis``,
        run_info's ``kernels`` and ``pp_stage_num_layers``, the checkpoint's tuples) are decoded,
        NA read as None (a text that is not JSON as None too). A column the table lacks (a run
        reconstructed from third-party logs) reads as None."""
        import pandas as pd

        def py(value: Any) -> Any:
            if value is None or (not isinstance(value, (str, tuple, list, dict)) and pd.isna(value)):
                return None
            return value.item() if hasattr(value, "item") else value

        return tuple(loaded_run_from_row({k: py(v) for k, v in row.items()}) for row in self.runs.to_dict("records"))


def _json_text(value: Any) -> Any:
    """A JSON-text cell decoded; None for None, "" and text that is not JSON."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value) if value else None
    except (ValueError, RecursionError):  # ValueError: a JSONDecodeError or an integer past Python's digit limit
        return None


def loaded_run_from_row(row: Mapping[str, Any]) -> LoadedRun:
    """One runs-table row (NA already None) -> LoadedRun: the inverse of ``_load_run``'s flattening.
    status is None when the row has no status (no status.json), info when it has none of
    run_info's fields, checkpoint when it has no ``ckpt_save_s``."""
    def pick(cls: type, *, skip: tuple[str, ...] = (), prefix: str = "") -> dict[str, Any]:
        return {f.name: row.get(prefix + f.name) for f in dataclasses.fields(cls)
                if f.name not in ("schema_version", "run", *skip)}

    name = str(row["run"])
    fixed = FixedConfig(**pick(FixedConfig, skip=("model",)), model=ModelConfig(**pick(ModelConfig)))
    spec = pick(RunSpec, skip=("name", "fixed", "options", "plant"))
    options = _json_text(row.get("options"))
    plant = _json_text(row.get("plant"))
    if isinstance(plant, dict):
        plant = plant_from_dict(plant)
    spec_record = RunSpec(**spec, name=name, fixed=fixed, options=options if isinstance(options, dict) else {},
                          plant=plant if isinstance(plant, Plant) else None)
    status = None
    if row.get("status") is not None:
        command, diagnosis = _json_text(row.get("command")), _json_text(row.get("diagnosis"))
        status = RunStatus(**pick(RunStatus, skip=("engine", "command", "diagnosis")), run=name,
                           command=tuple(command) if isinstance(command, list) else (),
                           diagnosis=diagnosis if isinstance(diagnosis, dict) else None)
    info_fields = pick(RunInfo, skip=("engine",))
    info = None
    if any(v is not None for v in info_fields.values()):
        kernels, layers = _json_text(info_fields["kernels"]), _json_text(info_fields["pp_stage_num_layers"])
        info = RunInfo(**{**info_fields, "kernels": kernels if isinstance(kernels, dict) else None,
                          "pp_stage_num_layers": tuple(layers) if isinstance(layers, list) else None},
                       run=name, engine=spec_record.engine)
    checkpoint = None
    if row.get("ckpt_save_s") is not None:
        ckpt = pick(CheckpointRecord, skip=("engine",), prefix="ckpt_")
        for key in ("verify_steps", "loss_uninterrupted", "loss_restored"):
            value = _json_text(ckpt[key])
            ckpt[key] = tuple(value) if isinstance(value, list) else ()
        checkpoint = CheckpointRecord(**ckpt, run=name, engine=spec_record.engine)
    return LoadedRun(spec=spec_record, status=status, info=info, checkpoint=checkpoint,
                     num_metric_files=int(row.get("num_metric_files") or 0),
                     num_metric_rows=int(row.get("num_metric_rows") or 0))


def open_regular(path: str | os.PathLike[str], mode: str = "rb", **kwargs: Any):
    """Open ``path`` for reading only if it is a regular file: checked on the opened descriptor
    (fstat), which is opened non-blocking so a FIFO planted where a log or metrics file should be
    can neither hang the open nor the read. Raises FileNotFoundError, or OSError(EINVAL) naming
    the file and what it is."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            what = "a FIFO" if stat.S_ISFIFO(st.st_mode) else "a directory" if stat.S_ISDIR(st.st_mode) else \
                "a device or socket"
            raise OSError(errno.EINVAL, f"not a regular file ({what})", str(path))
        os.set_blocking(fd, True)
        return os.fdopen(fd, mode, **kwargs)
    except BaseException:
        os.close(fd)
        raise


def read_regular_bytes(path: str | os.PathLike[str], *, max_bytes: int | None = None) -> bytes:
    """The bytes of a regular file (``open_regular``: a FIFO or a device is refused, never read),
    at most ``max_bytes``: a file holding more raises OSError(EFBIG) naming it, after reading
    only max_bytes + 1 (a huge or growing file never fills memory). OSError as raised."""
    with open_regular(path, "rb") as f:
        data = f.read() if max_bytes is None else f.read(max_bytes + 1)
    if max_bytes is not None and len(data) > max_bytes:
        raise OSError(errno.EFBIG, f"larger than {format_bytes(max_bytes)}, the most this tool reads of it", str(path))
    return data


def read_regular_text(path: str | os.PathLike[str], *, max_bytes: int | None = None) -> str:
    """The UTF-8 text of a regular file (``read_regular_bytes``, same cap); UnicodeDecodeError /
    OSError as raised."""
    return read_regular_bytes(path, max_bytes=max_bytes).decode("utf-8")


def format_bytes(num: int) -> str:
    """A byte count for a message: '64 MiB', '4 GiB', '512 bytes'."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if num >= size:
            return f"{num / size:.3g} {unit}"
    return f"{num} bytes"


def read_problem(e: OSError) -> str:
    """What to do about an OSError reading a file, for a one-line message."""
    if e.errno == errno.EFBIG:
        return "not an artifact of ours (too large); remove or replace it"
    if e.errno == errno.EINVAL:
        return "replace it with a regular file"
    return "check the path and permissions"


def is_regular_file(path: str | os.PathLike[str]) -> bool:
    """True for a regular file (following a symlink): stat only, never opens (a FIFO would block)."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


# The most read of one JSON record (campaign.json, env.json, spec/status/run_info.json...): the
# runner's are kilobytes (campaign.json of 10,000 runs: ~200 KB)
MAX_RECORD_BYTES = 64 << 20


def _read_json(path: Path) -> Any:
    try:
        text = read_regular_text(path, max_bytes=MAX_RECORD_BYTES)
    except UnicodeDecodeError as e:
        raise ParseError(f"{path}: not UTF-8 text ({e.reason}); rewrite it as JSON") from None
    except OSError as e:
        raise ParseError(f"{path}: cannot read ({e.strerror}); {read_problem(e)}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ParseError(
            f"{path}:{e.lineno}:{e.colno}: malformed JSON ({e.msg}); fix or regenerate the file"
        ) from None
    except RecursionError:  # hostile input: nesting deeper than the decoder's stack
        raise ParseError(f"{path}: JSON nested too deeply to read; not an artifact of ours") from None
    except ValueError:  # an integer past Python's int-from-text digit limit (not a JSONDecodeError)
        raise ParseError(f"{path}:{_long_integer_line(text)}: {_LONG_INTEGER}; fix or regenerate the file") from None


# The one ValueError json.loads raises that is not a JSONDecodeError: an integer literal longer
# than sys.get_int_max_str_digits() (4,300 by default; CVE-2020-10735). No artifact of ours has one.
_LONG_INTEGER = "an integer longer than Python reads (4,300 digits); not an artifact of ours"


def _long_integer_line(text: str) -> int:
    """The line (1-based) of ``text``'s first run of more than 4,300 digits: where json.loads
    refused an integer (best effort: a digit run inside a string counts too); 1 when none."""
    import sys

    limit = sys.get_int_max_str_digits() or 4300
    m = re.search(rf"\d{{{limit + 1},}}", text)
    return text.count("\n", 0, m.start()) + 1 if m else 1


def _read_record(path: Path, cls: type, problems: list[str]) -> dict[str, Any] | None:
    """Read a JSON record file of one run, validate it against the schema dataclass ``cls``.

    Missing file -> None. Fields of the wrong type/name -> None and a caveat in ``problems``
    (lenient: one run's bad record must not block the note). Malformed JSON -> ParseError."""
    if not path.is_file():
        return None
    data = _read_json(path)
    where = f"{path.parent.name}/{path.name}"
    if not isinstance(data, dict):
        problems.append(Message(N_("%(file)s: expected a JSON object, got %(type)s; file ignored"), file=where,
                                type=type(data).__name__))
        return None
    _check_version(path, data)
    bad = _field_problems(cls, data)
    if bad:
        problems.append(Message(N_("%(file)s: does not match %(record)s (%(problems)s); file ignored"), file=where,
                                record=cls.__name__, problems="; ".join(bad)))
        return None
    return redact_value(dataclasses.asdict(cls(**data)))  # campaigns written before redaction too


def _check_version(path: Path, data: dict[str, Any], line: int | None = None) -> None:
    version = data.get("schema_version")
    if isinstance(version, int) and version > SCHEMA_VERSION:
        where = f"{path}:{line}" if line else str(path)
        raise ParseError(
            f"{where}: schema_version {version} is newer than this tool's {SCHEMA_VERSION}; upgrade the tool"
        )


def _field_problems(cls: type, data: Any, prefix: str = "") -> list[str]:
    """Every way ``data`` (a parsed JSON object) fails the schema dataclass ``cls``
    (core.records.record_problems). JSON's NaN/Infinity pass as floats (a diverged loss is data)."""
    return record_problems(cls, data, prefix=prefix)


def load_metrics(run_dir: str | os.PathLike[str]) -> tuple[list[dict[str, Any]], list[str]]:
    """Every rank's validated StepRows of one run (``<run>/metrics/rank<r>.jsonl``, as the note
    reads them: each row naming the run folder and its file's rank) and the problems found.
    ParseError when a file is not UTF-8."""
    problems: list[str] = []
    files = _metrics_files(Path(run_dir), problems)
    return [r for rank, p in files for r in _read_metrics(p, problems, run=Path(run_dir).name, rank=rank)], problems


# A rank's metrics file as the runner names it (runner.recorder.open_metrics_file): the rank in
# canonical decimal, so rank0.jsonl and rank00.jsonl (or "rank1\n# x.jsonl") never both count.
_RANK_FILE = re.compile(r"rank(0|[1-9][0-9]{0,8})\.jsonl", re.ASCII)


def _shown_name(text: str) -> str:
    """A file name for a one-line caveat: as is when printable, else its repr (a newline shown as \\n)."""
    return text if text.isprintable() else repr(text)


def _metrics_files(run_dir: Path, problems: list[str]) -> list[tuple[int, Path]]:
    """(rank, path) of the run's metrics/rank<r>.jsonl that are regular files inside the run
    folder, by rank; a metrics folder that loops, leaves the run or is not a folder, a file
    matching rank*.jsonl that is not named rank<r>.jsonl (r in canonical decimal), a symlink
    loop, a link out of the run or a FIFO is a caveat in ``problems``, never read."""
    name = run_dir.name
    folder = run_dir / "metrics"
    if folder.is_symlink() or folder.exists():
        why = (N_("a symlink loop") if resolved(folder) is None else
               N_("a link out of the run's folder") if not is_inside(folder, run_dir) else
               N_("not a folder") if not folder.is_dir() else None)
        if why:
            problems.append(Message(N_("%(folder)s: %(why)s, so no metrics were read; remove it or restore the run's "
                                       "metrics folder"), folder=f"{name}/metrics", why=Message(why)))
            return []
    files, misnamed = [], []
    for p in folder.glob("rank*.jsonl"):
        if m := _RANK_FILE.fullmatch(p.name):
            files.append((int(m.group(1)), p))
        else:
            misnamed.append(p)
    problems.extend(Message(N_("%(file)s: not a rank's metrics file as the runner names them (rank0.jsonl, "
                               "rank1.jsonl, ...); not read (rename or remove it)"),
                            file=_shown_name(f"{name}/metrics/{p.name}"))
                    for p in sorted(misnamed))
    files.sort()
    looped = [p for _, p in files if resolved(p) is None]
    problems.extend(f"{name}/metrics/{p.name}: a symlink loop; not read" for p in looped)
    outside = [p for _, p in files if p not in looped and not is_inside(p, run_dir)]
    problems.extend(f"{name}/metrics/{p.name}: a link to a file outside the campaign; not read" for p in outside)
    outside += looped
    odd = [p for _, p in files if p not in outside and not is_regular_file(p)]
    problems.extend(f"{name}/metrics/{p.name}: not a regular file (a FIFO?); not read" for p in odd)
    return [(r, p) for r, p in files if p not in outside and p not in odd]


# The most read of one rank's metrics JSONL, streamed line by line: a row is ~300 bytes (the
# runner writes one per step), so a line past MAX_METRICS_LINE_BYTES is not a row and a file past
# MAX_METRICS_FILE_BYTES (~200,000 steps) is not one run's; both are caveats, never held whole.
MAX_METRICS_LINE_BYTES = 64 << 10
MAX_METRICS_FILE_BYTES = 64 << 20


def _metrics_lines(path: Path, where: str, problems: list[str]):
    """(line number, text) of a metrics JSONL, streamed within the caps above: a longer line is
    yielded as None (not held), the lines past the file cap are not read (one caveat naming the
    file). OSError as raised; ParseError naming file and line when a line is not UTF-8."""
    with open_regular(path, "rb") as f:
        num_read, lineno = 0, 0
        while raw := f.readline(MAX_METRICS_LINE_BYTES + 1):
            lineno += 1
            num_read += len(raw)
            if len(raw) > MAX_METRICS_LINE_BYTES and not raw.endswith(b"\n"):
                rest = b""
                while num_read <= MAX_METRICS_FILE_BYTES and not rest.endswith(b"\n"):  # skip it, unheld
                    rest = f.readline(1 << 20)
                    num_read += len(rest)
                    if not rest:
                        break
                yield lineno, None
            else:
                try:
                    yield lineno, raw.decode("utf-8").rstrip("\r\n")
                except UnicodeDecodeError as e:
                    raise ParseError(f"{path}:{lineno}: not UTF-8 text ({e.reason}); fix or delete the file") from None
            if num_read > MAX_METRICS_FILE_BYTES:
                if f.read(1):
                    problems.append(Message(N_("%(file)s: larger than %(size)s, not one run's metrics; lines after "
                                               "%(line)s not read (the numbers use the rows before)"), file=where,
                                            size=format_bytes(MAX_METRICS_FILE_BYTES), line=lineno))
                return


def _read_metrics(path: Path, problems: list[str], *, run: str, rank: int,
                  limits: RunLimits | None = None) -> list[dict[str, Any]]:
    """StepRows of one rank's JSONL, streamed (``_metrics_lines``: per-line and per-file caps,
    a caveat naming the file when over), validated: a row is kept only if it is a StepRow of
    ``run`` and ``rank`` (the run's folder and the file's rank: a row of another run or rank
    would count twice), whose numbers are possible (``step_row_problem``, on the run's hardware
    when ``limits`` is given) and whose step is greater than every step kept before it (a
    duplicated or out-of-order row means two writers or a replay: it is dropped, not averaged
    in). Every dropped line is counted in one caveat in ``problems`` naming the file and the
    first few lines; a malformed LAST line is a crash mid-write. Never raises on content;
    ParseError only when a line is not UTF-8."""
    rows: list[dict[str, Any]] = []
    where = f"{path.parent.parent.name}/{path.parent.name}/{path.name}"
    skipped: list[str] = []
    dropped: dict[str, list[str]] = {}  # reason -> "line N" or "line N: detail"
    torn: tuple[int, str] | None = None  # the latest malformed line: the last one is a crash mid-write
    last_step = -1
    try:
        for lineno, line in _metrics_lines(path, where, problems):
            if line is not None and not line.strip():
                continue
            if torn is not None:
                dropped.setdefault(Message(N_("malformed JSON (interleaved writers?)")), []).append(f"line {torn[0]}")
                torn = None
            if line is None:
                dropped.setdefault(Message(N_("longer than %(size)s"), size=format_bytes(MAX_METRICS_LINE_BYTES)),
                                   []).append(f"line {lineno}")
                continue
            try:
                data = json.loads(line)
            except RecursionError:
                dropped.setdefault(Message(N_("JSON nested too deeply")), []).append(f"line {lineno}")
                continue
            except json.JSONDecodeError as e:
                torn = (lineno, e.msg)
                continue
            except ValueError:  # an integer past Python's digit limit (_LONG_INTEGER)
                dropped.setdefault(Message(N_("an integer longer than 4,300 digits")), []).append(f"line {lineno}")
                continue
            _check_metrics_row(path, where, lineno, data, rows, skipped, dropped, last_step, run=run, rank=rank,
                               limits=limits)
            last_step = rows[-1]["step"] if rows else last_step
    except OSError as e:
        problems.append(Message(N_("%(file)s: cannot read (%(error)s); file skipped"), file=where, error=e.strerror or e))
        return []
    if torn is not None:
        problems.append(Message(N_("%(file)s:%(line)s: truncated line skipped (%(why)s; the run stopped mid-write?)"),
                                file=where, line=torn[0], why=torn[1]))
    shown = skipped[:3] + ([Message(N_("%(file)s: %(num)s more such lines"), file=where, num=len(skipped) - 3)]
                           if len(skipped) > 3 else [])
    problems.extend(Message(N_("%(problem)s; line skipped"), problem=text) for text in shown)
    if dropped:
        num = sum(len(v) for v in dropped.values())
        why = MessageList((Message(N_("%(num)s %(reason)s (%(lines)s)"), num=len(v), reason=reason,
                                   lines=", ".join(v[:3]) + (", ..." if len(v) > 3 else ""))
                           for reason, v in dropped.items()), "; ")
        problems.append(Message(N_("%(file)s: %(num)s row(s) dropped: %(why)s; the numbers use the %(valid)s valid rows"),
                                file=where, num=num, why=why, valid=len(rows)))
    return rows


def _check_metrics_row(path: Path, where: str, lineno: int, data: Any, rows: list, skipped: list[str],
                       dropped: dict[str, list[str]], last_step: int, *, run: str, rank: int,
                       limits: RunLimits | None) -> None:
    """Append the parsed line ``data`` to ``rows`` as a StepRow dict, or say in ``skipped`` /
    ``dropped`` why not (a row must name ``run`` and ``rank``)."""
    if not isinstance(data, dict):
        skipped.append(Message(N_("%(file)s:%(line)s: expected a JSON object, got %(type)s"), file=where, line=lineno,
                               type=type(data).__name__))
        return
    _check_version(path, data, lineno)
    bad = _field_problems(StepRow, data)
    if bad:
        skipped.append(Message(N_("%(file)s:%(line)s: not a StepRow (%(problems)s)"), file=where, line=lineno,
                               problems="; ".join(bad)))
        return
    if data["run"] != run or data["rank"] != rank:
        reason = Message(N_("naming another run or rank than the file's (%(run)s, rank %(rank)s)"), run=run, rank=rank)
        dropped.setdefault(reason, []).append(f"line {lineno}: {str(data['run'])[:40]!r}, rank {str(data['rank'])[:20]}")
        return
    prev = rows[-1] if rows and rows[-1]["step"] == data["step"] - 1 else None
    impossible = step_row_problem(data, limits, prev_step_time_s=prev["step_time_s"] if prev else None)
    if impossible:
        dropped.setdefault(Message(N_("impossible values")), []).append(f"line {lineno}: {impossible}")
        return
    if data["step"] <= last_step:
        dropped.setdefault(Message(N_("duplicate or out-of-order step")), []).append(f"line {lineno}")
        return
    rows.append(dataclasses.asdict(StepRow(**data)))


# StepRow fields that must be finite and >= 0 (step_time_s > 0); loss and grad_norm may be
# NaN/inf (a diverged run is data) but never negative; None where the schema allows it.
_NON_NEGATIVE_FIELDS = ("step", "tokens", "lr", "data_wait_s", "wall_time_s", "mem_peak_allocated_gib",
                        "mem_peak_reserved_gib", "step_entry_time_s")


# Physical bounds of a metrics row: past them a value is a corrupt or forged file, not a
# measurement. A step takes >= 1 us (a kernel launch) and < 1e6 s (11 days); a step reads < 2^40
# tokens (the largest published global batches are ~2^24); no device holds 4 TiB; a rank's
# clock (wall_time_s, data_wait_s, step_entry_time_s -- the last is Unix time, ~1.8e9 s in 2026)
# stays under 1e10 s (the year 2286); < 1e12
# tokens/s per row (a 100,000-GPU cluster at 10M tokens/s each); a step number stays under 1e9
# (30 years of 1-second steps; the matrix allows 1e7 steps).
STEP_TIME_RANGE_S = (1e-6, 1e6)
MAX_STEP_NUMBER = 10**9
MAX_STEP_TOKENS = 1 << 40
MAX_MEM_PEAK_GIB = 4096.0
MAX_CLOCK_S = 1e10
MAX_TOKENS_PER_S = 1e12
_UPPER_BOUNDS = {"step": MAX_STEP_NUMBER, "tokens": MAX_STEP_TOKENS, "mem_peak_allocated_gib": MAX_MEM_PEAK_GIB,
                 "mem_peak_reserved_gib": MAX_MEM_PEAK_GIB, "wall_time_s": MAX_CLOCK_S, "data_wait_s": MAX_CLOCK_S,
                 "step_entry_time_s": MAX_CLOCK_S}


@dataclass(frozen=True, kw_only=True)
class RunLimits:
    """What one run's hardware can produce: the range checks of its metrics rows past the flat
    caps (``step_row_problem``). A None field is not checked (an unknown GPU keeps the flat caps).

    gpu_name: the run's GPU as recorded (None on CPU). mem_gib: the most device memory one rank
    can hold (GiB). flops_per_token, peak_flops, num_gpus: core.formulas.compute_mfu's inputs
    (num_gpus: ranks on CPU, peak_flops: MAX_CPU_FLOPS_PER_RANK there); a row whose MFU is above 1
    is impossible. host_ahead: device-timed steps (CUDA events, runner.recorder), where
    the host fetches the next batch while the device still runs the previous step, so a row's
    data_wait_s may exceed its step_time_s by up to the previous step's; False for perf_counter
    timing (CPU), where the wait lies inside the step."""

    gpu_name: str | None = None
    mem_gib: float | None = None
    flops_per_token: float | None = None
    peak_flops: float | None = None
    num_gpus: int = 1
    host_ahead: bool = False


# A CPU rank's FLOP/s bound (hardware.toml lists no CPU peak): 1e14 FLOP/s, 100 TFLOP/s. The
# fastest CPU sockets reach a few TFLOP/s dense fp32 (192 Zen 5 cores x 2 AVX-512 FMA units x 16
# lanes x 2 FLOPs x ~3 GHz = ~37 TFLOP/s; AMX bf16 on a 128-core Xeon ~ a few hundred on paper,
# far less on a model step), so no CPU process's model FLOP/s reaches it; the tiny CPU presets
# run at ~1e10.
MAX_CPU_FLOPS_PER_RANK = 1e14


def build_run_limits(spec: RunSpec, *, info: Mapping[str, Any] | None, env: EnvRecord) -> RunLimits:
    """The RunLimits of a run from its spec, run_info.json (a dict as _read_record gives it, or
    None) and the campaign's environment record. The GPU: run_info's device_name, else env.json's
    first GPU (CUDA runs only). mem_gib: hardware.toml's memory_gib for it; env.json's
    memory_total of GPUs of that name only where hardware.toml lists no memory for it (a larger
    env.json value for a listed GPU is a caveat, ``env_memory_problems``). peak_flops: its highest
    dense peak over the dtypes hardware.toml lists (a fp32 run may use TF32 tensor cores),
    core.hardware.lookup_peak; MAX_CPU_FLOPS_PER_RANK for a CPU run. flops_per_token: the most
    core.formulas.compute_flops_per_token gives over its conventions (6N+12LHQT), from run_info's
    parameter counts, so no MFU the note prints, in any convention, is above 1. ConfigError from
    an invalid hardware table."""
    from core.formulas import FLOPS_CONVENTIONS, compute_flops_per_token
    from core.hardware import DTYPES, lookup_gpu, lookup_peak

    host_ahead = spec.device != "cpu"
    fpt, model = None, spec.fixed.model
    if info and info.get("num_params") is not None and info.get("num_params_position_embedding") is not None:
        try:
            fpt = max(compute_flops_per_token(num_params=int(info["num_params"]), num_layers=model.num_layers,
                                              hidden_size=model.hidden_size, seq_length=model.seq_length,
                                              position_embedding_params=int(info["num_params_position_embedding"]),
                                              convention=c) for c in FLOPS_CONVENTIONS)
        except ValueError:  # N <= 0: a damaged run_info.json; MFU is n/a in the note too
            fpt = None
    if spec.device == "cpu":
        return RunLimits(flops_per_token=fpt, peak_flops=MAX_CPU_FLOPS_PER_RANK, num_gpus=spec.world_size,
                         host_ahead=host_ahead)
    gpu = ((info or {}).get("device_name") or (env.gpus[0].name if env.gpus else None)) if spec.device == "cuda" else None
    if not gpu:
        return RunLimits(host_ahead=host_ahead)
    peak = max((p.flops for d in DTYPES if (p := lookup_peak(gpu, d)) is not None), default=None)
    entry = lookup_gpu(gpu)
    mem = entry.memory_gib if entry is not None and entry.memory_gib else max(
        (g.memory_total_mib / 1024 for g in env.gpus if g.name == gpu and g.memory_total_mib), default=None)
    return RunLimits(gpu_name=gpu, mem_gib=mem, flops_per_token=fpt, peak_flops=peak,
                     num_gpus=spec.world_size, host_ahead=host_ahead)


def env_memory_problems(env: EnvRecord) -> list[str]:
    """One caveat per GPU name whose env.json memory_total is more than hardware.toml's
    memory_gib for it (compared at the table's 0.1 GiB: an H100's 81,559 MiB is its 79.6 GiB):
    no GPU holds more memory than its model has, so env.json is wrong or forged; its rows are
    checked against hardware.toml's value (build_run_limits). Plain text in env.json's caveat
    form (core.records.env_record_from_dict), as its other field caveats."""
    from core.hardware import lookup_gpu

    out = []
    for name in dict.fromkeys(g.name for g in env.gpus if g.name and g.memory_total_mib):
        entry = lookup_gpu(name)
        i, mib = max(((i, g.memory_total_mib) for i, g in enumerate(env.gpus) if g.name == name and g.memory_total_mib),
                     key=lambda x: x[1])
        if entry is not None and entry.memory_gib and round(mib / 1024, 1) > entry.memory_gib:
            out.append(f"env.json: gpus[{i}].memory_total_mib: {mib!r} MiB ({mib / 1024:.1f} GiB) is impossible for the "
                       f"{name} ({entry.memory_gib:.1f} GiB in hardware.toml); its ranks' memory peaks are checked "
                       f"against {entry.memory_gib:.1f} GiB")
    return out


def _hardware_problems(row: dict[str, Any], limits: RunLimits, *, prev_step_time_s: float | None) -> list[str]:
    """Why a row whose values pass the flat caps is still impossible on the run's hardware."""
    from core.formulas import compute_mfu

    gpu, out = limits.gpu_name, []
    if limits.mem_gib is not None:
        out += [f"{k} {row[k]!r} (> {limits.mem_gib:.1f} GiB, all of one {gpu}'s memory)"
                for k in ("mem_peak_allocated_gib", "mem_peak_reserved_gib")
                if row.get(k) is not None and row[k] > limits.mem_gib]
    step_s = row["step_time_s"]
    tokens_per_s = row["tokens"] / step_s
    mfu = compute_mfu(tokens_per_s, flops_per_token=limits.flops_per_token, peak_flops=limits.peak_flops,
                      num_gpus=limits.num_gpus)
    if mfu is not None and mfu > 1:
        out.append(f"tokens/step_time_s {tokens_per_s:.3g} (MFU {mfu:.0%}: more model FLOP/s per GPU than the "
                   f"{gpu}'s dense peak, {limits.peak_flops:.3g})" if gpu else
                   f"tokens/step_time_s {tokens_per_s:.3g} ({mfu * limits.peak_flops:.3g} model FLOP/s per rank: "
                   f"more than a CPU process reaches, {limits.peak_flops:.3g})")
    slack = (prev_step_time_s if limits.host_ahead else 0.0)
    if slack is not None and row["data_wait_s"] > step_s + slack:
        out.append(f"data_wait_s {row['data_wait_s']:.3g} (> step_time_s {step_s:.3g}"
                   + (f" + the previous step's {slack:.3g})" if limits.host_ahead else ")"))
    return out


def step_row_problem(row: dict[str, Any], limits: RunLimits | None = None, *,
                     prev_step_time_s: float | None = None) -> str | None:
    """Why a metrics row (type-checked StepRow fields) holds an impossible number, or None.
    Checks: step_time_s finite and within STEP_TIME_RANGE_S; the counters, times and memory
    finite, >= 0 and within _UPPER_BOUNDS; tokens / step_time_s <= MAX_TOKENS_PER_S; loss and
    grad_norm not negative; rank >= 0; an integer fits int64 (the tables' column type). With
    the run's ``limits`` (build_run_limits), a row passing those must also fit its hardware: each
    memory peak within the GPU's memory, MFU (core.formulas.compute_mfu) at most 1, and
    data_wait_s within step_time_s (plus ``prev_step_time_s``, the previous step's time on this
    rank, where limits.host_ahead; not checked there when it is None)."""
    import math

    def bad(v: Any, *, positive: bool = False, finite: bool = True) -> bool:
        if v is None:
            return False
        if isinstance(v, int) and not -2**63 <= v < 2**63:
            return True
        if finite and not math.isfinite(v):
            return True
        return v <= 0 if positive else v < 0

    out = [f"{k} {row[k]!r}" for k in _NON_NEGATIVE_FIELDS if k in row and bad(row[k])]
    out += [f"{k} {row[k]!r} (> {most:g})" for k, most in _UPPER_BOUNDS.items()
            if row.get(k) is not None and f"{k} {row[k]!r}" not in out and row[k] > most]
    step_s = row.get("step_time_s")
    if bad(step_s, positive=True):
        out.insert(0, f"step_time_s {step_s!r}")
    elif step_s is not None and not STEP_TIME_RANGE_S[0] <= step_s <= STEP_TIME_RANGE_S[1]:
        out.insert(0, f"step_time_s {step_s!r} (outside {STEP_TIME_RANGE_S[0]:g}..{STEP_TIME_RANGE_S[1]:g} s)")
    elif not out and isinstance(row.get("tokens"), int) and row["tokens"] / step_s > MAX_TOKENS_PER_S:
        out.append(f"tokens/step_time_s {row['tokens'] / step_s:.3g} (> {MAX_TOKENS_PER_S:g} tokens/s)")
    out += [f"{k} {row[k]!r}" for k in ("loss", "grad_norm") if bad(row.get(k), finite=False)]
    if bad(row.get("rank")):
        out.append(f"rank {row['rank']!r}")
    if not out and limits is not None:
        out = _hardware_problems(row, limits, prev_step_time_s=prev_step_time_s)
    return ", ".join(out) or None


_POSITIVE_SPEC_FIELDS = ("world_size", "tp_degree", "pp_degree", "dp_degree", "micro_batch_size", "num_microbatches")


def _load_run(run_dir: Path, name: str, problems: list[str], *,
              env: EnvRecord) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
    # the run's folder and its records must stay in the campaign: a symlink out is refused (ConfigError naming it)
    check_run_inside(run_dir.parent, name)
    spec_path = run_dir / "spec.json"
    if not spec_path.exists():
        problems.append(Message(N_("run %(run)s: no %(path)s (never started?); left out of the note"), run=name, path=spec_path))
        return None
    raw = _read_json(spec_path)
    if not isinstance(raw, dict):
        problems.append(Message(N_("run %(run)s: %(run)s/spec.json is not a JSON object; left out of the note"), run=name))
        return None
    _check_version(spec_path, raw)
    if run_name_problem(raw.get("name")):  # the name becomes a path: <campaign>/<name>/logs, trace
        raise ParseError(f"{spec_path}: {run_name_problem(raw.get('name'))}; the campaign is damaged or not ours")
    if raw["name"] != name:  # a spec copied from another run: its layout may be that run's, so no label is safe
        problems.append(Message(N_("run %(run)s: %(run)s/spec.json names the run %(other)s, not its folder; left out of "
                                   "the note (`runner all --resume` refuses it too; restore the run's own spec.json)"),
                                run=name, other=repr(raw["name"])))
        return None
    bad = _field_problems(RunSpec, raw)
    bad += [f"{k}: must be >= 1, got {raw[k]!r}" for k in _POSITIVE_SPEC_FIELDS
            if not bad and isinstance(raw.get(k), int) and raw[k] < 1]
    if bad:
        problems.append(Message(N_("run %(run)s: %(run)s/spec.json does not match RunSpec (%(problems)s); left out of "
                                   "the note (regenerate it with `runner all`)"), run=name, problems="; ".join(bad)))
        return None
    spec = run_spec_from_dict(raw)
    row: dict[str, Any] = {"run": spec.name}
    for key, value in dataclasses.asdict(spec).items():
        if key == "fixed":
            row.update({k: v for k, v in value.items() if k != "model"})
            row.update(value["model"])
        elif key not in ("name", "schema_version"):
            # nested records as JSON text, so Parquet keeps one column type (plant: None or an object)
            row[key] = json.dumps(value, sort_keys=True) if key in SPEC_JSON_COLUMNS and value is not None else value
    row["tokens_per_step"] = spec.tokens_per_step
    status = _read_record(run_dir / "status.json", RunStatus, problems)
    for f in dataclasses.fields(RunStatus):
        if f.name not in ("run", "schema_version", "engine"):  # the spec's engine is what was asked
            value = status[f.name] if status else None
            if f.name == "command" and status:
                value = json.dumps(list(value))
            elif f.name == "diagnosis" and value is not None:
                value = json.dumps(value, sort_keys=True)  # free-form evidence: text, so Parquet keeps one type
            row[f.name] = value
    info = _read_record(run_dir / "run_info.json", RunInfo, problems)
    for f in dataclasses.fields(RunInfo):
        if f.name not in ("run", "schema_version", "engine"):
            value = info[f.name] if info else None
            row[f.name] = (json.dumps(list(value)) if isinstance(value, (tuple, list))
                           else json.dumps(value, sort_keys=True) if isinstance(value, dict) else value)
    ckpt = _read_record(run_dir / "checkpoint.json", CheckpointRecord, problems)
    for col in CHECKPOINT_COLUMNS:
        value = ckpt[col[5:]] if ckpt else None
        row[col] = json.dumps(list(value)) if isinstance(value, (tuple, list)) else value
    files = _metrics_files(run_dir, problems)
    limits = build_run_limits(spec, info=info, env=env)
    steps = [r for rank, p in files for r in _read_metrics(p, problems, run=name, rank=rank, limits=limits)]
    row["num_metric_files"], row["num_metric_rows"] = len(files), len(steps)
    if not steps and status is None:
        problems.append(Message(N_("run %(run)s: neither metrics nor status.json in %(folder)s; the run left no record"),
                                run=name, folder=run_dir))
    return row, steps


def load_campaign(path: str | os.PathLike[str]) -> Campaign:
    """Load a campaign directory (raw runner artifacts) or a tables directory (``write_tables``).

    Raises NoDataError (path missing, empty, neither a campaign nor a tables dir, no run with
    metrics or a status) and ParseError (malformed JSON/JSONL/Parquet, naming file and line).
    """
    root = Path(path)
    if not root.exists():
        raise NoDataError(f"{root}: no such directory; pass a campaign directory written by `runner all`")
    if not root.is_dir():
        raise NoDataError(f"{root}: is a file, not a directory; pass a campaign directory written by `runner all`")
    if (root / RUNS_TABLE).is_file() and not (root / "campaign.json").is_file():
        return load_tables(root)
    if not (root / "campaign.json").is_file():
        what = "is empty" if not any(root.iterdir()) else "is not a campaign (no campaign.json) nor a tables dir (no runs.parquet)"
        raise NoDataError(f"{root}: {what}; pass a directory written by `runner all` or `ingest`")
    campaign = _read_json(root / "campaign.json")
    if not isinstance(campaign, dict) or not isinstance(campaign.get("runs", []), list):
        raise ParseError(f"{root / 'campaign.json'}: expected an object with a 'runs' list; regenerate it")
    _check_version(root / "campaign.json", campaign)
    if "fixed" not in campaign:
        raise ParseError(f"{root / 'campaign.json'}: no 'fixed' (the campaign's fixed variables); regenerate it")
    bad = _field_problems(FixedConfig, campaign["fixed"], "fixed.")  # a wrong one mislabels every number
    if bad:
        raise ParseError(f"{root / 'campaign.json'}: {'; '.join(bad)}; regenerate it with `runner all`")
    problems: list[str] = []
    env_json: Any = {}
    if (root / "env.json").is_file():
        env_json = _read_json(root / "env.json")
        if not isinstance(env_json, dict):
            raise ParseError(f"{root / 'env.json'}: expected a JSON object; regenerate it with `runner env`")
    else:
        problems.append(Message(N_("%(file)s is missing: the environment section is empty"), file=root / "env.json"))
    env, _ = env_record_from_dict(env_json)  # its caveats are build_campaign's; here: the GPUs for RunLimits
    problems += env_memory_problems(env)
    names = campaign.get("runs") or sorted(p.parent.name for p in root.glob("*/spec.json"))
    bad_names = [p for n in names if (p := run_name_problem(n))]
    twice = sorted({str(n) for n in names if names.count(n) > 1}) if not bad_names else []
    bad_names += [f"run name {n!r} is listed twice (a run would be compared with itself)" for n in twice[:3]]
    if bad_names:  # a name is a path under the campaign: '../x' or '/etc' would read outside it
        raise ParseError(f"{root / 'campaign.json'}: {'; '.join(bad_names[:3])}; the campaign is damaged or not ours")
    rows, steps = [], []
    live = live_runner(root)
    for name in names:
        if live and not (root / str(name) / "status.json").is_file():
            problems.append(Message(N_("run %(run)s: not finished yet; the campaign's runner is still running (%(live)s), "
                                       "so this note leaves the run out; build the note again once `%(command)s` shows it "
                                       "done"), run=name, live=live, command=shlex.join(["runner", "status", str(root)])))
            continue
        loaded = _load_run(root / str(name), str(name), problems, env=env)
        if loaded:
            rows.append(loaded[0])
            steps.extend(loaded[1])
    if not any(r["num_metric_rows"] or r["status"] for r in rows):
        also = f" (problems: {'; '.join(problems)})" if problems else ""
        raise NoDataError(f"{root}: no run has metrics (metrics/rank*.jsonl) or a status.json{also}; "
                          "run `runner all` first")
    import pandas as pd

    runs_df = pd.DataFrame(rows).astype({c: "Int64" for c in _INT_COLUMNS if rows and c in rows[0]})
    steps_df = pd.DataFrame(steps, columns=list(STEP_COLUMNS))
    steps_df = steps_df.astype({c: "float64" for c in ("loss", "grad_norm", "mem_peak_allocated_gib", "mem_peak_reserved_gib",
                                              "step_entry_time_s")})
    return build_campaign(source=str(root), campaign_json=campaign, env_json=env_json, runs=runs_df, steps=steps_df,
                          problems=problems)


def live_runner(root: Path) -> str | None:
    """'pid P on HOST since T' when a live runner holds campaign ``root`` (its lock,
    runner.owner: a live pid on this host, or a lock written on another host), else None."""
    from runner.owner import lock_path, read_lock

    state = read_lock(lock_path(root))
    return state.describe() + (" (another host)" if state.state == "foreign" else "") \
        if state is not None and state.state in ("held", "foreign") else None


def build_campaign(*, source: str, campaign_json: Mapping[str, Any], env_json: Mapping[str, Any], runs: pd.DataFrame,
                   steps: pd.DataFrame, problems: Sequence[str] = ()) -> Campaign:
    """A Campaign from campaign.json's and env.json's objects (decoded here, the one place:
    core.records' lenient decoders; each value of the wrong type dropped with a caveat appended to
    ``problems``, unless it is there already) and the tables. Raises KeyError when campaign.json
    has no ``fixed`` (callers check it first, with a message naming the file)."""
    # credentials by value (core.redact), also in campaigns recorded before the runner redacted them
    campaign_json, env_json = redact_value(campaign_json), redact_value(env_json)
    record, campaign_problems = campaign_record_from_dict(campaign_json)
    env, env_problems = env_record_from_dict(env_json)
    found = [p for p in (*env_problems, *campaign_problems) if p not in problems]
    return Campaign(source=source, campaign=record, env=env, campaign_json=campaign_json, runs=runs, steps=steps,
                    problems=(*problems, *found))


def write_tables(campaign: Campaign, out_dir: str | os.PathLike[str]) -> list[Path]:
    """Write ``runs.parquet`` and ``steps.parquet`` into ``out_dir`` (created), atomically.

    Parquet key-value metadata carries schema_version, campaign.json (as written), the
    environment record (core.records.EnvRecord as JSON) and the load problems (JSON), so
    ``load_campaign(out_dir)`` restores an equal Campaign.
    Returns the written paths.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    meta = {"schema_version": SCHEMA_VERSION, "campaign": campaign.campaign_json, "env": to_dict(campaign.env),
            "problems": list(campaign.problems)}
    out = []
    for name, df in ((RUNS_TABLE, campaign.runs), (STEPS_TABLE, campaign.steps)):
        table = pa.Table.from_pandas(df, preserve_index=False)
        kv = dict(table.schema.metadata or {})
        kv.update({k.encode(): json.dumps(v).encode() for k, v in meta.items()})
        sink = pa.BufferOutputStream()
        pq.write_table(table.replace_schema_metadata(kv), sink)
        out.append(write_bytes_atomic(Path(out_dir) / name, sink.getvalue().to_pybytes()))
    return out


def load_tables(path: str | os.PathLike[str]) -> Campaign:
    """Read a folder written by ``write_tables``. Raises NoDataError / ParseError."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = Path(path)
    frames, meta = [], {}
    for name in (RUNS_TABLE, STEPS_TABLE):
        try:
            table = pq.read_table(root / name)
        except FileNotFoundError:
            raise NoDataError(f"{root / name}: missing; rerun `ingest` to write both tables") from None
        except (pa.ArrowException, OSError) as e:
            raise ParseError(f"{root / name}: not a readable Parquet file ({e}); rerun `ingest`") from None
        kv = table.schema.metadata or {}
        try:
            meta = {k: json.loads(kv[k.encode()]) for k in _META_KEYS}
        except (KeyError, ValueError, RecursionError):  # ValueError: malformed JSON or an over-long integer
            raise ParseError(f"{root / name}: no schema_version/campaign metadata; was it written by `ingest`?") from None
        if meta["schema_version"] > SCHEMA_VERSION:
            raise ParseError(f"{root / name}: schema_version {meta['schema_version']} is newer than {SCHEMA_VERSION}; upgrade the tool")
        frames.append(table.to_pandas())
    if not isinstance(meta["campaign"], dict) or not isinstance(meta["campaign"].get("fixed"), dict) \
            or not isinstance(meta["env"], dict):
        raise ParseError(f"{root / STEPS_TABLE}: campaign/env metadata are not objects; rerun `ingest`")
    # the environment record as written (older folders: env.json's object, its caveats found again)
    return build_campaign(source=str(root), campaign_json=meta["campaign"], env_json=meta["env"], runs=frames[0],
                          steps=frames[1], problems=meta["problems"])


def _text(raw, path):
    """A binary file object (at its start) as UTF-8 text (undecodable bytes replaced, newlines
    untranslated), gzip-decompressed within the caps below when it starts with gzip's magic
    bytes (a rank log kept as ``rank0.log.gz``): the name is not looked at, only named in the
    ParseError of a bomb. Closing the text leaves ``raw`` to its owner."""
    magic = raw.read(2)
    raw.seek(0)
    binary = _bounded_gzip(raw, path) if magic == _GZIP_MAGIC else raw
    return io.TextIOWrapper(binary, encoding="utf-8", errors="replace", newline="")


# A gzip file is read decompressed only while it stays within what real logs and traces give:
# up to MAX_DECOMPRESSED_BYTES in all, and beyond the first DECOMPRESSED_FREE_BYTES at most
# MAX_DECOMPRESSION_RATIO times the compressed bytes read so far. Kineto traces compress ~14x,
# our own rank logs up to ~190x (examples/h200-2gpu/megatron-tp2: repeated NCCL lines); a bomb
# of one repeated line ~470x, of one byte ~1000x. Checked as it is read, with the compressed
# side read in COMPRESSED_READ_BYTES pieces (gzip reads ahead 128 KiB, which at 300x would let
# 37 MiB through), so a bomb stops after about DECOMPRESSED_FREE_BYTES, before it is parsed.
MAX_DECOMPRESSED_BYTES = 4 << 30
MAX_DECOMPRESSION_RATIO = 300
DECOMPRESSED_FREE_BYTES = 8 << 20
COMPRESSED_READ_BYTES = 16 << 10


class _SmallReads(io.RawIOBase):
    """``raw`` read at most COMPRESSED_READ_BYTES at a time, so its position is what the
    decompressor has taken."""

    def __init__(self, raw) -> None:
        super().__init__()
        self._raw = raw

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        data = self._raw.read(min(len(buffer), COMPRESSED_READ_BYTES))
        buffer[:len(data)] = data
        return len(data)

    def read(self, size: int = -1) -> bytes:
        return self._raw.read(COMPRESSED_READ_BYTES if size < 0 else min(size, COMPRESSED_READ_BYTES))

    def seek(self, offset: int, whence: int = 0) -> int:  # gzip rewinds a few bytes at a member's end
        return self._raw.seek(offset, whence)

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._raw.tell()


class _BoundedGzipReader(io.RawIOBase):
    """gzip.GzipFile over ``raw`` that raises ParseError naming the file once the decompressed
    bytes pass the caps above. Closing it leaves ``raw`` to its owner."""

    def __init__(self, raw, path) -> None:
        import gzip

        super().__init__()
        self._raw, self._path, self._num_out = raw, path, 0
        self._gz = gzip.GzipFile(fileobj=_SmallReads(raw), mode="rb")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        num = self._gz.readinto(buffer)
        self._num_out += num
        if self._num_out > DECOMPRESSED_FREE_BYTES:
            num_in = max(1, self._raw.tell())
            if self._num_out > MAX_DECOMPRESSED_BYTES or self._num_out > MAX_DECOMPRESSION_RATIO * num_in:
                raise ParseError(
                    f"{self._path}: gzip expands past {format_bytes(self._num_out)} from {format_bytes(num_in)} (more than "
                    f"{MAX_DECOMPRESSION_RATIO}x or {format_bytes(MAX_DECOMPRESSED_BYTES)}): a decompression bomb, "
                    "not a log or trace; not read further (a real file: decompress it with gunzip and pass that)")
        return num

    def close(self) -> None:
        self._gz.close()
        super().close()


def _bounded_gzip(raw, path):
    """A buffered binary reader of the gzip stream in ``raw`` (the file ``path``) within the
    decompression caps."""
    return io.BufferedReader(_BoundedGzipReader(raw, path), 1 << 16)


def _gzip_error(path) -> ParseError:
    return ParseError(f"{path}: truncated gzip stream, or corrupt data in it; re-copy the file")


def iter_text_blocks(path: str | os.PathLike[str], *, block_chars: int = 1 << 20):
    """The text of a file (third-party log) as a ``TextBlocks``: blocks of whole lines, streamed.

    Lines end at ``\\n``, ``\\r\\n`` or a lone ``\\r`` (as Python's universal newlines split
    them: progress bars redraw with ``\\r``); each block is cut after its last newline, so a
    block holds about ``block_chars`` characters and memory stays bounded (a line longer than
    MAX_LINE_CHARS is cut into pieces of that length). A gzip file is read decompressed within
    the decompression caps (``_text``; a bomb raises ParseError naming the file where the reading
    reaches the cap). Bytes that are not UTF-8 are replaced, so this never raises a
    decode error; a missing/unreadable file raises ParseError naming it (at the call, before
    any block is read), a truncated or corrupt gzip stream raises ParseError where the reading
    reaches it.
    """
    import gzip
    import zlib

    from ingest.parsers import TextBlocks
    try:
        raw = open_regular(path, "rb")
    except OSError as e:
        raise ParseError(f"{path}: cannot read ({e.strerror}); check the path and permissions") from None

    def chunks():
        with raw, _text(raw, path) as f:
            try:
                while data := f.read(block_chars):
                    yield data
            except (EOFError, zlib.error, gzip.BadGzipFile):
                raise _gzip_error(path) from None

    def blocks():
        rest = ""
        for data in chunks():
            data = rest + data
            cut = data.rfind("\n")
            if cut < 0:  # a lone \r ends a line too (not a last one: maybe half of a \r\n)
                cut = data.rfind("\r", 0, len(data) - 1)
            if cut < 0:
                if len(data) > MAX_LINE_CHARS:  # no line is this long: cut it, so memory stays bounded
                    yield data
                    data = ""
                rest = data
                continue
            block = data[:cut - 1] if data[cut] == "\n" and cut and data[cut - 1] == "\r" else data[:cut]
            yield _newlines(block)
            rest = data[cut + 1:]
        if rest:
            rest = _newlines(rest)
            if not rest.endswith("\n"):
                out.ends_cut = True
            yield rest[:-1] if rest.endswith("\n") else rest
    out = TextBlocks(blocks())
    return out


# A line longer than this is cut into pieces of about this many characters by iter_text_blocks:
# no log line is (the longest real ones, a tensor printed whole, are ~1 MB), and a file with no
# newline at all (a binary, a gzip bomb of one byte) must not grow one string without end.
MAX_LINE_CHARS = 16 << 20


def _newlines(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\r", "\n") if "\r" in text else text


def read_text_head(path: str | os.PathLike[str], num_chars: int = 64 * 1024) -> str:
    """The first ``num_chars`` characters of a text file (for detecting its kind), gzip
    decompressed as ``_text`` reads it. Raises ParseError."""
    import gzip
    import zlib

    try:
        with open_regular(path, "rb") as raw, _text(raw, path) as f:
            return f.read(num_chars)
    except (EOFError, zlib.error, gzip.BadGzipFile):
        raise _gzip_error(path) from None
    except OSError as e:
        raise ParseError(f"{path}: cannot read ({e.strerror or e}); check the path and permissions") from None


_GZIP_MAGIC = b"\x1f\x8b"


# The most events one trace file may yield: a torch.profiler window of a few steps of a large
# model holds 10^4-10^6; past this the file is refused (ParseError), so memory stays bounded
# whatever the file's size or layout (repeated or concatenated documents).
MAX_TRACE_EVENTS = 5_000_000


def open_trace_events(path: str | os.PathLike[str], *, counts=None, lean: bool = False):
    """Yield the events of a Chrome trace file (torch.profiler / Kineto, NCCL profiler plugin,
    pasted fragments), streamed: gzip is detected by its magic bytes (1f 8b), not by the name.

    counts: an ``ingest.trace_reader.TraceReadCounts`` to receive events read, items skipped and
    truncation. lean: skip flow events and cpu_op args (``iter_trace_events``). Raises ParseError
    if the file cannot be opened, is a corrupt gzip stream or yields more than MAX_TRACE_EVENTS.
    """
    import gzip

    from ingest.trace_reader import iter_trace_events

    try:
        raw = open_regular(path, "rb")
    except OSError as e:
        raise ParseError(f"{path}: cannot read ({e.strerror}); check the path and permissions") from None
    with raw:
        magic = raw.read(2)
        raw.seek(0)
        fp = _bounded_gzip(raw, path) if magic == _GZIP_MAGIC else raw
        try:
            for num_events, event in enumerate(iter_trace_events(fp, counts=counts, lean=lean), 1):
                if num_events > MAX_TRACE_EVENTS:
                    raise ParseError(f"{path}: more than {MAX_TRACE_EVENTS:,} trace events, where a profiler window "
                                     "of a few steps holds far fewer; not read. Profile fewer steps "
                                     "(profile_num_steps) or cut the trace to the steps you need")
                yield event
        except (OSError, EOFError, gzip.BadGzipFile) as e:
            raise ParseError(f"{path}: corrupt gzip stream ({e}); re-copy the trace") from None


def write_lean_trace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> tuple[int, int]:
    """Write the torch.profiler (Kineto) trace ``src`` (plain or gzip) to ``dst`` (gzip) holding
    only what the step breakdown reads (``ingest.trace_reader.iter_trace_events`` with lean=True):
    the document's header fields in their order, and of its events the complete ones (ph "X")
    of the categories kernel, gpu_memcpy, gpu_memset, cuda_runtime, cuda_driver and
    user_annotation, plus cpu_op for a trace without CUDA devices. Section 5's numbers from
    ``dst`` equal those from ``src``; cpu_op, flow (ac2g) and fwdbwd events, most of a GPU
    trace's bytes, are left out. Returns (events in, events kept). Raises ParseError when
    ``src`` is unreadable or is not a Kineto trace document."""
    import gzip

    from ingest.trace_reader import _LEAN_CATS

    try:
        with open_regular(src, "rb") as raw:
            magic = raw.read(2)
            raw.seek(0)
            doc = json.load(_bounded_gzip(raw, src) if magic == _GZIP_MAGIC else raw)
    except (OSError, EOFError, gzip.BadGzipFile, ValueError, RecursionError) as e:
        raise ParseError(f"{src}: not a readable trace ({e}); pass a torch.profiler trace file") from None
    events = doc.get("traceEvents") if isinstance(doc, dict) else None
    if not isinstance(events, list) or "schemaVersion" not in doc:
        raise ParseError(f"{src}: not a torch.profiler (Kineto) trace document: no schemaVersion/traceEvents")
    cats = set(_LEAN_CATS) | (set() if doc.get("deviceProperties") else {"cpu_op"})
    doc["traceEvents"] = [e for e in events if isinstance(e, dict) and e.get("ph") == "X" and e.get("cat") in cats]
    write_bytes_atomic(dst, gzip.compress(json.dumps(doc).encode("utf-8"), compresslevel=9, mtime=0))
    return len(events), len(doc["traceEvents"])


@dataclass(frozen=True, kw_only=True)
class TraceTables:
    """Section 5's inputs for a campaign dir, from each run's trace/ and logs/.

    breakdown / kernels / spans: StepBreakdownRow / KernelSummaryRow / TimelineSpanRow columns
    (ingest.traces over trace/profile_rank<r>.json[.gz]); meta: one row per rank's
    trace/profile_meta_rank<r>.json (run, rank, export_s, trace_bytes...); nccl: run -> lines
    summarising the NCCL communicators and transports in logs/rank*.log; nccl_transports:
    run -> transport names; warnings: what could not be read or analysed (caveats)."""

    breakdown: pd.DataFrame
    kernels: pd.DataFrame
    spans: pd.DataFrame
    meta: pd.DataFrame
    nccl: dict[str, list[str]]
    nccl_transports: dict[str, list[str]]
    warnings: tuple[str, ...] = ()
    # ingest.attribution across each run's ranks: AttributionRow / CollectiveRow columns
    attribution: pd.DataFrame | None = None
    collectives: pd.DataFrame | None = None
    whatif: pd.DataFrame | None = None  # ingest.whatif: WhatIfRow columns


# Section 5's tables as written by ``write_trace_tables`` (a run's <run>/tables/ or an ingest folder)
TRACE_TABLE_FILES = {"breakdown": "trace_breakdown.parquet", "kernels": "trace_kernels.parquet",
                     "spans": "trace_spans.parquet", "meta": "trace_meta.parquet",
                     "attribution": "trace_attribution.parquet", "collectives": "trace_collectives.parquet",
                     "whatif": "trace_whatif.parquet", "nccl": "trace_nccl.parquet"}
RUN_TABLES_DIR = "tables"
_TRACE_META_COLUMNS = ["run", "rank", "export_s", "trace_bytes"]


def _run_layout(run: Any) -> tuple[int, int]:
    """(pp_degree, num_microbatches) of a run row, 1 where missing."""
    import pandas as pd

    pp = int(run["pp_degree"]) if not pd.isna(run.get("pp_degree")) else 1
    m = run.get("num_microbatches")
    return pp, int(m) if m is not None and not pd.isna(m) and int(m) >= 1 else 1


# Bump when ingest.traces / ingest.attribution change what they compute: stored run tables
# carry it in their fingerprint, so tables of an older analysis are recomputed, not reused.
TRACE_ANALYSIS_VERSION = 4


def _trace_inputs(run_dir: Path) -> list[tuple[str, int]]:
    """The files a run's trace tables are computed from, as (name under the run, bytes): its
    traces and rank logs, and the campaign's `runner commbench` results (the what-if at
    commbench's bandwidth), named ../commbench/<file>."""
    paths = [*(run_dir / "trace").glob("profile_*rank*.json*"), *(run_dir / "logs").glob("rank*.log*")]
    found = sorted((f"{p.parent.name}/{p.name}", p.stat().st_size) for p in paths if is_regular_file(p))
    bench = run_dir.parent / "commbench" / COMMBENCH_JSON
    return found + ([(f"../commbench/{COMMBENCH_JSON}", bench.stat().st_size)] if is_regular_file(bench) else [])


def trace_tables_fingerprint(run_dir: str | os.PathLike[str], *, pp_degree: int, num_microbatches: int) -> dict:
    """What a run's stored trace tables were computed from: its trace and rank-log files (name
    under the run, bytes), the layout the analysis needs and TRACE_ANALYSIS_VERSION. Stored with
    the tables, so tables older than their inputs (or of an older analysis) are not used."""
    return {"files": _trace_inputs(Path(run_dir)), "pp_degree": pp_degree, "num_microbatches": num_microbatches,
            "analysis": TRACE_ANALYSIS_VERSION}


def compute_run_trace_tables(run_dir: str | os.PathLike[str], *, name: str, pp_degree: int = 1,
                             num_microbatches: int = 1, root: str | os.PathLike[str] | None = None,
                             ) -> TraceTables | None:
    """Analyse one run's profiler traces (trace/profile_rank<r>.json[.gz]), profiler-window
    records and NCCL rank logs (logs/rank<r>.log[.gz]) into its ``TraceTables``. None when the
    run has none of them. root: the campaign (rank logs must lie inside it; default the run's
    parent). Never raises on content: unreadable traces become warnings."""
    import pandas as pd

    from core.records import (AttributionRow, CollectiveRow, KernelSummaryRow, StepBreakdownRow, TimelineSpanRow,
                              WhatIfRow)
    from ingest.attribution import compute_attribution
    from ingest.parsers.dispatch import parse_text
    from ingest.topology import nccl_transports, summarize_nccl_topology
    from ingest.trace_reader import TraceReadCounts
    from ingest.traces import compute_step_breakdown

    run_dir = Path(run_dir)
    root = Path(root) if root is not None else run_dir.parent
    steps, kernels, spans, metas, warnings, attributed, collectives, whatif = [], [], [], [], [], [], [], []
    nccl: dict[str, list[str]] = {}
    transports: dict[str, list[str]] = {}
    found = False
    timelines = {}
    for path in sorted((run_dir / "trace").glob("profile_rank*.json*"), key=lambda p: p.name):
        match = re.fullmatch(r"profile_rank(\d+)\.json(\.gz)?", path.name)
        if not match or path.is_symlink():
            continue
        if not is_regular_file(path):
            warnings.append(Message(N_("%(file)s: not a regular file (a FIFO?); skipped"), file=f"{name}/trace/{path.name}"))
            continue
        found = True
        counts = TraceReadCounts()
        try:
            result = compute_step_breakdown(open_trace_events(path, counts=counts, lean=True), run=name,
                                            rank=int(match.group(1)), pp_degree=pp_degree)
        except ParseError as e:
            warnings.append(str(e))
            continue
        if counts.truncated:  # the steps before the cut are analysed; the note says the file is cut
            warnings.append(Message(N_("%(file)s: the trace ends inside its JSON (cut, or its writer stopped); the "
                                       "steps before the cut are analysed"), file=f"{name}/trace/{path.name}"))
        if result.rank_timeline is not None:
            timelines[int(match.group(1))] = result.rank_timeline
        steps += result.steps
        kernels += result.kernels
        spans += result.spans
        warnings += [f"{name}/trace/{path.name}: {w}" for w in result.warnings]
    if timelines:
        bench: list[dict[str, Any]] = []
        if is_regular_file(root / "commbench" / COMMBENCH_JSON):
            try:
                bench = load_commbench(root / "commbench")
            except ToolError as e:
                warnings.append(Message(N_("commbench: %(error)s; the what-if at its bandwidth is left out"), error=str(e)))
        att = compute_attribution(timelines, run=name, pp_degree=pp_degree, num_microbatches=num_microbatches,
                                  commbench=bench)
        attributed += att.rows
        collectives += att.collectives
        whatif += att.whatif
        warnings += [f"{name}: {w}" for w in att.warnings]
    for path in sorted((run_dir / "trace").glob("profile_meta_rank*.json")):
        found = True
        data = _read_json(path)
        if isinstance(data, dict) and isinstance(data.get("export_s"), (int, float)):
            metas.append({"run": name, "rank": data.get("rank"), "export_s": float(data["export_s"]),
                          "trace_bytes": data.get("trace_bytes")})
        else:
            warnings.append(Message(N_("%(file)s: not a profiler-window record; its export time is not counted"), file=path))
    recs = []
    for path in sorted((run_dir / "logs").glob("rank*.log*")):
        if not re.fullmatch(r"rank\d+\.log(?:\.gz)?", path.name):
            continue
        if not is_regular_file(path) or not (resolved(path) or root).is_relative_to(root.resolve()):
            warnings.append(Message(N_("%(file)s: not a regular file inside the campaign; skipped"),
                                    file=f"{name}/logs/{path.name}"))
            continue
        found = True
        text = read_text_head(path, 1 << 22)
        recs += [r for r in parse_text(text, source=path.name, kind="nccl").records if r["table"] == "comm_topology"]
    if recs:
        nccl[name] = summarize_nccl_topology(recs)
        transports[name] = nccl_transports(recs)
    if not found:
        return None

    def frame(rows: list, cls: type) -> pd.DataFrame:
        cols = [f.name for f in dataclasses.fields(cls)]
        return pd.DataFrame([dataclasses.asdict(r) for r in rows], columns=cols)

    return TraceTables(breakdown=frame(steps, StepBreakdownRow), kernels=frame(kernels, KernelSummaryRow),
                       spans=frame(spans, TimelineSpanRow), meta=pd.DataFrame(metas, columns=_TRACE_META_COLUMNS),
                       nccl=nccl, nccl_transports=transports, warnings=tuple(warnings),
                       attribution=frame(attributed, AttributionRow), collectives=frame(collectives, CollectiveRow),
                       whatif=frame(whatif, WhatIfRow))


def merge_trace_tables(parts: list[TraceTables]) -> TraceTables | None:
    """One TraceTables of several runs' (in order); None for none."""
    import pandas as pd

    if not parts:
        return None

    def cat(frames: list[pd.DataFrame]) -> pd.DataFrame:
        full = [f for f in frames if not f.empty]
        return pd.concat(full, ignore_index=True) if full else frames[0]

    return TraceTables(breakdown=cat([p.breakdown for p in parts]), kernels=cat([p.kernels for p in parts]),
                       spans=cat([p.spans for p in parts]), meta=cat([p.meta for p in parts]),
                       nccl={k: v for p in parts for k, v in p.nccl.items()},
                       nccl_transports={k: v for p in parts for k, v in p.nccl_transports.items()},
                       warnings=tuple(w for p in parts for w in p.warnings),
                       attribution=cat([p.attribution for p in parts]), collectives=cat([p.collectives for p in parts]),
                       whatif=cat([p.whatif for p in parts if p.whatif is not None]) if any(
                           p.whatif is not None for p in parts) else None)


def _write_parquet(df: pd.DataFrame, path: Path, meta: dict[str, Any]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pandas(df, preserve_index=False)
    kv = dict(table.schema.metadata or {})
    kv.update({k.encode(): json.dumps(v).encode() for k, v in {"schema_version": SCHEMA_VERSION, **meta}.items()})
    sink = pa.BufferOutputStream()
    pq.write_table(table.replace_schema_metadata(kv), sink)
    return write_bytes_atomic(path, sink.getvalue().to_pybytes())


def write_trace_tables(tables: TraceTables, out_dir: str | os.PathLike[str], *,
                       inputs: dict[str, Any] | None = None) -> list[Path]:
    """Write ``tables`` as the trace_*.parquet files of TRACE_TABLE_FILES into ``out_dir``
    (atomically; schema_version in each file's metadata). NCCL summaries become rows (run,
    kind "summary" | "transport", text); warnings and ``inputs`` (the fingerprint of what they
    were computed from) go in trace_breakdown.parquet's metadata. Returns written paths."""
    import pandas as pd

    nccl = pd.DataFrame([{"run": run, "kind": kind, "text": text}
                         for kind, d in (("summary", tables.nccl), ("transport", tables.nccl_transports))
                         for run, lines in d.items() for text in lines], columns=["run", "kind", "text"])
    frames = {"breakdown": tables.breakdown, "kernels": tables.kernels, "spans": tables.spans, "meta": tables.meta,
              "attribution": tables.attribution, "collectives": tables.collectives, "whatif": tables.whatif,
              "nccl": nccl}
    out = Path(out_dir)
    extra = {"warnings": list(tables.warnings), "inputs": inputs}
    return [_write_parquet(frames[key], out / fname, extra if key == "breakdown" else {})
            for key, fname in TRACE_TABLE_FILES.items() if frames[key] is not None]


def read_trace_tables(path: str | os.PathLike[str], *, inputs: dict[str, Any] | None = None) -> TraceTables | None:
    """The TraceTables written by ``write_trace_tables`` into ``path``. None when they are not
    all there, unreadable, of another schema version, or (``inputs`` given) computed from other
    inputs: the caller then analyses the raw traces."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = Path(path)
    frames, meta = {}, {}
    for key, fname in TRACE_TABLE_FILES.items():
        try:
            table = pq.read_table(root / fname)
            kv = table.schema.metadata or {}
            if key == "breakdown":
                meta = {k: json.loads(kv[k.encode()]) for k in ("schema_version", "warnings", "inputs")}
        except (pa.ArrowException, OSError, KeyError, ValueError):
            return None
        frames[key] = table.to_pandas()
    # the stored fingerprint went through JSON (tuples came back as lists): compare it the same way
    if meta["schema_version"] != SCHEMA_VERSION or (inputs is not None
                                                    and meta["inputs"] != json.loads(json.dumps(inputs))):
        return None
    nccl = frames.pop("nccl")
    lines = {kind: {run: list(g["text"]) for run, g in nccl[nccl["kind"] == kind].groupby("run", sort=False)}
             for kind in ("summary", "transport")}
    return TraceTables(nccl=lines["summary"], nccl_transports=lines["transport"], warnings=tuple(meta["warnings"]),
                       **frames)


def ingest_run_traces(run_dir: str | os.PathLike[str], *, name: str, pp_degree: int = 1,
                      num_microbatches: int = 1) -> list[Path]:
    """Analyse one run's traces and rank logs (``compute_run_trace_tables``) and write them into
    <run>/tables/ with their inputs' fingerprint; [] when the run has none. The runner calls this
    when a run ends. Raises ParseError / OSError."""
    run_dir = Path(run_dir)
    inputs = trace_tables_fingerprint(run_dir, pp_degree=pp_degree, num_microbatches=num_microbatches)
    tables = compute_run_trace_tables(run_dir, name=name, pp_degree=pp_degree, num_microbatches=num_microbatches)
    return [] if tables is None else write_trace_tables(tables, run_dir / RUN_TABLES_DIR, inputs=inputs)


def load_trace_tables(campaign: Campaign) -> TraceTables | None:
    """Section 5's tables (see TraceTables): read from a tables folder written by ``ingest``, or
    per run from <run>/tables/ when those were computed from the run's present traces and logs,
    else analysed from them. None when no run has a trace/ or a rank log (third-party folders).
    Never raises on content: unreadable traces become warnings."""
    root = Path(campaign.source)
    if not root.is_dir() or campaign.runs.empty:
        return None
    if not (root / "campaign.json").is_file():  # a tables folder: what `ingest` wrote, if anything
        return read_trace_tables(root)
    parts = []
    for run in campaign.runs.to_dict("records"):
        name = str(run["run"])
        pp, num_microbatches = _run_layout(run)
        inputs = trace_tables_fingerprint(root / name, pp_degree=pp, num_microbatches=num_microbatches)
        tables = read_trace_tables(root / name / RUN_TABLES_DIR, inputs=inputs) if inputs["files"] else None
        tables = tables or compute_run_trace_tables(root / name, name=name, pp_degree=pp,
                                                    num_microbatches=num_microbatches, root=root)
        if tables is not None:
            parts.append(tables)
    return merge_trace_tables(parts)


COMMBENCH_JSON, COMMBENCH_TABLE = "commbench.json", "commbench.parquet"


def load_plant_truths(source: str | os.PathLike[str], names: Iterable[str]) -> tuple[dict[str, PlantTruth], list[str]]:
    """Each named run's <campaign>/<run>/plant_truth.json (runner.plants: its extra collective's
    and extra matmul's cost, timed apart from the traced steps), and caveats for files that
    could not be used. A run without the file is left out."""
    from core.records import PlantTruth

    truths, problems = {}, []
    for name in names:
        path = Path(source) / name / "plant_truth.json"
        if path.is_symlink():
            problems.append(Message(N_("%(file)s: a symlink; not followed"), file=f"{name}/plant_truth.json"))
            continue
        try:
            data = _read_record(path, PlantTruth, problems)
        except ParseError as e:
            problems.append(str(e))
            continue
        if data is not None:
            truths[name] = PlantTruth(**data)
    return truths, problems


def find_commbench(source: str | os.PathLike[str]) -> Path | None:
    """Where a campaign's `runner commbench` results are: CAMPAIGN/commbench, or a tables folder
    holding commbench.parquet (written by `ingest`); None when neither."""
    root = Path(source)
    if (root / "commbench").is_dir():
        return root / "commbench"
    return root if (root / COMMBENCH_TABLE).is_file() and not (root / "campaign.json").is_file() else None


def load_commbench(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """`runner commbench` rows (ingest.commbench records) from its directory, commbench.json or
    commbench.parquet. Raises NoDataError when nothing is there, ParseError when unreadable or
    when no row is valid."""
    from ingest.commbench import parse_commbench

    root = Path(path)
    if root.is_dir():
        root = root / COMMBENCH_JSON if (root / COMMBENCH_JSON).is_file() else root / COMMBENCH_TABLE
    if not root.is_file():
        raise NoDataError(f"{path}: no {COMMBENCH_JSON} or {COMMBENCH_TABLE}; run `runner commbench --out {path}`")
    if root.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            rows = pq.read_table(root).to_pylist()
        except (pa.ArrowException, OSError) as e:
            raise ParseError(f"{root}: not a readable Parquet file ({e}); rerun `runner commbench`") from None
        data = {"kind": "commbench", "rows": rows}
    else:
        data = _read_json(root)
    result = parse_commbench(data, source=str(root))
    if not result.records:
        raise ParseError(f"{root}: no valid commbench rows ({'; '.join(result.warnings[:3]) or 'empty'})")
    return [{k: v for k, v in r.items() if k != "table"} for r in result.records]


def write_commbench_table(rows: list[dict[str, Any]], out_dir: str | os.PathLike[str]) -> Path:
    """commbench.parquet (rows as load_commbench returns them, schema_version in the metadata)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist(rows)
    kv = dict(table.schema.metadata or {})
    kv[b"schema_version"] = json.dumps(SCHEMA_VERSION).encode()
    sink = pa.BufferOutputStream()
    pq.write_table(table.replace_schema_metadata(kv), sink)
    return write_bytes_atomic(Path(out_dir) / COMMBENCH_TABLE, sink.getvalue().to_pybytes())


CAPACITY_PATH = Path("capacity") / "capacity.json"  # `runner capacity --out <campaign>/capacity`


def load_capacity(source: str | os.PathLike[str]) -> tuple[Any, list[str]]:
    """The campaign's capacity probe (<campaign>/capacity/capacity.json, runner.capacity) as a
    core.records.CapacityResult, and caveats; (None, []) without one. A file that is not a valid
    CapacityResult is left out with one caveat naming the file and its first wrong fields."""
    from core.records import CapacityResult, record_from_dict, record_problems

    path = Path(source) / CAPACITY_PATH
    if path.is_symlink():
        return None, [f"{CAPACITY_PATH}: a symlink; not followed"]
    if not path.is_file():
        return None, []
    try:
        data = _read_json(path)
        if isinstance(data, dict):
            _check_version(path, data)
    except ParseError as e:
        return None, [str(e)]
    bad = record_problems(CapacityResult, data)
    if bad:
        return None, [f"{CAPACITY_PATH}: does not match CapacityResult ({'; '.join(bad[:3])}"
                      + (f"; {len(bad) - 3} more" if len(bad) > 3 else "") + "); the Capacity section is left out"]
    result, _ = record_from_dict(CapacityResult, redact_value(data), where=str(CAPACITY_PATH))
    return result, []
