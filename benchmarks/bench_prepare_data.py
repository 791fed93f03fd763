"""`runner prepare-data` time against input size on single-line inputs (issue 21: a 100 KB line
took 12 s and 1 MB never finished; the BPE fit was quadratic in the longest pre-token).

    python benchmarks/bench_prepare_data.py [--sizes 100K,1M,4M] [--out FILE]

Each size is one line of text without a newline, in two kinds: ``no_space`` (random base64
characters: one giant "word", the worst case for the fit, which learns the full vocabulary) and
``one_char`` (a run of one letter). prepare_data is timed in-process (imports paid by a warm-up call first), fitting
the tokenizer (vocab 50257) and writing the indexed dataset into a temporary directory.
Linear means seconds per MB roughly constant across sizes. Results go to
benchmarks/results/prepare_data.json.
"""
from __future__ import annotations

import argparse
import json
import platform
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from runner.commbench import parse_size  # noqa: E402
from runner.corpus import MAX_PRETOKEN_CHARS, prepare_data  # noqa: E402

ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


def build_line(kind: str, num_bytes: int, *, seed: int = 0) -> str:
    """One line of ``num_bytes`` ASCII characters of the given kind (module docstring)."""
    if kind == "one_char":
        return "a" * num_bytes
    rng = random.Random(seed)
    return "".join(rng.choices(ALPHABET, k=num_bytes))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100K,1M,4M")
    parser.add_argument("--kinds", default="no_space,one_char")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "prepare_data.json")
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        warm = Path(tmp) / "warm.txt"  # imports (tokenizers, megatron-core) paid once, before any timing
        warm.write_text(build_line("no_space", 4096), encoding="utf-8")
        prepare_data([warm], out_prefix=Path(tmp) / "warm" / "corpus", tokenizer_path=None, vocab_size=50257)
        for kind in args.kinds.split(","):
            for size in args.sizes.split(","):
                num_bytes = parse_size(size)
                src = Path(tmp) / f"{kind}-{size}.txt"
                src.write_text(build_line(kind, num_bytes), encoding="utf-8")
                t0 = time.perf_counter()
                record = prepare_data([src], out_prefix=Path(tmp) / f"out-{kind}-{size}" / "corpus", tokenizer_path=None,
                                      vocab_size=50257)
                seconds = time.perf_counter() - t0
                rows.append({"kind": kind, "size": size, "num_bytes": num_bytes, "seconds": round(seconds, 2),
                             "s_per_mb": round(seconds / (num_bytes / 2**20), 2), "num_tokens": record.num_tokens,
                             "vocab_size": record.vocab_size})
                print(json.dumps(rows[-1]), flush=True)
    result = {"benchmark": "prepare_data single line", "max_pretoken_chars": MAX_PRETOKEN_CHARS,
              "python": platform.python_version(), "machine": f"{platform.machine()}, shared 2-core box",
              "before_fix": "100K single line: 12 s; 1M: killed after 9 min (issue 21)", "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
