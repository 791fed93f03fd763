"""Megatron-LM (and Megatron-DeepSpeed, Megatron-LLM, NeMo) training logs.

Records: ``steps`` (one per ``[ts] iteration N/ M | key: value | ...`` line, all eras; memory
report lines merge into the step row of their rank and iteration), ``timers`` (``time (ms) |
name: v | ...`` and ``name ....: (min, max)`` lines, attached to the last iteration), ``env``
(the argument dump ``name ........ value`` as ``megatron.<name>``); NeMo's ``Training epoch E,
iteration N/M | key: v | ...`` and NeMo Automodel's ``ts | INFO | logger | step=N loss=X lr=..``
(``key=value`` rows) are step rows too. Other lines go to the
DeepSpeed scanner, then the failure scanner. Deliberately not here: our own tokens/s or MFU.
"""
from __future__ import annotations

import re

from ingest.parsers import INT, Message, N_, ParseResult, StepRowParser, put_field, run_parsers, slug, to_int, to_num
from ingest.parsers.deepspeed import DeepSpeedParser, timer_records
from ingest.parsers.failures import FailureScanner

_ITER = re.compile(r"(?:\[(?P<ts>[\d\-: .]+)\] )?(?:samples/sec: (?P<sps>[\d.]+) \| )?(?:Training epoch \d+, )?"
                   rf"iteration\s+(?P<step>{INT})/\s*(?P<total>{INT}) \|(?P<rest>.*)$")
# NeMo Automodel's rows: "ts | LEVEL | logger | epoch=0 step=1070 loss=2.5004 lr=2.6e-05 grad_norm=0.12 .."
_KV_ROW = re.compile(r"(?:.* \| )?(?:epoch=\d+ )?step=(?P<step>\d+)(?P<rest>(?: \w+=\S+)+)$")
_KV_FIELDS = {"loss": ("loss", to_num, 1), "lr": ("lr", to_num, 1), "grad_norm": ("grad_norm", to_num, 1),
              "tps": ("tokens_per_s", to_num, 1), "step_time": ("step_time_s", to_num, 1), "epoch": ("epoch", to_num, 1)}
# NeMo 1.x (Lightning's progress bar, its metrics after the rate): "Epoch 0: 3%|..| 9000/301500
# [1:42:42<55:37:46, 41.36s/it, loss=3.1, v_num=0-56, reduced_train_loss=3.09, global_step=9e+3, ...]"
_PTL_BAR = re.compile(r"Epoch (?P<epoch>\d+):.*?\| *(?P<n>\d+)/(?P<total>\d+) \[(?P<rest>[^\]]*)\]$")
_PTL_RATE = re.compile(r"(?P<v>[\d.]+)(?P<unit>s/it|it/s)$")
_PTL_FIELDS = {"reduced_train_loss": ("loss", to_num, 1), "loss": ("loss_smoothed", to_num, 1),
               "train_step_timing in s": ("step_time_s", to_num, 1), "consumed_samples": ("consumed_samples", to_num, 1),
               "val_loss": ("val_loss", to_num, 1), "lr": ("lr", to_num, 1)}
_MEM = re.compile(r"(?:\[Rank (?P<rank>\d+)\] )?\(?after (?P<step>\d+) iterations\)? memory \(MB\) \|(?P<rest>.*)$")
_ARG = re.compile(r"(?P<key>[A-Za-z_][\w.\-]*) \.{2,} (?P<value>.*)$")
_MINMAX = re.compile(r"(?P<name>[\w\-/ ]+?) \.{2,}: \((?P<min>[\d.]+), (?P<max>[\d.]+)\)$")

# Pattern table for ``key: value`` segments of an iteration line: key -> (column, type, unit scale).
ITER_FIELDS: dict[str, tuple[str, type | object, float]] = {
    "consumed samples": ("consumed_samples", to_int, 1),
    "consumed tokens": ("consumed_tokens", to_int, 1),
    "elapsed time per iteration (ms)": ("step_time_s", to_num, 1e-3),
    "elapsed time per iteration (s)": ("step_time_s", to_num, 1),
    "learning rate": ("lr", to_num, 1),
    "global batch size": ("global_batch_size", to_int, 1),
    "lm loss": ("loss", to_num, 1),
    "lm_loss": ("loss", to_num, 1),  # gpt-neox
    "approx flops per GPU": ("framework_tflops_per_gpu", lambda t: to_num(t.removesuffix("TFLOPS")), 1),
    "loss scale": ("loss_scale", to_num, 1),
    "grad norm": ("grad_norm", to_num, 1),
    "num zeros": ("num_zeros", to_num, 1),
    "params norm": ("params_norm", to_num, 1),
    "number of skipped iterations": ("num_skipped_iterations", to_int, 1),
    "number of nan iterations": ("num_nan_iterations", to_int, 1),
    "samples per second": ("samples_per_s", to_num, 1),
    "TFLOPs": ("framework_tflops_per_gpu", to_num, 1),
    "throughput per GPU (TFLOP/s/GPU)": ("framework_tflops_per_gpu", to_num, 1),
    "tokens per GPU (tokens/s/GPU)": ("tokens_per_s_per_gpu", to_num, 1),
    "tokens/s/GPU": ("tokens_per_s_per_gpu", to_num, 1),
    "seq_len": ("seq_length", to_int, 1),
    # NeMo 2 (Lightning + Megatron strategy): "Training epoch 0, iteration 120/149 | lr: .. | ..."
    "reduced_train_loss": ("loss", to_num, 1),
    "train_step_timing in s": ("step_time_s", to_num, 1),
    "consumed_samples": ("consumed_samples", lambda t: int(to_num(t)), 1),
    "global_batch_size": ("global_batch_size", lambda t: int(to_num(t)), 1),
    "lr": ("lr", to_num, 1),
    "val_loss": ("val_loss", to_num, 1),
    "global_step": ("global_step", lambda t: int(to_num(t)), 1),
    "actual seqlen": ("seq_length", to_int, 1),
}
MEM_FIELDS = {  # memory (MB) line: key -> column (MB -> GiB)
    "allocated": "mem_allocated_gib", "max allocated": "mem_max_allocated_gib",
    "reserved": "mem_reserved_gib", "max reserved": "mem_max_reserved_gib",
}
_NOISE = re.compile(r"(?:\[.*\] )?datetime: \d{4}-\d\d-\d\d \d\d:\d\d:\d\d$|(?:training|done with setup|Done with setup) \.\.\.$"
                    r"|-+ (?:end of )?arguments -+$|\(min, max\) time across ranks \(ms\):$")


