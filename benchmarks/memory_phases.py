"""One capacity trial's device and host memory by phase and by allocation site, on one GPU:

    python benchmarks/memory_phases.py LAYOUT RUNG > OUT.json

LAYOUT and RUNG name a run and a ladder rung of examples/matrices/1gpu-capacity-4layouts.toml; the
trial's spec is the probe's own (runner.capacity.build_trial_spec), trained two steps by the
runner's trainer in this process. Host: VmRSS / VmHWM (/proc/self/status; the peak reset through
/proc/self/clear_refs) after the build, before and after each optimizer step. Device: the
allocator's peak per step, and the second step's allocation trace (torch.cuda.memory history)
replayed to list the blocks live at its peak by allocation site. Diagnostic: it explains the
memory model's terms (core.memory), it is not a target.
"""
from __future__ import annotations

import collections
import json
import os
import socket
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from runner.capacity import build_capacity_config, build_ladder, build_trial_spec  # noqa: E402
from runner.matrix import load_matrix, resolve_matrix  # noqa: E402
from runner.strategies import RankContext, build_trainer  # noqa: E402

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024 / 2**30
def reset_hwm():
    with open("/proc/self/clear_refs", "w") as f: f.write("5")

layout, rung = sys.argv[1], int(sys.argv[2])
mp = Path("examples/matrices/1gpu-capacity-4layouts.toml")
raw = load_matrix(mp)
camp = resolve_matrix(raw, source=str(mp), num_gpus=1)
cfg = build_capacity_config(raw["capacity"], where="m", device="cuda")
ladder = build_ladder(camp.fixed.model, cfg.ladder, where="m")
spec = next(s for s in camp.runs if s.name == layout)
spec = build_trial_spec(spec, ladder[rung], rung=rung, config=cfg)
with socket.socket() as s:
    s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
torch.cuda.set_device(0)
dist.init_process_group("nccl", rank=0, world_size=1)
torch.manual_seed(spec.fixed.seed)
out = {"layout": layout, "rung": rung, "rss_start": status("VmRSS")}
trainer = build_trainer(spec, ctx=RankContext(rank=0, world_size=1, local_rank=0, device=torch.device("cuda")))
torch.cuda.synchronize()
out["params"] = trainer.num_params
out["after_build"] = {"rss": status("VmRSS"), "hwm": status("VmHWM"), "dev_alloc": torch.cuda.memory_allocated() / 2**30}
opt = trainer.optimizer
orig_step = opt.step
phases = []
def step(*a, **k):
    torch.cuda.synchronize()
    phases.append({"before_opt_rss": status("VmRSS"), "before_opt_hwm": status("VmHWM"),
                   "fb_dev_peak": torch.cuda.max_memory_allocated() / 2**30})
    reset_hwm()
    r = orig_step(*a, **k)
    phases[-1].update(opt_hwm=status("VmHWM"), after_opt_rss=status("VmRSS"))
    return r
opt.step = step
mb, seq = spec.micro_batch_size, spec.fixed.model.seq_length
batches = [(torch.randint(0, 50000, (mb, seq), device="cuda"),) * 2 for _ in range(spec.num_microbatches)]
for i in range(2):
    if i == 1:
        torch.cuda.memory._record_memory_history(max_entries=400000)
    torch.cuda.reset_peak_memory_stats(); reset_hwm()
    trainer.train_step(batches, lr=1e-4)
    torch.cuda.synchronize()
    phases[-1]["step_dev_peak"] = torch.cuda.max_memory_allocated() / 2**30
    phases[-1]["step_dev_after"] = torch.cuda.memory_allocated() / 2**30
out["steps"] = phases
print(json.dumps(out), flush=True)
snap = torch.cuda.memory._snapshot()
torch.cuda.memory._record_memory_history(enabled=None)
# replay the step's allocation trace: live blocks at its peak, grouped by allocation site
live, cur, peak, at_peak = {}, 0, 0, None
base = sum(b["size"] for seg in snap["segments"] for b in seg["blocks"] if b["state"] == "active_allocated")
events = snap["device_traces"][0]
# live at start of trace = live at end minus net of the trace
net = sum(e["size"] if e["action"] == "alloc" else -e["size"] if e["action"] == "free_completed" else 0 for e in events)
start = base - net
cur = start
def site(frames):
    keep = [f for f in frames if "site-packages/torch/" not in f["filename"] and "/python3" not in f["filename"]]
    torch_frames = [f for f in frames if "torch/distributed" in f["filename"] or "torch/optim" in f["filename"] or "torch/nn" in f["filename"]]
    f = (torch_frames[:1] or keep[:1] or frames[:1] or [{"filename": "?", "line": 0, "name": "?"}])[0]
    g = keep[:1] or [{"filename": "?", "line": 0, "name": "?"}]
    return f"{Path(f['filename']).name}:{f['line']}:{f['name']} <- {Path(g[0]['filename']).name}:{g[0]['line']}:{g[0]['name']}"
for e in events:
    if e["action"] == "alloc":
        live[e["addr"]] = (e["size"], site(e.get("frames", [])))
        cur += e["size"]
        if cur > peak:
            peak, at_peak = cur, dict(live)
    elif e["action"] == "free_completed":
        if e["addr"] in live:
            live.pop(e["addr"])
        cur -= e["size"]
groups = collections.Counter()
for size, s in (at_peak or {}).values():
    groups[s] += size
out["trace_start_gib"] = start / 2**30
out["trace_peak_gib"] = peak / 2**30
out["peak_sites_mib"] = [(s, round(v / 2**20, 1)) for s, v in groups.most_common(14)]
print(json.dumps(out, indent=1))
dist.destroy_process_group()
