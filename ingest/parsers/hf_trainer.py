"""Hugging Face Trainer log lines: the dict ``ProgressCallback.on_log`` prints (transformers
trainer_callback.py) at every logging step, ``{'loss': 2.31, 'grad_norm': 1.2, 'learning_rate':
5e-05, 'epoch': 0.53}``, the eval dict (``eval_*``) and the closing ``{'train_runtime': ...}``
summary; often glued after a tqdm bar (``\\r`` or a literal ``^M``).

Records: ``steps`` (one per training dict: loss, grad_norm, lr, epoch; no step number is printed,
so step is the dict's order among the file's training dicts, 1-based, and ``step_is_index``
says so), ``events`` (``hf_eval`` and ``hf_train_summary`` with their values). Deliberately not
here: tqdm bars (their rate is the bar's, not a step time).
"""
from __future__ import annotations

import re

from ingest.parsers import LineParser, ParseResult, run_parsers, to_num
from ingest.parsers.failures import FailureScanner

_DICT = re.compile(r"\{('\w+': [^{}]*)\}\s*$")
_PAIR = re.compile(r"'(?P<key>\w+)': (?P<value>[^,]+)")
FIELDS = {  # pattern table: printed key -> column
    "loss": "loss", "grad_norm": "grad_norm", "learning_rate": "lr", "epoch": "epoch",
    "train_runtime": "train_runtime_s", "train_samples_per_second": "samples_per_s",
    "train_steps_per_second": "steps_per_s", "train_loss": "train_loss", "total_flos": "total_flos",
}


def _value(text: str) -> float | None:
    text = text.strip()
    try:
        return to_num(text)  # nan and inf read as floats
    except ValueError:
        return None


class HfTrainerParser(LineParser):
    kind = "hf_trainer"
    gate = ("{'",)
    _num_steps = 0

    def feed(self, lineno: int, body: str, ts, rank) -> bool:
        m = _DICT.search(body)
        if m is None:
            return False
        pairs = {p.group("key"): _value(p.group("value")) for p in _PAIR.finditer(m.group(1))}
        if "loss" in pairs or "learning_rate" in pairs:
            self._num_steps += 1
            row = {"table": "steps", "source": self.source, "line": lineno, "kind": self.kind, "rank": rank,
                   "step": self._num_steps, "step_is_index": True}
            row.update((FIELDS[k], v) for k, v in pairs.items() if k in FIELDS)
            row.setdefault("loss", None)
            self.records.append(row)
            return True
        if "train_runtime" in pairs or any(k.startswith("eval_") for k in pairs):
            event = "hf_train_summary" if "train_runtime" in pairs else "hf_eval"
            self.event(event, lineno, rank, ts, **{FIELDS.get(k, k): v for k, v in pairs.items()})
            return True
        return False


def parse_hf_trainer(text, *, source: str) -> ParseResult:
    """Parse Hugging Face Trainer log lines (see module doc). Pure; never raises on content."""
    return run_parsers(text, [HfTrainerParser(source), FailureScanner(source)], kind="hf_trainer")