class MegatronParser(StepRowParser):
    kind = "megatron"
    gate = ("iteration", "time (ms)", "memory (MB)", " ..", "datetime: ", " arguments ", "(min, max)", " ...", "step=",
            "reduced_train_loss=", "train_step_timing in s=")

    def __init__(self, source: str) -> None:
        super().__init__(source)
        self._last_step: int | None = None
        self._unknown: set[str] = set()

    def _iteration(self, lineno: int, m: re.Match, ts, rank) -> bool:
        step = to_int(m.group("step"))
        row = self._step_row(rank, step, lineno)
        row["time"] = m.group("ts") or ts
        row["num_steps_total"] = to_int(m.group("total"))
        if m.group("sps"):  # gpt-neox puts the throughput first
            row["samples_per_s"] = float(m.group("sps"))
        for seg in m.group("rest").split("|"):
            key, sep, value = seg.partition(":")
            if not sep:
                continue
            key, value = key.strip(), value.strip()
            if not value:
                continue
            spec = ITER_FIELDS.get(key)
            if spec is None:
                if key.endswith(" loss") or key.endswith("_loss"):
                    spec = (slug(key), to_num, 1)
                else:
                    if key not in self._unknown:
                        self._unknown.add(key)
                        self.warnings.append(Message(N_("line %(line)s: iteration field %(key)s not in the pattern table"),
                                                     line=lineno, key=repr(key)))
                    continue
            put_field(row, spec, value)
        row.setdefault("loss", None)
        self._last_step = step
        return True

    def _ptl_bar(self, lineno: int, m: re.Match, rank) -> bool:
        """A NeMo 1.x progress bar: the step (global_step, else the bar's count), its metrics; the
        step time from train_step_timing, else from the bar's (smoothed) rate."""
        items = [x.strip() for x in m.group("rest").split(", ")]
        pairs = dict(x.split("=", 1) for x in items if "=" in x)
        step = int(to_num(pairs["global_step"])) if "global_step" in pairs else int(m.group("n"))
        row = self._step_row(rank, step, lineno)
        row.update(epoch=int(m.group("epoch")), num_steps_total=int(m.group("total")))
        for key, value in pairs.items():
            if key in _PTL_FIELDS:
                put_field(row, _PTL_FIELDS[key], value)
        rate = next((r for r in map(_PTL_RATE.match, items) if r), None)
        if "step_time_s" not in row and rate:
            v = float(rate.group("v"))
            row["step_time_s"] = v if rate.group("unit") == "s/it" else (1 / v if v else None)
        row.setdefault("loss", None)
        self._last_step = step
        return True

    def feed(self, lineno: int, body: str, ts, rank) -> bool:
        if "iteration" in body:
            m = _ITER.match(body)
            if m:
                return self._iteration(lineno, m, ts, rank)
        if "reduced_train_loss=" in body or "train_step_timing in s=" in body:
            m = _PTL_BAR.search(body)
            if m:
                return self._ptl_bar(lineno, m, rank)
        if "step=" in body and "loss=" in body:
            m = _KV_ROW.match(body)
            if m:
                row = self._step_row(rank, int(m.group("step")), lineno)
                for key, _, value in (kv.partition("=") for kv in m.group("rest").split()):
                    put_field(row, _KV_FIELDS.get(key) or (slug(key), to_num, 1), value)
                row.setdefault("loss", None)
                self._last_step = int(m.group("step"))
                return True
        if body.startswith("time (ms)") or body.startswith("rank=") and "time (ms)" in body:
            self.records.extend(timer_records(body, source=self.source, lineno=lineno, step=self._last_step,
                                              rank=rank, kind="megatron"))
            return True
        if "memory (MB)" in body:
            m = _MEM.match(body)
            if m:
                row = self._step_row(int(m.group("rank")) if m.group("rank") else rank, int(m.group("step")), lineno)
                for seg in m.group("rest").split("|"):
                    key, _, value = seg.partition(":")
                    col = MEM_FIELDS.get(key.strip())
                    if col:
                        row[col] = to_num(value.strip()) / 1024
                return True
        if "..." in body:
            m = _MINMAX.match(body)
            if m:
                self.records.append({"table": "timers", "source": self.source, "line": lineno, "kind": "megatron",
                                     "rank": rank, "step": self._last_step, "name": m.group("name").strip(),
                                     "time_min_s": float(m.group("min")) * 1e-3, "time_max_s": float(m.group("max")) * 1e-3})
                return True
            m = _ARG.match(body)
            if m:
                self.env(lineno, f"megatron.{m.group('key')}", m.group("value").strip(), record="argument")
                return True
        return _NOISE.match(body) is not None


def parse_megatron(text, *, source: str) -> ParseResult:
    """Parse a Megatron-LM log (see module doc). Pure; never raises on content."""
    return run_parsers(text, [MegatronParser(source), DeepSpeedParser(source), FailureScanner(source)], kind="megatron")
