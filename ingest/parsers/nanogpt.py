"""Training-loop lines of nanoGPT and its kin, as their train scripts print them:

- nanoGPT (train.py): ``iter 100: loss 4.2345, time 120.53ms, mfu 30.12%`` (``mfu -100.00%`` until
  its estimate has warmed up: not a number) and its eval line ``step 500: train loss 3.1, val loss 3.2``;
- nanochat (base_train.py): ``step 00004/21400 (0.02%) | loss: 8.89 | lrm: 1.00 | dt: 989.44ms |
  tok/sec: 529,882 | mfu: 74.13 | total time: 0.00m`` (tok/sec: the whole job's);
- llama2.c (train.py): ``490 | loss 5.7543 | lr 4.900000e-05 | 8060.78ms | mfu 0.21%``.

Records: ``steps`` (step_time_s, loss, lr, tokens_per_s, framework_mfu as a fraction; the eval
losses merge into their step's row). Deliberately not here: our own MFU (report computes it).
"""
from __future__ import annotations

import re

from ingest.parsers import ParseResult, StepRowParser, put_field, run_parsers, to_num
from ingest.parsers.failures import FailureScanner

_PCT = (lambda text: to_num(text.rstrip("%")))
# Pattern table: (regex searched in the line, {group: (column, type, scale)}).
_LINES = tuple((re.compile(p), cols) for p, cols in (
    (r"\biter (?P<step>\d+): loss (?P<loss>\S+?), time (?P<ms>[\d.]+)ms(?:, mfu (?P<mfu>-?[\d.]+)%)?",
     {"loss": ("loss", to_num, 1), "ms": ("step_time_s", to_num, 1e-3), "mfu": ("framework_mfu", to_num, 0.01)}),
    (r"\bstep (?P<step>\d+): train loss (?P<tl>\S+?), val loss (?P<vl>\S+?)$",
     {"tl": ("train_loss", to_num, 1), "vl": ("val_loss", to_num, 1)}),
    (r"\bstep (?P<step>\d+)/(?P<total>\d+) \([\d.]+%\) \| loss: (?P<loss>\S+) \|.*? dt: (?P<ms>[\d.]+)ms"
     r"(?: \| tok/sec: (?P<tps>[\d,]+))?(?: \| mfu: (?P<mfu>[\d.]+))?",
     {"loss": ("loss", to_num, 1), "ms": ("step_time_s", to_num, 1e-3), "tps": ("tokens_per_s", to_num, 1),
      "mfu": ("framework_mfu", _PCT, 0.01), "total": ("num_steps_total", int, 1)}),
    (r"^(?P<step>\d+) \| loss (?P<loss>\S+) \| lr (?P<lr>\S+) \| (?P<ms>[\d.]+)ms \| mfu (?P<mfu>-?[\d.]+)%$",
     {"loss": ("loss", to_num, 1), "lr": ("lr", to_num, 1), "ms": ("step_time_s", to_num, 1e-3),
      "mfu": ("framework_mfu", to_num, 0.01)}),
))


class NanoGptParser(StepRowParser):
    kind = "nanogpt"
    gate = ("iter ", "step ", " | loss ")

    def feed(self, lineno: int, body: str, ts, rank) -> bool:
        for rx, cols in _LINES:
            m = rx.search(body)
            if m:
                row = self._step_row(rank, int(m.group("step")), lineno)
                for group, spec in cols.items():
                    value = m.group(group)
                    if spec[0] == "framework_mfu" and value is not None and value.startswith("-"):
                        value = None  # nanoGPT prints -100% until its running estimate starts
                    put_field(row, spec, value)
                row.setdefault("loss", None)
                return True
        return False


def parse_nanogpt(text, *, source: str) -> ParseResult:
    """Parse nanoGPT / nanochat / llama2.c training lines (see module doc). Pure; never raises on content."""
    return run_parsers(text, [NanoGptParser(source), FailureScanner(source)], kind="nanogpt")
