"""Kernel choices per run: "parity" (every engine the same kernels for the same math) or
"engine-best" (each engine its own favourite settings), resolved once by runner.matrix into
``spec.options["kernels"]`` and recorded by the trainer in ``RunInfo.kernels``.

Parity, the default for layout comparisons (DESIGN.md "Comparing layouts, not kernels"):

* loss: one function every engine calls on the LM head's logits -- Liger-Kernel's Triton
  ``LigerCrossEntropyLoss`` on CUDA when ``liger_kernel`` imports, else one ``torch.compile``'d
  cross entropy (the same compiled graph in every engine), eager on CPU. The logits form, not
  Liger's fused-linear variant: Megatron's GPTModel hands back logits (labels=None), not its
  final hidden state and output weight, so the fused-linear form could not be the same kernel
  there. Megatron with TP > 1 keeps its vocab-parallel cross entropy (its logits are
  vocab-sharded; the shared loss needs whole rows) and the record says so.
* attention: ``F.scaled_dot_product_attention(is_causal=True)`` everywhere (runner.model;
  Megatron's core attention through runner.strategies.megatron_attention).
* optimizer: torch AdamW, ``fused=True`` on CUDA (Megatron's AdamW switched by
  ``use_fused_adamw``), foreach on CPU.
* compile scope: ``torch.compile`` of each transformer block for DDP, FSDP2 and torch TP+PP
  (loss and optimizer outside the graphs, so the loss is the shared one); none for DeepSpeed
  ZeRO-3 and Megatron, for the reasons in ``NOT_TAKEN``.

Engine-best keeps what each engine did before parity existed: DDP compiles the whole model with
its fp32 loss in one graph; FSDP2 and torch TP+PP compile per block with an eager loss;
DeepSpeed eager; Megatron eager with its vocab-parallel loss.

Deliberately not here: torch (runner.matrix resolves kernels without importing it), the loss functions
(runner.strategies.parity builds them), launching.
"""
from __future__ import annotations

import importlib.util
from typing import Any, Mapping

from core.i18n import N_

KERNEL_MODES = ("parity", "engine-best")
ATTENTION = "sdpa-causal"  # F.scaled_dot_product_attention(is_causal=True); torch picks flash/cuDNN/efficient
LOSSES = ("liger-cross-entropy", "compiled-cross-entropy", "eager-cross-entropy", "megatron-vocab-parallel")
COMPILE_SCOPES = ("per-block", "model+loss", "none")

# What an engine cannot take in parity mode, and why (printed in the note beside the run; catalogue
# messages, so the note translates what the run recorded).
NOT_TAKEN: dict[tuple[str, str], dict[str, str]] = {
    ("zero3", "deepspeed"): {
        "compile": N_("DeepSpeed ZeRO-3 gathers each module's partitioned parameters in forward/backward hooks on"
                      " every nn.Module; torch.compile of a block breaks its graph at each of those hooks (DeepSpeed's"
                      " own compile path for ZeRO-3 is DeepCompile, a different compiler), so blocks run eager"),
    },
    ("tp_pp", "megatron"): {
        "compile": N_("megatron-core 0.16 without Transformer Engine builds its layers from custom autograd"
                      " Functions (tensor-parallel linears) and a CUDA RNG tracker; per-layer torch.compile of its"
                      " TransformerLayer is not a supported path there, so layers run eager, with Megatron's own"
                      " compiled bias-GELU and bias-dropout-add fusions"),
    },
}
MEGATRON_TP_LOSS_REASON = N_("tp_degree > 1: Megatron's logits are vocab-sharded across TP ranks; the shared loss needs"
                              " whole vocabulary rows, so Megatron's vocab-parallel cross entropy computes it")


def liger_available() -> bool:
    """Whether Liger-Kernel is importable (its Triton kernels then run on CUDA)."""
    return importlib.util.find_spec("liger_kernel") is not None


def resolve_kernels(strategy: str, engine: str, *, mode: str, device: str, tp_degree: int,
                    liger: bool | None = None) -> dict[str, Any]:
    """The kernel choices of one run: {mode, loss, attention, optimizer, compile, not_taken}.

    mode: "parity" | "engine-best"; device "cuda" | "cpu"; liger: whether Liger-Kernel imports
    (None: look). ``not_taken`` maps a piece to why this engine cannot take the parity choice.
    Raises ValueError for an unknown mode."""
    if mode not in KERNEL_MODES:
        raise ValueError(f"kernels must be one of {', '.join(KERNEL_MODES)}, got {mode!r}")
    cuda = device == "cuda"
    optimizer = "adamw-fused" if cuda else "adamw-foreach"
    megatron = (strategy, engine) == ("tp_pp", "megatron")
    not_taken: dict[str, str] = {}
    if mode == "parity":
        if not cuda:
            loss = "eager-cross-entropy"
        else:
            loss = "liger-cross-entropy" if (liger_available() if liger is None else liger) else "compiled-cross-entropy"
        compile_scope = "per-block" if cuda else "none"
        if cuda and (strategy, engine) in NOT_TAKEN:
            not_taken.update(NOT_TAKEN[(strategy, engine)])
            compile_scope = "none"
        if megatron and tp_degree > 1:
            loss, not_taken["loss"] = "megatron-vocab-parallel", MEGATRON_TP_LOSS_REASON
    else:
        loss = "megatron-vocab-parallel" if megatron else "eager-cross-entropy"
        compile_scope = "none"
        if cuda and (strategy, engine) == ("ddp", "torch-ddp"):
            compile_scope, loss = "model+loss", "compiled-cross-entropy"
        elif cuda and (strategy, engine) in (("zero3", "fsdp2"), ("tp_pp", "torch")):
            compile_scope = "per-block"
    return {"mode": mode, "loss": loss, "attention": ATTENTION, "optimizer": optimizer, "compile": compile_scope,
            "not_taken": not_taken}


def describe_kernels(kernels: Mapping[str, Any]) -> str:
    """One line for logs and the note: "parity: loss liger-cross-entropy, attention sdpa-causal, ..."."""
    return (f"{kernels.get('mode')}: loss {kernels.get('loss')}, attention {kernels.get('attention')}, optimizer"
            f" {kernels.get('optimizer')}, compile {kernels.get('compile')}")


def apply_engine_knobs(kernels: Mapping[str, Any], options: Mapping[str, Any], *, strategy: str,
                       engine: str) -> dict[str, Any]:
    """Engine-best kernels adjusted to the run's resolved knobs (``compile``, ``fused_adamw``): what
    the engine will really do. Parity kernels come back unchanged (parity fixes those knobs)."""
    out = dict(kernels)
    if out.get("mode") != "engine-best":
        return out
    if "compile" in options and not options["compile"]:
        out["compile"] = "none"
        if (strategy, engine) == ("ddp", "torch-ddp"):
            out["loss"] = "eager-cross-entropy"
    elif options.get("compile") and (strategy, engine) == ("zero3", "deepspeed"):
        out["compile"] = "model (DeepSpeedEngine.compile)"
    if "fused_adamw" in options and not options["fused_adamw"] and out["optimizer"] == "adamw-fused":
        out["optimizer"] = "adamw-foreach"
    elif options.get("fused_adamw") and out["optimizer"] == "adamw-foreach":  # set on a CPU run: fused there
        out["optimizer"] = "adamw-fused"
    return out
