"""An ensemble of trained models (an extension beyond the paper, issue 57): an item's score is the
sum of its members' scores, each standardised per user (mean 0, sd 1 over the catalogue).

Standardising puts members of different scales on one footing (AutoRec's sigmoid logits,
NCE-AutoRec's predict head, a closed form's projections) without a weight to tune: on Gowalla the
three-member family ensemble chosen on validation this way reached Recall@20 0.1845 against its
best member's 0.1788 (``benchmarks/results/ensemble_check.md``).

It is not trained: ``experiment/ensemble.py`` assembles one from trained runs (choosing the
members on validation) and writes it as a run, so scoring, evaluation, MLflow and serving read it
as they read any model. Its file is the registry's one layout: the members' names and arguments
in ``model_args`` and their weights in one ``state_dict`` under ``members.<i>.``;
``models.registry.build`` rebuilds the members (this module cannot import the registry, which
imports every model).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from models.base import Recommender


def standardised(scores: torch.Tensor) -> torch.Tensor:
    """Each row of ``scores`` less its mean, over its standard deviation (a constant row: 0s)."""
    centred = scores - scores.mean(1, keepdim=True)
    return centred / scores.std(1, keepdim=True).clamp(min=1e-12)


class Ensemble(Recommender):
    name = "ensemble"
    kind = "combined"  # assembled from trained models: neither forward nor fit

    def __init__(self, members: list[Recommender]):
        super().__init__()
        if not members:
            raise ValueError("an ensemble needs at least one member")
        n_items = {m.n_items for m in members}
        if len(n_items) != 1:
            raise ValueError(f"the members score different catalogues ({sorted(n_items)} items)")
        if any(isinstance(m, Ensemble) for m in members):
            raise ValueError("a member of an ensemble is a trained model, not an ensemble")
        self.n_items = n_items.pop()
        self.members = nn.ModuleList(members)
        # a member with a per-call cost (a fold-in's optimiser steps) keeps its users in one block
        self.score_in_blocks = all(m.score_in_blocks for m in members)

    def model_args(self) -> dict[str, Any]:
        return {"n_items": self.n_items,
                "members": [{"model": m.name, "model_args": m.model_args()} for m in self.members]}

    def score(self, items: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        total = standardised(self.members[0].score(items, offsets))
        for m in self.members[1:]:
            total += standardised(m.score(items, offsets))
        return total

    def describe(self) -> str:
        return f"{self.name} of {len(self.members)}: " + "; ".join(
            m.describe() for m in self.members)
