"""The one interface every stage uses: training, Spark scoring, the MLflow pyfunc, validation and
evaluation know a model only through ``Recommender``; nothing outside ``models/`` looks inside one.

A model is a ``torch.nn.Module`` whose state is its ``state_dict`` (tensors only, so every file
loads weights-only) and whose constructor arguments are ``model_args()`` (plain JSON), from which
``models.registry`` rebuilds it by name. Two kinds:

    gradient      ``forward(batch, step)`` returns a step's named loss terms (what DDP wraps: the
                  trainer sums them, backpropagates, and logs each term). Which steps there are,
                  in which phases, over which parameters, at which learning rates, is the
                  model's training policy's (``trainer``, ``models.training.Training``): most
                  models take the default, one phase of one step over every parameter.
    closed-form   ``fit(train, rstar)`` sets the parameters from the whole training matrix (scipy
                  CSR, users x items) at once, in place of forward.

Both score the same way: ``score(items, offsets)`` -> (B, n_items) float32 from users' input rows in
EmbeddingBag layout (``models.batch``), a user the model never saw included (fold-in).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn

from models import stream_topk
from models.batch import Batch, row_ids, user_slice
from models.hparams import HP, Presets
from models.product import product, scratch
from models.topk import top_k
from models.training import Training

RSTAR, NEGATIVES = "rstar", "negatives"  # what a model's batches may need beyond the input rows
SCORE_BLOCK_FLOATS = 1 << 22  # scores per block of ``recommend`` on a CPU (16 MiB: measured best)
# the same for a model with ``score_factors``, whose scores go in a reused buffer (64 MiB:
# models.product.scratch says why; 374 users at 44,865 items, a Spark batch of scoring's)
FACTOR_BLOCK_SCORES = 1 << 24


class Recommender(nn.Module):
    """The interface. Subclasses set the class attributes and implement ``model_args``, ``score``
    (or ``score_factors``, whose product is the default ``score``) and either ``forward``
    (gradient) or ``fit`` (closed-form). How a model trains (its phases, defaults, options, data
    statistics) is its ``trainer``'s (``models.training``), not this interface's."""

    #: the name it is registered and selected by (``--model``)
    name: ClassVar[str] = ""
    #: "gradient" or "closed-form"
    kind: ClassVar[str] = "gradient"
    #: where training runs: "ray" (Ray Train, or a Ray task for a closed-form fit) or "spark"
    #: (a closed-form fit on Spark: ``fit`` then takes a DataFrame of (user_index, item_index))
    engine: ClassVar[str] = "ray"
    #: its hyperparameters (``models.hparams.HP``: default, help, range, searched values), the one
    #: place each is declared: train.py's flags, their checks and the named grids come from these
    hyperparameters: ClassVar[dict[str, HP]] = {}
    #: run-level flags its named grids search beside its hyperparameters: {grid: {flag: values}}
    run_axes: ClassVar[dict[str, dict[str, list]]] = {}
    #: named settings a run asks for with ``--preset`` (``models.hparams.Presets``); None: none
    presets: ClassVar[Presets | None] = None
    #: parts of the prepared rows the batches must carry besides the input items (RSTAR, NEGATIVES)
    needs: ClassVar[frozenset[str]] = frozenset()
    #: whether it has parameters per training user (indexed by ``Batch.users``; its constructor
    #: then takes ``n_users``; the vectors are ``users``, scored by ``score_users``). Scoring
    #: never uses them: such a model folds every user in from the input row (models/peruser.py),
    #: so ``score`` stays a function of the row. Validation may (``trained_scores``).
    per_user: ClassVar[bool] = False
    #: whether ``recommend`` may score a batch's users in cache-sized blocks (False where scoring
    #: has a per-call cost of its own, e.g. a fold-in's optimiser steps, that blocks would repeat)
    score_in_blocks: ClassVar[bool] = True
    #: how it trains: the policy the loop builds per run, ``trainer(model, cfg)``, and whose
    #: class the driver asks for defaults, options and data statistics (``models.training``)
    #: (not ``training``: that is nn.Module's train/eval flag)
    trainer: ClassVar[type[Training]] = Training

    n_items: int

    @classmethod
    def from_config(cls, n_items: int, hp: dict[str, Any], n_users: int | None = None,
                    data: dict[str, Any] | None = None) -> Recommender:
        """A new model for ``n_items`` items (and ``n_users`` user indices, for a ``per_user``
        model) from hyperparameters (missing ones take defaults; the constructor has none of its
        own, so ``hyperparameters`` is the only copy) and ``data``, its training policy's
        ``data_statistics``."""
        args = {**{k: hp.get(k, v) for k, v in cls.defaults().items()}, **(data or {})}
        if cls.per_user:
            if not n_users:
                raise ValueError(f"{cls.name} has a vector per user: pass n_users")
            args["n_users"] = n_users
        return cls(n_items=n_items, **args)

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """Each hyperparameter's default."""
        return {name: hp.default for name, hp in cls.hyperparameters.items()}

    def model_args(self) -> dict[str, Any]:
        """The constructor's keyword arguments, JSON-able: ``type(self)(**model_args())`` rebuilds
        the model (then ``load_state_dict``)."""
        raise NotImplementedError

    def forward(self, batch: Batch, step: Any = None) -> dict[str, torch.Tensor]:
        """Named 0-d loss terms of ``step`` on ``batch``; the step minimises their sum."""
        raise NotImplementedError(f"{self.name} is {self.kind}: it has no forward")

    # -- closed-form models ------------------------------------------------------------------

    def fit(self, train, rstar=None, seed: int = 0) -> dict[str, float]:
        """Set the parameters from the users x items training matrix ``train`` (scipy CSR, binary
        float32; ``rstar`` the same pattern with R* values, for models that need RSTAR; for
        ``engine == "spark"``, a Spark DataFrame of (user_index, item_index) pairs). Returns facts
        worth logging (e.g. seconds per part)."""
        raise NotImplementedError(f"{self.name} is {self.kind}: it has no closed-form fit")

    # -- every model -------------------------------------------------------------------------

    def user_codes(self, items: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor | None:
        """(B, d) representations of the users of these rows, for training's diagnostics (the
        codes' effective rank), or None for a model without one."""
        return None

    def score(self, items: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        """(B, n_items) float32 scores of every item for users with these input rows: here the
        product of ``score_factors``, for a model that declares its scores that way."""
        return product(*self.score_factors(items, offsets))

    def score_factors(self, items: torch.Tensor, offsets: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(a, b, bias) with ``score`` = ``models.product.product(a, b, bias)``: a (B, d) per
        user, b (d, n_items) and bias (n_items,) or None per item. Overridden by a model whose
        scores are linear in a user vector; ``recommend`` then scores in larger blocks, into a
        reused buffer."""
        raise NotImplementedError(f"{self.name} implements neither score nor score_factors")

    def trained_scores(self, users: torch.Tensor, items: torch.Tensor, offsets: torch.Tensor
                       ) -> torch.Tensor:
        """(B, n_items) scores of training users (indices ``users``) from their trained vectors
        instead of a fold-in: validation's cheap way for a ``per_user`` model (``--valid-by
        trained``); the input rows still feed what else the model reads (CDAE's encoder)."""
        if not self.per_user:
            raise NotImplementedError(f"{self.name} has no trained user vectors")
        return self.score_users(self.users(users), items, offsets)

    @torch.no_grad()
    def recommend(self, items: torch.Tensor, offsets: torch.Tensor, k: int,
                  exclude_seen: bool = True, exclude: tuple[torch.Tensor, torch.Tensor] | None = None,
                  users: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(scores, item indices), each (B, min(k, n_items)), best first. Left out: the rows
        ``exclude`` = (items, offsets) when given (e.g. scoring's exclusion columns), else the
        user's input items unless ``exclude_seen`` is False; a user with fewer than k candidates
        gets -inf scores in the tail. ``users`` (B,): scored by ``trained_scores``, not ``score``.

        On a CPU the users go in blocks whose scores stay near the cache (SCORE_BLOCK_FLOATS), so
        the masking and the top-k read what the product just wrote instead of a (B, n_items)
        matrix from memory: 1.45x on the product plus top-k at the Yahoo shape
        (benchmarks/results/validation_speed.md). Per-row results do not depend on the blocks.
        The top-k is ``models.topk.top_k``: torch.topk's answer, ties included, from the scores
        at or above a per-row threshold instead of a sort of every score. A model with
        ``score_factors`` computes its scores in blocks of FACTOR_BLOCK_SCORES into a buffer
        reused from block to block and call to call (``models.product.scratch``), and on a large
        catalogue ranks them as it computes them, a cache-sized tile at a time
        (``models.stream_topk``: the same lists)."""
        if exclude is None:
            exclude = (items, offsets) if exclude_seen else (items[:0], offsets[:0])
        blocks = self.score_in_blocks or users is not None  # no fold-in: no per-call cost
        factored = (users is None and items.device.type == "cpu"
                    and type(self).score_factors is not Recommender.score_factors)
        block_scores = FACTOR_BLOCK_SCORES if factored else SCORE_BLOCK_FLOATS
        per_block = (len(offsets) if not blocks or items.device.type != "cpu"
                     else max(1, block_scores // self.n_items))
        values, indices = [], []
        for lo in range(0, len(offsets), per_block):
            hi = min(lo + per_block, len(offsets))
            block_items, block_offsets = user_slice(items, offsets, lo, hi)
            ex_items, ex_offsets = user_slice(*exclude, lo, hi) if len(exclude[1]) else exclude
            if factored:
                a, b, bias = self.score_factors(block_items, block_offsets)
                if stream_topk.applies(a, b, min(k, self.n_items)):  # product and top-k fused
                    top = stream_topk.top_k(a, b, bias, (ex_items, ex_offsets), min(k, self.n_items))
                    values.append(top[0])
                    indices.append(top[1])
                    continue
                # the same product as ``score``'s, into this thread's reused buffer
                scores = product(a, b, bias, out=scratch(hi - lo, self.n_items))
            else:
                scores = (self.score(block_items, block_offsets) if users is None
                          else self.trained_scores(users[lo:hi], block_items, block_offsets))
            if len(ex_items):
                scores[row_ids(ex_offsets, len(ex_items)), ex_items] = -torch.inf
            top = top_k(scores, min(k, self.n_items))
            values.append(top.values)
            indices.append(top.indices)
        if not values:
            empty = torch.empty(0, min(k, self.n_items), device=items.device)
            return empty, empty.long()
        return torch.cat(values), torch.cat(indices)

    def describe(self) -> str:
        """One line for logs: the name and its arguments."""
        args = ", ".join(f"{k} {v}" for k, v in self.model_args().items() if k != "n_items")
        return f"{self.name} ({args})"
