"""One optimisation step of any gradient model (``models.base.Recommender``): the model's forward
returns its named loss terms, the step minimises their sum with the optimizer of that step.

A model's phases list its steps (``Recommender.phases``); each step has its own Adam over the
parameters the model says it trains (the AutoRec family's alternating mode keeps separate moment
estimates per objective).
"""

from __future__ import annotations

import torch

from models.base import Recommender
from models.batch import Batch


def unwrap(net: torch.nn.Module) -> Recommender:
    """The model inside a DDP wrapper (or the model itself)."""
    return getattr(net, "module", net)


def make_optimizers(net: torch.nn.Module, steps: list, lr: float) -> list[torch.optim.Optimizer]:
    return [torch.optim.Adam(unwrap(net).step_parameters(s), lr=lr) for s in steps]


def train_batch(net: torch.nn.Module, batch: Batch, steps: list,
                optimizers: list[torch.optim.Optimizer]) -> dict[str, torch.Tensor]:
    """Run each step of the phase on ``batch``; returns the loss terms as detached 0-d tensors (no
    host sync per batch: the caller accumulates them on the device). ``net`` is the model or its
    DDP wrapper: the forward goes through the wrapper so that gradients are synchronised."""
    out = {}
    for step, opt in zip(steps, optimizers):
        opt.zero_grad(set_to_none=True)
        terms = net(batch, step)
        sum(terms.values()).backward()
        opt.step()
        out.update({k: v.detach() for k, v in terms.items()})
    return out
