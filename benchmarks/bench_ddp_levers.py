"""Which kernel levers move the runner's GPT-2 (gpt-125m, bf16 autocast, micro-batch 128, one GPU)
beyond the parity kernels, measured beside nanoGPT's bench.py in the same device call (issue 19's
ddp >= 1.10x nanoGPT target). One variant per process:

    python benchmarks/bench_ddp_levers.py VARIANT   -> one JSON line {variant, tokens_per_s, step_ms, mem_gib}

VARIANT: ``block`` (torch.compile per block, Liger cross entropy on the logits, fused AdamW: the
parity kernels without the DDP wrapper), ``block-cg`` (the same under CUDA graphs,
mode="reduce-overhead"), ``model`` (the whole model in one graph), ``model-cg`` (and CUDA graphs),
``flce`` (per block, Liger's fused linear cross entropy on the final hidden state and the tied
output weight, so the [tokens x vocab] logits are never held whole); ``-nobias`` on any of them
drops every Linear and LayerNorm bias (nanoGPT's bench runs its model with bias=False).
Tokens/s: the median of 20 timed steps after 6 warm-up steps (compilation), synthetic tokens.
Needs CUDA and liger_kernel.
"""
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from runner.model import GPT  # noqa: E402
from runner.presets import PRESETS, build_model_config  # noqa: E402

variant = sys.argv[1]
MB, STEPS, WARM = 128, 20, 6
torch.manual_seed(0)
torch.backends.cuda.matmul.allow_tf32 = True
cfg = build_model_config(PRESETS["gpt-125m"], max_tp_degree=1)
model = GPT(cfg).cuda()
if "nobias" in variant:  # before compiling: the graphs see no bias
    for m in model.modules():
        if isinstance(m, (torch.nn.Linear, torch.nn.LayerNorm)):
            m.bias = None
mode = "reduce-overhead" if "cg" in variant else None
if variant.startswith("block") or variant.startswith("flce"):
    for i, b in enumerate(model.blocks):
        model.blocks[i] = torch.compile(b, mode=mode)
    fwd = model
elif variant.startswith("model"):
    fwd = torch.compile(model, mode=mode)
else:
    raise SystemExit(f"unknown variant {variant}")

from liger_kernel.transformers import LigerCrossEntropyLoss, LigerFusedLinearCrossEntropyLoss  # noqa: E402

ce = LigerCrossEntropyLoss(reduction="mean")
flce = LigerFusedLinearCrossEntropyLoss(reduction="mean")


def hidden(tokens):
    pos = torch.arange(tokens.shape[1], device=tokens.device)
    x = model.wte(tokens) + model.wpe(pos)
    for block in model.blocks:
        x = block(x)
    return model.ln_f(x)


def loss_of(tokens, labels):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        if variant.startswith("flce"):
            h = hidden(tokens)
            return flce(model.lm_head.weight.to(torch.bfloat16), h.flatten(0, 1).to(torch.bfloat16),
                        labels.flatten(0, 1))
        logits = fwd(tokens)
        return ce(logits.flatten(0, 1).contiguous(), labels.flatten(0, 1))


opt = torch.optim.AdamW(model.parameters(), lr=6e-4, fused=True)
tokens = torch.randint(0, 50257, (MB, 1024), device="cuda")
labels = torch.randint(0, 50257, (MB, 1024), device="cuda")
times = []
for step in range(WARM + STEPS):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    loss = loss_of(tokens, labels)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    if step >= WARM:
        times.append(time.perf_counter() - t0)
times.sort()
med = times[len(times) // 2]
print(json.dumps({"variant": variant, "tokens_per_s": MB * 1024 / med, "step_ms": med * 1e3,
                  "loss": float(loss.detach()), "mem_gib": torch.cuda.max_memory_allocated() / 2**30}), flush=True)
