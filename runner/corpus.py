"""Real text for the data round: raw files -> tokenizer -> Megatron indexed dataset (.bin/.idx).

``runner prepare-data SOURCE... --out PREFIX [--tokenizer tokenizer.json]`` and ``runner all``
(when a matrix has a real data round and no prepared dataset) both end in ``prepare_data``:

1. documents: a .txt (or any UTF-8 text file, e.g. .py/.md) is one document (one per
   MAX_DOCUMENT_CHARS, cut at lines, when longer); a .jsonl file one document per line (its
   ``text_key`` field); a .parquet file one per row of its ``text_key`` column. A file with a NUL
   byte or invalid UTF-8 in its first 64 KiB is refused as binary; a line longer than
   MAX_LINE_BYTES, a FIFO or a device is refused, never read.
2. tokenizer: a local HF ``tokenizer.json`` (HF tokenizers), or -- when none is given -- a
   byte-level BPE fitted offline on these documents with the same library (vocabulary capped
   at the model's), EOD = ``<|endoftext|>``; on at most TOKENIZER_SAMPLE_CHARS (4 Mi) characters
   of them, a sample spread over the files by size.
3. tokens: every document encoded and followed by EOD (Megatron-LM
   ``tools/preprocess_data.py --append-eod``), written with megatron-core's
   ``IndexedDatasetBuilder`` (one sequence per document; uint16 ids when the vocabulary fits,
   ``DType.optimal_dtype``), so Megatron-LM reads it and a dataset Megatron-LM's tool wrote is
   read here.

Bounded memory whatever the input size: the sources are streamed (read twice: the tokenizer's
sample, then every document), the fit sees at most TOKENIZER_SAMPLE_CHARS characters (random
text: ~0.65 GB to fit 4 Mi characters), and a long document is encoded in pieces of
ENCODE_PIECE_CHARS cut at word boundaries, which give the same ids as the whole
(split_for_encoding). 28 MB of random text in 4 lines: 48 s and 1.1 GB peak (88 s and 3.75 GB
when every document was held and fitted whole), 84 MB: 103 s and 1.1 GB.
Linear in input size: the fitted tokenizer's pre-tokenizer cuts every pre-token (GPT-2's regex
pieces) into pieces of at most MAX_PRETOKEN_CHARS characters, so one huge "word" (a 1 MB line
without spaces, a long run of one character or of whitespace) costs the BPE trainer what many
short words do; uncut, its merges rescan the whole word and the fit was quadratic in its length.
Interruptible: the tokenizer's Rust work runs in a worker thread while the main thread waits,
so SIGTERM/SIGINT (KeyboardInterrupt) stop it at once; every output is built in a temporary
directory beside the prefix and renamed into place at the end (signals held off while renaming),
so an interrupted run leaves no output that looks complete.

The embedded default corpus needs no download: the source files of this Python's standard
library (sorted, up to a byte budget), which every machine with Python has.

``validate_dataset`` is the check every real round passes before any process group starts:
the .idx reads, its sequence pointers and lengths cover the .bin exactly, the largest token id
fits the model's vocabulary, and there is at least one sample. Every problem is a ConfigError
naming the file. Deliberately not here: sample order and loading (runner.data).
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import signal
import sys
import sysconfig
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from core.errors import ConfigError
from core.atomic import umask
from core.records import DatasetRecord, to_dict

EOD_TOKEN = "<|endoftext|>"
SNIFF_BYTES = 64 * 1024
MIN_TRAINED_VOCAB = 257  # 256 byte symbols + EOD
DEFAULT_VOCAB_SIZE = 50257  # gpt-125m's: `runner prepare-data` without a model at hand
# the default corpus's byte budget: about 4 bytes of source per token a campaign reads, within these bounds
DEFAULT_CORPUS_MIN_BYTES = 1 << 20
DEFAULT_CORPUS_MAX_BYTES = 64 << 20
CHUNK_TOKENS = 1 << 24  # .bin scan for the largest id, 16M tokens at a time
# Longest pre-token a fitted tokenizer sees (characters of the byte-level alphabet): longer GPT-2
# regex pieces are cut, which keeps the BPE fit linear in the input (module docstring). 128 is
# far past real words and indentation runs, so ordinary text is pre-tokenized exactly as GPT-2's.
MAX_PRETOKEN_CHARS = 128
# Longest line read from a .txt/.jsonl source (bytes): a JSON line holds one document, and no real
# text has longer lines; read by lines of at most this, so a 100 MB line costs nothing before it
# is refused. A .txt longer than MAX_DOCUMENT_CHARS becomes several documents, cut at lines.
MAX_LINE_BYTES = 8 << 20
MAX_DOCUMENT_CHARS = 1 << 20
# Documents encoded per call into the tokenizer, by characters: the encodings (~100 bytes per
# token) of one batch are held at a time, not the whole corpus's
ENCODE_BATCH_CHARS = 1 << 20
# Longest piece of a document handed to the tokenizer at once (characters): a long document is cut
# at word boundaries (split_for_encoding), so its encoding is held a piece at a time
ENCODE_PIECE_CHARS = 256 << 10
# greedy: up to the last non-space before an ASCII space, tab or newline. \S is Python's, which takes
# more characters for whitespace than the tokenizer's regex does: a cut it allows, the tokenizer's allows
_LAST_WORD_END = re.compile(r"(?s).*\S(?=[ \t\n\r\f\v])")
# Characters of text a fitted tokenizer is trained on, at most: the BPE trainer holds every distinct
# pre-token with per-character state (random text: ~130 MB of memory and 3 s per MB fitted; 4 lines
# of 7 MB took 88 s and 3.75 GB when fitted whole). A larger corpus is fitted on a sample spread over
# its files by size (sample_documents) and encoded whole, streamed: memory is bounded by this, one
# document and one encode batch, whatever the corpus size. 4 Mi characters fits a byte-level BPE of
# GPT-2's vocabulary on real text.
TOKENIZER_SAMPLE_CHARS = 4 << 20
# The most read of a PREFIX.json when deciding whether it is one of ours (a DatasetRecord is < 4 KB)
MAX_RECORD_BYTES = 1 << 20


@dataclass(frozen=True, kw_only=True)
class DataSourceConfig:
    """The matrix's ``[data]`` section: where the real round's text comes from.

    path: prefix of an already prepared indexed dataset (ours or Megatron-LM's), read as is.
    sources: raw text files to prepare under the campaign directory instead of the default
    corpus. tokenizer: a local tokenizer.json (with sources or the default corpus: used to
    encode; with path: only checked against the model's vocabulary). text_key: the jsonl field
    / parquet column holding the text."""

    path: str | None = None
    sources: tuple[str, ...] = ()
    tokenizer: str | None = None
    text_key: str = "text"


DATA_KEYS = {f.name for f in dataclasses.fields(DataSourceConfig)}


def build_data_source_config(raw: object, *, where: str) -> tuple[DataSourceConfig, list[str]]:
    """The ``[data]`` table -> (config, problems); unknown keys and wrong types are problems."""
    if raw is None:
        return DataSourceConfig(), []
    if not isinstance(raw, dict):
        return DataSourceConfig(), [f"{where}: [data] must be a table, got {type(raw).__name__}"]
    problems = [f"{where} [data]: unknown key '{k}' (valid: {', '.join(sorted(DATA_KEYS))})"
                for k in sorted(set(raw) - DATA_KEYS)]
    for key in ("path", "tokenizer", "text_key"):
        if key in raw and not isinstance(raw[key], str):
            problems.append(f"{where} [data] {key} must be a string, got {raw[key]!r}")
    sources = raw.get("sources", [])
    if not isinstance(sources, list) or not all(isinstance(s, str) for s in sources):
        problems.append(f"{where} [data] sources must be a list of file paths, got {sources!r}")
        sources = []
    if raw.get("path") and sources:
        problems.append(f"{where} [data]: set either path (a prepared dataset) or sources (raw text), not both")
    if problems:
        return DataSourceConfig(), problems
    return DataSourceConfig(path=raw.get("path"), sources=tuple(sources), tokenizer=raw.get("tokenizer"),
                            text_key=raw.get("text_key", "text")), []


# ------------------------------------------------------------------------------------------ sources

def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def collect_stdlib_sources(*, max_bytes: int) -> list[Path]:
    """The default corpus: this Python's standard library ``*.py`` files (site-packages left
    out), sorted by relative path, taken until ``max_bytes`` of source are reached."""
    root = stdlib_dir()
    files = sorted((p for p in root.rglob("*.py") if "site-packages" not in p.parts and p.is_file()),
                   key=lambda p: p.relative_to(root).as_posix())
    out, total = [], 0
    for p in files:
        if total >= max_bytes:
            break
        out.append(p)
        total += p.stat().st_size
    return out


def default_corpus_bytes(*, tokens_needed: int) -> int:
    """Byte budget of the default corpus for a campaign that reads ``tokens_needed`` tokens."""
    return int(min(max(4 * tokens_needed, DEFAULT_CORPUS_MIN_BYTES), DEFAULT_CORPUS_MAX_BYTES))


def _open_source(path: Path):
    """A source file opened for reading, binary: a regular file only (a FIFO or a device is
    refused, never waited on). ConfigError naming the file otherwise."""
    from ingest.io import open_regular

    try:
        if path.is_dir():
            raise IsADirectoryError
        return open_regular(path, "rb")
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file; pass existing text files (txt, jsonl, parquet)") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a directory; pass the text files in it") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read ({e.strerror}); pass regular text files (txt, jsonl, parquet)") from None


def _sniff_text(path: Path) -> None:
    with _open_source(path) as f:
        head = f.read(SNIFF_BYTES)
    if b"\x00" in head:
        raise ConfigError(f"{path}: looks binary (NUL bytes), not text; pass txt, jsonl or parquet files")
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as e:
        if e.start < len(head) - 4:  # not just a multi-byte character cut at the sniff boundary
            raise ConfigError(f"{path}: not UTF-8 text (byte {e.start}); pass txt, jsonl or parquet files") from None


def read_documents(path: Path, *, text_key: str = "text") -> Iterator[str]:
    """The documents of one source file (see the module docstring). Raises ConfigError naming
    the file (and line) for binary content, bad JSON lines or a missing text field/column."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        try:  # by row batches, not the whole column: memory is bounded by a batch, not the file
            batches = pq.ParquetFile(path).iter_batches(columns=[text_key], batch_size=1024)
            for batch in batches:
                for value in batch.column(0).to_pylist():
                    if value is not None and not isinstance(value, str):
                        raise ConfigError(f"{path}: column '{text_key}' holds {type(value).__name__}, not text")
                    if value:
                        yield value
        except FileNotFoundError:
            raise ConfigError(f"{path}: no such file") from None
        except (KeyError, ValueError, OSError) as e:  # pyarrow: missing column, not parquet
            raise ConfigError(f"{path}: cannot read column '{text_key}' as parquet ({e}); "
                              f"set --text-key / [data] text_key") from None
        return
    _sniff_text(path)
    if path.suffix == ".jsonl":
        for lineno, line in _read_lines(path):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise ConfigError(f"{path}:{lineno}: not a JSON line ({e.msg})") from None
            except RecursionError:  # the decoder recurses per nested array/object
                raise ConfigError(f"{path}:{lineno}: JSON nested too deeply to read; a line is one "
                                  f"{{\"{text_key}\": ...}} object") from None
            value = obj.get(text_key) if isinstance(obj, dict) else None
            if not isinstance(value, str):
                raise ConfigError(f"{path}:{lineno}: no string field '{text_key}'; set --text-key / [data] text_key")
            if value:
                yield value
        return
    doc: list[str] = []
    num_chars = 0
    for _, line in _read_lines(path):
        if num_chars + len(line) > MAX_DOCUMENT_CHARS and doc:
            text = "".join(doc)
            if text.strip():
                yield text
            doc, num_chars = [], 0
        doc.append(line)
        num_chars += len(line)
    text = "".join(doc)
    if text.strip():
        yield text


def _read_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, line with its newline) of a UTF-8 text file, each read with a cap of
    MAX_LINE_BYTES: a longer line is a ConfigError naming the file and line, raised before more
    than the cap is read. ConfigError for text that is not UTF-8 too."""
    with _open_source(path) as f:
        lineno = 0
        while line := f.readline(MAX_LINE_BYTES + 1):
            lineno += 1
            if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
                raise ConfigError(f"{path}:{lineno}: a line longer than {MAX_LINE_BYTES >> 20} MiB; no text document "
                                  "is one line that long: split it (a .jsonl line holds one document)")
            try:  # universal newlines, as text-mode reading gave: \r\n and a lone \r end a line as \n
                yield lineno, line.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")
            except UnicodeDecodeError as e:
                raise ConfigError(f"{path}:{lineno}: not UTF-8 text (byte {e.start} of the line); pass txt, jsonl "
                                  "or parquet files") from None


def iter_corpus(sources: Sequence[Path], *, text_key: str = "text") -> Iterator[str]:
    """Every document of every source, in the order given, read as it is consumed (one document
    held at a time). Raises ConfigError naming the sources when they hold no text at all (empty
    corpus), once they are read to the end."""
    if not sources:
        raise ConfigError("no source files given; pass txt, jsonl or parquet files")
    num_docs = 0
    for p in sources:
        for doc in read_documents(Path(p), text_key=text_key):
            num_docs += 1
            yield doc
    if not num_docs:
        names = ", ".join(str(p) for p in sources[:3]) + (f" (+{len(sources) - 3} more)" if len(sources) > 3 else "")
        raise ConfigError(f"{names}: empty corpus (no non-empty document); pass files that hold text")


def check_corpus(sources: Sequence[Path], *, text_key: str = "text") -> None:
    """Raise iter_corpus's ConfigError now when the sources are missing, unreadable or hold no
    text: reads up to the first document (all of an empty corpus, streamed)."""
    for _ in iter_corpus(sources, text_key=text_key):
        return


def sample_documents(sources: Sequence[Path], *, text_key: str = "text",
                     max_chars: int = TOKENIZER_SAMPLE_CHARS) -> Iterator[str]:
    """The documents a fitted tokenizer is trained on: all of them when the sources hold at most
    ``max_chars`` bytes; else each file's leading documents up to its share of ``max_chars`` (by
    its size in bytes), the last one cut, so the sample spans every file. Streamed."""
    sizes = [Path(p).stat().st_size for p in sources]
    total = sum(sizes)
    for path, size in zip(sources, sizes):
        budget = size if total <= max_chars else max_chars * size // total
        for doc in read_documents(Path(path), text_key=text_key):
            if budget <= 0:
                break
            yield doc[:budget]
            budget -= len(doc)


# ---------------------------------------------------------------------------------------- tokenizer

def load_tokenizer(path: Path):
    """A local HF ``tokenizer.json``. Raises ConfigError naming the file when it does not load."""
    from tokenizers import Tokenizer

    if not Path(path).is_file():
        raise ConfigError(f"{path}: tokenizer file not found; pass a local HF tokenizer.json")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:  # noqa: BLE001 -- tokenizers raises a bare Exception on bad JSON
        raise ConfigError(f"{path}: not a HF tokenizer.json ({str(e).splitlines()[0][:120]})") from None


def train_tokenizer(docs: Sequence[str], *, vocab_size: int):
    """A byte-level BPE (GPT-2's pre-tokenizer and byte alphabet, EOD special token) fitted on
    ``docs`` (prepare_data passes sample_documents', at most TOKENIZER_SAMPLE_CHARS characters)
    with HF tokenizers' BpeTrainer. Its vocabulary is at most ``vocab_size`` (a small corpus may
    have fewer merges to learn). Raises ConfigError when vocab_size < 257. A list, not a
    generator: the trainer calls back into Python for every item from a thread of its own, and a
    callback pending when SIGTERM ends the interpreter aborts the process (SIGABRT) instead of
    exiting with the interrupt's line."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    if vocab_size < MIN_TRAINED_VOCAB:
        raise ConfigError(f"vocab size {vocab_size} < {MIN_TRAINED_VOCAB}: a byte-level BPE needs 256 byte symbols + EOD")
    tok = Tokenizer(models.BPE())
    # GPT-2's byte-level pieces, each cut to MAX_PRETOKEN_CHARS: saved in tokenizer.json, so encoding cuts alike
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.ByteLevel(add_prefix_space=False),
        pre_tokenizers.Split(Regex(f".{{1,{MAX_PRETOKEN_CHARS}}}"), behavior="isolated")])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOD_TOKEN], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    run_interruptible(tok.train_from_iterator, docs, trainer=trainer, length=len(docs))
    return tok


