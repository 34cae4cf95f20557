"""What one optimisation step does for each model and mode (protocol.md, "Modes").

    joint             one optimizer, loss = embedding-head loss + MSE loss
    alternating       per batch: a step on the embedding head's loss (encoder + that head),
                      then a step on the MSE loss (encoder + predict head)
    limited-finetune  phase 1: encoder + embedding head on its loss until it converges;
                      phase 2: predict head alone on MSE, the encoder frozen
    full-finetune     phase 1 as above; phase 2: encoder + predict head on MSE

One-headed models (autorec, ohns-autorec) have a single phase training everything on their loss.
L2 (lambda * mean(W^2) per matrix) covers the matrices a step trains.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from training.data import Batch
from training.losses import l2_penalty, mse_loss, ns_loss
from training.models import AutoRec, ModelSpec

MODES = ("joint", "alternating", "limited-finetune", "full-finetune")


@dataclass(frozen=True)
class Step:
    """Heads whose losses are summed, and whether the encoder is trained by this step."""

    heads: tuple[str, ...]
    train_encoder: bool = True


def phases(spec: ModelSpec, mode: str | None) -> list[list[Step]]:
    """The steps per batch of each training phase (one phase, or two for the fine-tune modes)."""
    if spec.embed_head is None or len(spec.heads) == 1:
        if mode is not None:
            raise ValueError("--mode applies to the two-headed models only (ns-autorec, "
                             "nce-autorec); drop it for a one-headed model")
        return [[Step(spec.heads)]]
    mode = mode or "joint"
    e = spec.embed_head
    if mode == "joint":
        return [[Step((e, "predict"))]]
    if mode == "alternating":
        return [[Step((e,)), Step(("predict",))]]
    if mode == "limited-finetune":
        return [[Step((e,))], [Step(("predict",), train_encoder=False)]]
    if mode == "full-finetune":
        return [[Step((e,))], [Step(("predict",))]]
    raise ValueError(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}")


def head_loss(name: str, scores: torch.Tensor, batch: Batch) -> torch.Tensor:
    if name == "predict":
        return mse_loss(scores, batch.train_items, batch.train_offsets)
    if name == "nce":
        return mse_loss(scores, batch.train_items, batch.train_offsets, batch.train_rstar)
    if name == "ns":
        return ns_loss(scores, batch.train_items, batch.train_offsets, batch.neg_items,
                       batch.neg_counts, batch.neg_offsets)
    raise ValueError(f"unknown head {name!r}")


def unwrap(net: torch.nn.Module) -> AutoRec:
    """The AutoRec inside a DDP wrapper (or the model itself)."""
    return getattr(net, "module", net)


def objective(net: torch.nn.Module, batch: Batch, step: Step, lam: float
              ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(total loss, per-head loss) of ``step`` on ``batch``; ``net`` is an AutoRec or its DDP
    wrapper (the forward goes through the wrapper so that gradients are synchronised)."""
    scores = net(batch.train_items, batch.train_offsets, step.heads,
                 frozen_encoder=not step.train_encoder)
    model = unwrap(net)
    losses = {name: head_loss(name, scores[name], batch) for name in step.heads}
    weights = [model.heads[name].weight for name in step.heads]
    if step.train_encoder:
        weights.append(model.encoder.weight)
    return sum(losses.values()) + l2_penalty(weights, lam), losses


def step_parameters(model: AutoRec, step: Step) -> list[torch.nn.Parameter]:
    params = [p for name in step.heads for p in model.heads[name].parameters()]
    if step.train_encoder:
        params += list(model.encoder.parameters()) + [model.encoder_bias]
    return params


def make_optimizers(model: torch.nn.Module, steps: list[Step], lr: float
                    ) -> list[torch.optim.Optimizer]:
    """One Adam per step (the alternating mode keeps separate moment estimates per objective)."""
    return [torch.optim.Adam(step_parameters(unwrap(model), s), lr=lr) for s in steps]


def uses_every_parameter(spec: ModelSpec, mode: str | None) -> bool:
    """Whether every step of every phase trains all parameters (DDP's find_unused_parameters
    can then stay off, which saves a graph traversal per step)."""
    return all(len(steps) == 1 and steps[0].train_encoder and set(steps[0].heads) == set(spec.heads)
               for steps in phases(spec, mode))


def train_batch(net: torch.nn.Module, batch: Batch, steps: list[Step],
                optimizers: list[torch.optim.Optimizer], lam: float) -> dict[str, torch.Tensor]:
    """Run each step of the phase on ``batch``; returns the per-head losses as detached 0-d
    tensors (no host sync per batch: the caller accumulates them on the device)."""
    out = {}
    for step, opt in zip(steps, optimizers):
        opt.zero_grad(set_to_none=True)
        total, losses = objective(net, batch, step, lam)
        total.backward()
        opt.step()
        out.update({k: v.detach() for k, v in losses.items()})
    return out
