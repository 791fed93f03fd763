"""The shared loss of a run's kernel choices (runner.kernels resolves them): one function every
engine calls on the LM head's logits.

Deliberately not here: choosing the kernels (runner.kernels), the engines themselves.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Mapping

import torch

from runner.kernels import apply_engine_knobs, resolve_kernels
from runner.model import lm_loss

_eager_cross_entropy = lm_loss  # mean next-token cross entropy in fp32 (runner.model, its one home)


@functools.lru_cache(maxsize=None)
def _compiled_cross_entropy() -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    # one compiled function per process, shared by every caller (the same graph in every engine)
    return torch.compile(_eager_cross_entropy, dynamic=False)


@functools.lru_cache(maxsize=None)
def _liger_cross_entropy() -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    from liger_kernel.transformers import LigerCrossEntropyLoss

    module = LigerCrossEntropyLoss(reduction="mean")

    def loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        # Liger computes in fp32 inside its kernel whatever the logits' dtype; the gradient is written
        # into the logits buffer during forward (no separate log-probabilities tensor)
        return module(logits.flatten(0, 1).contiguous(), labels.flatten(0, 1))

    return loss


def build_loss_fn(kernels: Mapping[str, Any] | None) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The shared LM loss ``(logits [b, t, V], labels [b, t]) -> scalar`` for a run's kernels
    (None or a loss the engine computes itself: the eager fp32 cross entropy)."""
    name = (kernels or {}).get("loss")
    if name == "liger-cross-entropy":
        return _liger_cross_entropy()
    if name == "compiled-cross-entropy":
        return _compiled_cross_entropy()
    return _eager_cross_entropy


def spec_kernels(options: Mapping[str, Any], *, strategy: str, engine: str, device: str,
                 tp_degree: int) -> dict[str, Any]:
    """``options["kernels"]`` as resolved by runner.matrix, or (specs written before kernel modes
    existed) engine-best resolved now."""
    k = options.get("kernels")
    if isinstance(k, Mapping):
        return dict(k)
    best = resolve_kernels(strategy, engine, mode="engine-best", device=device, tp_degree=tp_degree, liger=False)
    return apply_engine_knobs(best, options, strategy=strategy, engine=engine)