def run_interruptible(fn, /, *args, **kwargs):
    """``fn(*args, **kwargs)`` in a worker thread while this (main) thread waits in short joins,
    so a signal handler -- SIGINT's KeyboardInterrupt, the runner's SIGTERM -> KeyboardInterrupt --
    runs at once instead of after a long call into the tokenizers library (Rust, GIL released),
    which never returns to Python until done. On an interrupt the daemon worker is abandoned (the
    process is exiting). Returns fn's result; re-raises its exception."""
    result: dict[str, object] = {}

    def work() -> None:
        try:
            result["value"] = fn(*args, **kwargs)
        except BaseException as e:  # noqa: BLE001 - handed to the waiting thread
            result["error"] = e

    worker = threading.Thread(target=work, name="tokenizer", daemon=True)
    worker.start()
    while worker.is_alive():
        worker.join(0.1)
    if "error" in result:
        raise result["error"]
    return result.get("value")


def check_tokenizer_vocab(tokenizer, *, path: str | Path, model_vocab_size: int) -> int:
    """The tokenizer's vocabulary size (added tokens included); ConfigError naming ``path``
    when it exceeds the model's vocabulary (ids past the embedding table)."""
    size = int(tokenizer.get_vocab_size(with_added_tokens=True))
    if size > model_vocab_size:
        raise ConfigError(f"{path}: tokenizer vocabulary {size} > the model's vocab_size {model_vocab_size}; "
                          "use a smaller tokenizer or a model preset with a larger vocabulary")
    return size


