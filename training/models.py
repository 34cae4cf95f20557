"""The AutoRec family of the paper as one plain ``torch.nn.Module`` with named heads.

Input is a batch of users' binary training rows in sparse form, ``items`` (nnz,) int64 with
``offsets`` (B,) int64 (EmbeddingBag layout): the encoder computes ``h = ReLU(W_e r + b_e)`` as a sum
of W_e's columns for the user's items, so the (B, n_items) input is never formed. Each head is
linear with bias and identity output, ``W h + b``, shape (B, n_items) float32.

    autorec       encoder + predict head (MSE against r)
    ohns-autorec  encoder + ns head (negative sampling); it also recommends with that head
    ns-autorec    encoder + ns head + predict head; recommends with the predict head
    nce-autorec   encoder + nce head (MSE against R*) + predict head; recommends with predict
"""

from __future__ import annotations

import math
import pickle
from dataclasses import dataclass

import torch
from torch import nn

from etl.errors import UsageError
from training.losses import row_ids


@dataclass(frozen=True)
class ModelSpec:
    heads: tuple[str, ...]   # all heads the model trains
    embed_head: str | None   # the de-popularising head (nce | ns), if any
    recommend_head: str      # the head whose scores rank items


MODELS: dict[str, ModelSpec] = {
    "autorec": ModelSpec(("predict",), None, "predict"),
    "ohns-autorec": ModelSpec(("ns",), "ns", "ns"),
    "ns-autorec": ModelSpec(("ns", "predict"), "ns", "predict"),
    "nce-autorec": ModelSpec(("nce", "predict"), "nce", "predict"),
}


def model_spec(name: str) -> ModelSpec:
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(MODELS)}")
    return MODELS[name]


class AutoRec(nn.Module):
    """Encoder (n_items -> width, ReLU) and one linear head (width -> n_items) per name in ``heads``."""

    def __init__(self, n_items: int, width: int, heads: tuple[str, ...]):
        super().__init__()
        if n_items < 1 or width < 1 or not heads:
            raise ValueError(f"need n_items >= 1, width >= 1 and a head; got {n_items}, {width}, {heads}")
        self.n_items, self.width, self.head_names = n_items, width, tuple(heads)
        self.encoder = nn.EmbeddingBag(n_items, width, mode="sum")
        self.encoder_bias = nn.Parameter(torch.zeros(width))
        self.heads = nn.ModuleDict({h: nn.Linear(width, n_items) for h in heads})
        # the encoder initialised as nn.Linear(n_items, width) would be (EmbeddingBag's N(0, 1)
        # summed over hundreds of items saturates the first steps)
        bound = 1.0 / math.sqrt(n_items)
        nn.init.uniform_(self.encoder.weight, -bound, bound)

    def encode(self, items: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        """(B, width) user codes from sparse binary rows."""
        return torch.relu(self.encoder(items, offsets) + self.encoder_bias)

    def forward(self, items: torch.Tensor, offsets: torch.Tensor,
                heads: tuple[str, ...] | None = None, frozen_encoder: bool = False
                ) -> dict[str, torch.Tensor]:
        """Scores of the named heads (default: all), each (B, n_items) float32.

        ``frozen_encoder`` computes the code without autograd (limited fine-tune's phase 2); it is
        an argument of forward, not a separate call, so that DDP sees every step's forward.
        """
        if frozen_encoder:
            with torch.no_grad():
                h = self.encode(items, offsets)
        else:
            h = self.encode(items, offsets)
        return {name: self.heads[name](h) for name in (heads or self.head_names)}

    @torch.no_grad()
    def recommend(self, items: torch.Tensor, offsets: torch.Tensor, head: str, k: int,
                  exclude_seen: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """(scores, item indices), each (B, min(k, n_items)), best first, from ``head``; the
        user's input items are excluded unless ``exclude_seen`` is False."""
        scores = self(items, offsets, (head,))[head]
        if exclude_seen and len(items):
            scores[row_ids(offsets, len(items)), items] = -torch.inf
        top = torch.topk(scores, min(k, self.n_items), dim=1)
        return top.values, top.indices

    def weight_matrices(self) -> list[torch.Tensor]:
        """The matrices L2 regularises (biases are not)."""
        return [self.encoder.weight] + [head.weight for head in self.heads.values()]

    def model_args(self) -> dict:
        return {"n_items": self.n_items, "width": self.width, "heads": list(self.head_names)}


def build_model(name: str, n_items: int, width: int) -> AutoRec:
    return AutoRec(n_items, width, model_spec(name).heads)


def load_weights_only(source, what: str):
    """``torch.load`` of tensors and plain data only (``weights_only=True``): everything this
    project writes (models, checkpoints, optimizer states, progress) loads so. A file whose pickle
    would build other objects, and so could run code when loaded, is refused in one line."""
    try:
        return torch.load(source, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        found = next((ln.strip() for ln in str(e).splitlines() if "GLOBAL" in ln), "")
        raise UsageError(
            f"{what}: refused: it holds Python objects other than tensors and plain data, and "
            f"loading them could run code{f' ({found})' if found else ''}. Only files written by "
            "this project's training load; retrain, or pass a file you trust that holds a plain "
            "dict of tensors") from None


def load_model_file(path: str) -> tuple[AutoRec, str]:
    """(model in eval mode, the head it recommends with) from a run's ``model.pt``."""
    saved = load_weights_only(path, path)
    a = saved["model_args"]
    model = AutoRec(a["n_items"], a["width"], tuple(a["heads"]))
    model.load_state_dict(saved["state_dict"])
    return model.eval(), saved["recommend_head"]