# ------------------------------------------------------------------------------------------ dataset

def _megatron_indexed_dataset():
    """megatron.core.datasets.indexed_dataset, imported without its TE/apex fallback warnings
    (they concern training kernels, not the dataset format)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        from megatron.core.datasets import indexed_dataset
    return indexed_dataset


def _index_dtype(vocab_size: int):
    return _megatron_indexed_dataset().DType.optimal_dtype(vocab_size)


def write_indexed_dataset(token_docs: Iterable[Sequence[int]], *, prefix: Path, vocab_size: int) -> None:
    """Write documents of token ids as ``prefix.bin`` / ``prefix.idx`` with megatron-core's
    IndexedDatasetBuilder (one sequence per document), in place: ``prefix`` is a staging path
    (prepare_data renames the files into place once everything is built and checked)."""
    import numpy as np  # here, not at import: `runner all --dry-run` and its errors answer without it

    IndexedDatasetBuilder = _megatron_indexed_dataset().IndexedDatasetBuilder
    dtype = _index_dtype(vocab_size)
    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=dtype)
    for ids in token_docs:
        arr = np.asarray(ids, dtype=dtype)
        builder.add_document(arr, [arr.size])
    builder.finalize(f"{prefix}.idx")


def _commit_staged(moves: Sequence[tuple[Path, Path]]) -> None:
    """Rename staged files into place (user's file mode) with SIGINT/SIGTERM held off, so an
    interrupt lands before or after the whole set, never between two of its files."""
    held = {signal.SIGINT, signal.SIGTERM}
    old = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        for src, dst in moves:
            os.chmod(src, 0o666 & ~umask())
            os.replace(src, dst)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


@dataclass(frozen=True, kw_only=True)
class DatasetInfo:
    """What ``validate_dataset`` found: token dtype name, counts, largest id, .bin size."""

    token_dtype: str
    num_documents: int
    num_tokens: int
    max_token_id: int
    bin_bytes: int


def validate_dataset(prefix: str | Path, *, model_vocab_size: int, seq_length: int) -> DatasetInfo:
    """Check an indexed dataset before any process group starts (module docstring); ConfigError
    naming the .idx or .bin at fault."""
    idx, bin_ = Path(f"{prefix}.idx"), Path(f"{prefix}.bin")
    for p in (idx, bin_):
        if not p.is_file():
            raise ConfigError(f"{p}: not found; [data] path / --out is the prefix of <prefix>.bin and <prefix>.idx")
    import numpy as np

    IndexedDataset = _megatron_indexed_dataset().IndexedDataset
    try:
        ds = IndexedDataset(str(prefix))
        lengths = np.asarray(ds.index.sequence_lengths, dtype=np.int64)
        pointers = np.asarray(ds.index.sequence_pointers, dtype=np.int64)
        dtype = np.dtype(ds.index.dtype)
        num_documents = int(len(ds.index.document_indices) - 1)
    except (AssertionError, ValueError, KeyError, OSError, IndexError, TypeError) as e:
        raise ConfigError(f"{idx}: not a Megatron indexed-dataset index ({type(e).__name__}: "
                          f"{str(e)[:100] or 'bad header or truncated'})") from None
    bin_bytes = bin_.stat().st_size
    num_tokens = int(lengths.sum())
    expected = int(pointers[-1] + lengths[-1] * dtype.itemsize) if len(lengths) else 0
    contiguous = len(lengths) == 0 or (pointers[0] == 0 and np.array_equal(
        pointers[1:], pointers[:-1] + lengths[:-1] * dtype.itemsize))
    if expected != bin_bytes or num_tokens * dtype.itemsize != bin_bytes or not contiguous:
        raise ConfigError(f"{idx}: does not match {bin_.name} (the index covers {expected} bytes of "
                          f"{dtype.name} tokens, the .bin has {bin_bytes}); rebuild both with `runner prepare-data`")
    if num_tokens < seq_length + 1:
        raise ConfigError(f"{bin_}: {num_tokens} tokens, fewer than one sample of seq_length + 1 = {seq_length + 1}; "
                          "give the corpus more text")
    data = np.memmap(bin_, dtype=dtype, mode="r")
    max_id = max(int(data[i : i + CHUNK_TOKENS].max()) for i in range(0, num_tokens, CHUNK_TOKENS))
    del data
    if max_id >= model_vocab_size:
        raise ConfigError(f"{bin_}: token id {max_id} >= the model's vocab_size {model_vocab_size}; it was tokenized "
                          "with a larger vocabulary than this campaign's model")
    return DatasetInfo(token_dtype=dtype.name, num_documents=num_documents, num_tokens=num_tokens,
                       max_token_id=max_id, bin_bytes=bin_bytes)


def prepare_data(sources: Sequence[Path], *, out_prefix: Path, tokenizer_path: Path | None, vocab_size: int,
                 text_key: str = "text", source: str = "files", seq_length: int = 1) -> DatasetRecord:
    """Tokenize ``sources`` into ``out_prefix.{bin,idx}`` and write ``out_prefix.json`` (the
    DatasetRecord); a trained tokenizer is saved as ``out_prefix.tokenizer.json``. vocab_size:
    the model's vocabulary (cap of a trained tokenizer; bound a given one must fit). Memory is
    bounded whatever the corpus size: the sources are streamed, twice (the tokenizer is fitted
    on at most TOKENIZER_SAMPLE_CHARS characters of them, sample_documents; then every document
    is encoded, ENCODE_BATCH_CHARS at a time). Raises ConfigError naming the file for bad input
    (module docstring) and for an output path that exists and is not one of ours
    (check_outputs_are_ours)."""
    t0 = time.perf_counter()
    out_prefix = check_out_prefix(Path(out_prefix))
    check_outputs_are_ours(out_prefix)
    tokenizer = load_tokenizer(tokenizer_path) if tokenizer_path else None
    if tokenizer is not None:
        tok_vocab = check_tokenizer_vocab(tokenizer, path=tokenizer_path, model_vocab_size=vocab_size)
    sources = [Path(p) for p in sources]
    check_corpus(sources, text_key=text_key)
    try:
        out_prefix.parent.mkdir(parents=True, exist_ok=True)
        # everything is built in an exclusive, randomly named directory beside the outputs, then renamed
        stage = Path(tempfile.mkdtemp(dir=out_prefix.parent, prefix=f".{out_prefix.name}.", suffix=".tmp"))
    except OSError as e:  # the user's path, not our staging folder's name (/proc/.foo.0cukv_ee.tmp)
        raise ConfigError(f"--out {out_prefix}: cannot write {out_prefix}.bin, .idx and .json in {out_prefix.parent} "
                          f"({e.strerror or e}); choose a prefix in a folder you can write") from None
    try:
        staged = stage / out_prefix.name
        moves = [(Path(f"{staged}.{ext}"), Path(f"{out_prefix}.{ext}")) for ext in ("bin", "idx")]
        trained = tokenizer is None
        if trained:
            tokenizer = train_tokenizer(list(sample_documents(sources, text_key=text_key)), vocab_size=vocab_size)
            tok_vocab = check_tokenizer_vocab(tokenizer, path="trained tokenizer", model_vocab_size=vocab_size)
            tokenizer_path = Path(f"{out_prefix}.tokenizer.json")
            tokenizer.save(f"{staged}.tokenizer.json")
            moves.insert(0, (Path(f"{staged}.tokenizer.json"), tokenizer_path))
        eod = tokenizer.token_to_id(EOD_TOKEN)
        if eod is None:  # a tokenizer without GPT-2's EOD: Megatron-LM's tool appends the tokenizer's eod; we need one
            raise ConfigError(f"{tokenizer_path}: no '{EOD_TOKEN}' token to end documents with; use a GPT-2 style "
                              "tokenizer")
        write_indexed_dataset(_encode(tokenizer, iter_corpus(sources, text_key=text_key), eod=eod), prefix=staged,
                              vocab_size=tok_vocab)
        info = validate_dataset(staged, model_vocab_size=vocab_size, seq_length=seq_length)
        record = DatasetRecord(
            prefix=str(out_prefix.resolve()), source=source, sources=tuple(str(p) for p in sources),
            source_bytes=sum(Path(p).stat().st_size for p in sources), tokenizer=str(Path(tokenizer_path).resolve()),
            tokenizer_trained=trained, vocab_size=tok_vocab, eod_token_id=eod, num_documents=info.num_documents,
            num_tokens=info.num_tokens, token_dtype=info.token_dtype, max_token_id=info.max_token_id,
            bin_bytes=info.bin_bytes, build_s=time.perf_counter() - t0)
        Path(f"{staged}.json").write_text(json.dumps(to_dict(record), indent=2) + "\n", encoding="utf-8")
        _commit_staged([*moves, (Path(f"{staged}.json"), Path(f"{out_prefix}.json"))])  # the record last
    except OSError as e:
        if e.filename is None or not str(e.filename).startswith(str(stage)):
            raise
        raise ConfigError(f"--out {out_prefix}: cannot write {out_prefix}.bin, .idx and .json in {out_prefix.parent} "
                          f"({e.strerror or e}); nothing was written; free space or choose another prefix") from None
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return record


def check_out_prefix(prefix: Path) -> Path:
    """``prefix`` when it names files in a folder (PREFIX.bin, .idx, .json beside each other);
    ConfigError when it is a folder itself (``/``, ``.``, an existing directory: the files would
    land beside it as ``/.bin``), or its folder exists but is not a writable directory."""
    shown = str(prefix)
    if prefix.name in ("", ".", "..") or shown.endswith(os.sep) or prefix.is_dir():
        raise ConfigError(f"--out {shown}: is a folder, not a file prefix; name the files in it, e.g. "
                          f"--out {prefix / 'corpus'} writes {prefix / 'corpus'}.bin, .idx and .json")
    parent = prefix.parent
    if parent.exists() and (not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK)):
        raise ConfigError(f"--out {shown}: {parent} is not a folder you can write; choose another prefix")
    return prefix


OUTPUT_SUFFIXES = ("bin", "idx", "json", "tokenizer.json")  # what prepare_data writes beside PREFIX


def check_outputs_are_ours(prefix: Path) -> None:
    """ConfigError naming the file when PREFIX.bin, .idx, .json or .tokenizer.json exists and was
    not written by prepare_data, so a user's file (pd/settings.json) is never replaced. Ours: a
    PREFIX.json that reads as the DatasetRecord prepare_data writes (every key of it), for a prefix
    of this name (its ``prefix`` field; the folder may have moved since); then the .bin/.idx beside
    it are its dataset and a .tokenizer.json the one it fitted (written together, renamed into
    place with the record last), unless one is a symbolic link. Re-running onto our own outputs
    replaces them."""
    existing = [Path(f"{prefix}.{ext}") for ext in OUTPUT_SUFFIXES if os.path.lexists(f"{prefix}.{ext}")]
    if not existing:
        return
    record = _read_own_record(Path(f"{prefix}.json"), prefix=prefix)
    for path in existing:
        ours = record is not None and not path.is_symlink() and (
            path.name != f"{prefix.name}.tokenizer.json"
            or (record.tokenizer_trained and Path(record.tokenizer or "").name == path.name))
        if not ours:
            why = (f"no {prefix.name}.json record of ours for this prefix beside it" if record is None
                   else "a symbolic link, which prepare-data never writes" if path.is_symlink()
                   else f"not the tokenizer {prefix.name}.json records")
            raise ConfigError(f"--out {prefix}: {path} exists and was not written by `runner prepare-data` ({why}); "
                              "choose another --out prefix or move the file away")


def _read_own_record(path: Path, *, prefix: Path) -> DatasetRecord | None:
    """The DatasetRecord at ``path`` when it is one prepare_data wrote for ``prefix``; else None."""
    from ingest.io import read_regular_text

    try:
        data = json.loads(read_regular_text(path, max_bytes=MAX_RECORD_BYTES))
        record = DatasetRecord(**{**data, "sources": tuple(data["sources"])})
    except (OSError, ValueError, TypeError, KeyError, RecursionError):
        return None
    # the same file name: a campaign folder moved since keeps its dataset ours
    return record if Path(record.prefix).name == prefix.name else None


def split_for_encoding(text: str, *, max_chars: int = ENCODE_PIECE_CHARS) -> list[str]:
    """``text`` in pieces of at most ``max_chars`` characters whose encodings, concatenated, are the
    encoding of the whole: each cut is at whitespace that follows a non-space character, where no
    GPT-2 pre-token spans the cut (a pre-token holds no non-space followed by whitespace, and the
    regex has no look-behind). A window without such a place (``max_chars`` characters without
    whitespace) is cut at its end: one pre-token there is cut in two."""
    pieces, start = [], 0
    while len(text) - start > max_chars:
        end = start + max_chars
        m = _LAST_WORD_END.match(text, start, end)
        cut = m.end() if m and m.end() > start else end
        pieces.append(text[start:cut])
        start = cut
    pieces.append(text[start:])
    return pieces


def _encode(tokenizer, docs: Iterable[str], *, eod: int) -> Iterator["np.ndarray"]:
    """Each document's token ids followed by ``eod``, in order, as an int64 array. Documents are
    cut into pieces of at most ENCODE_PIECE_CHARS characters (split_for_encoding) and encoded in
    batches of about ENCODE_BATCH_CHARS: one batch's encodings (~100 bytes a token in the
    tokenizers library) and one document's ids (8 bytes a token) are held at a time, not a
    document's encoding whole (a 7 MB line without a newline held 2 GB)."""
    import numpy as np

    batch: list[str] = []
    ends: list[bool] = []
    current: list[np.ndarray] = []
    num_chars = 0

    def flush() -> list[np.ndarray]:
        done = []
        for e, end in zip(run_interruptible(tokenizer.encode_batch, batch, add_special_tokens=False), ends):
            current.append(np.asarray(e.ids, dtype=np.int64))
            if end:
                done.append(np.concatenate([*current, np.asarray([eod], dtype=np.int64)]))
                current.clear()
        batch.clear()
        ends.clear()
        return done

    for doc in docs:
        pieces = split_for_encoding(doc)
        for i, piece in enumerate(pieces):
            if batch and num_chars + len(piece) > ENCODE_BATCH_CHARS:
                yield from flush()
                num_chars = 0
            batch.append(piece)
            ends.append(i == len(pieces) - 1)
            num_chars += len(piece)
    if batch:
        yield from flush()


def write_dataset_record(path: Path, record: DatasetRecord) -> None:
    from core.atomic import write_json_atomic

    write_json_atomic(path, to_dict(record))


def describe_stdlib() -> str:
    return f"python {sys.version.split()[0]} standard library ({stdlib_dir()})"


def resolve_campaign_dataset(config: DataSourceConfig, *, data_dir: Path, model_vocab_size: int, seq_length: int,
                             tokens_needed: int) -> DatasetRecord:
    """The real round's dataset for a campaign, before any launch; records it in
    ``data_dir/dataset.json``.

    - ``config.path``: a prepared dataset, validated in place (tokenizer, if given, checked
      against the model's vocabulary);
    - ``config.sources``: tokenized into ``data_dir/corpus``;
    - neither: the default corpus (this Python's standard library, ``default_corpus_bytes``)
      tokenized into ``data_dir/corpus`` -- reused when an earlier build for the same
      vocabulary is there (the cache of a resumed or re-run campaign).
    Raises ConfigError naming the file at fault."""
    record_path = data_dir / "dataset.json"
    if config.path:
        prefix = Path(config.path).expanduser().resolve()
        tok_vocab = None
        if config.tokenizer:
            tok_vocab = check_tokenizer_vocab(load_tokenizer(Path(config.tokenizer)), path=config.tokenizer,
                                              model_vocab_size=model_vocab_size)
        info = validate_dataset(prefix, model_vocab_size=model_vocab_size, seq_length=seq_length)
        record = DatasetRecord(prefix=str(prefix), source="prepared", sources=(), source_bytes=0,
                               tokenizer=str(Path(config.tokenizer).resolve()) if config.tokenizer else None,
                               tokenizer_trained=False, vocab_size=tok_vocab, eod_token_id=None,
                               num_documents=info.num_documents, num_tokens=info.num_tokens,
                               token_dtype=info.token_dtype, max_token_id=info.max_token_id, bin_bytes=info.bin_bytes)
        write_dataset_record(record_path, record)
        return record
    prefix = data_dir / "corpus"
    if config.sources:
        sources, source = [Path(s) for s in config.sources], "files"
    else:
        sources, source = collect_stdlib_sources(max_bytes=default_corpus_bytes(tokens_needed=tokens_needed)), \
            describe_stdlib()
        cached = _cached_record(Path(f"{prefix}.json"), sources=sources, tokenizer=config.tokenizer,
                                model_vocab_size=model_vocab_size)
        if cached is not None:
            validate_dataset(prefix, model_vocab_size=model_vocab_size, seq_length=seq_length)
            write_dataset_record(record_path, cached)
            return cached
    record = prepare_data(sources, out_prefix=prefix, tokenizer_path=Path(config.tokenizer) if config.tokenizer else None,
                          vocab_size=model_vocab_size, text_key=config.text_key, source=source, seq_length=seq_length)
    write_dataset_record(record_path, record)
    return record


def _cached_record(path: Path, *, sources: Sequence[Path], tokenizer: str | None,
                   model_vocab_size: int) -> DatasetRecord | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        record = DatasetRecord(**{**data, "sources": tuple(data["sources"])})
    except (OSError, ValueError, TypeError, KeyError):
        return None
    same = (record.sources == tuple(str(p) for p in sources) and (tokenizer is None) == record.tokenizer_trained
            and record.vocab_size is not None and record.vocab_size <= model_vocab_size)
    return record if same else None

