"""The one interface every stage uses: training, Spark scoring, the MLflow pyfunc, validation and
evaluation know a model only through ``Recommender``; nothing outside ``models/`` looks inside one.

A model is a ``torch.nn.Module`` whose state is its ``state_dict`` (tensors only, so every file
loads weights-only) and whose constructor arguments are ``model_args()`` (plain JSON), from which
``models.registry`` rebuilds it by name. Two kinds:

    gradient      ``phases()`` lists the optimisation steps of each training phase; ``forward(batch,
                  step)`` returns that step's named loss terms (what DDP wraps: the trainer sums
                  them, backpropagates, and logs each term); ``step_parameters(step)`` what the
                  step's optimizer trains. Most models have one phase of one step. What else is
                  the model's own in training goes through hooks the loop calls without knowing
                  the model: ``data_statistics`` (facts of the training data its constructor
                  takes), ``configure_training`` (its training flags) and ``between_phases`` (work
                  when a phase ends, e.g. the AutoRec family's ridge start of fine-tune phase 2).
    closed-form   ``fit(train, rstar)`` sets the parameters from the whole training matrix (scipy
                  CSR, users x items) at once, in place of forward.

Both score the same way: ``score(items, offsets)`` -> (B, n_items) float32 from users' input rows in
EmbeddingBag layout (``models.batch``), a user the model never saw included (fold-in).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn

from models.batch import Batch, row_ids, user_slice
from models.topk import top_k
from models.hparams import HP, Option

RSTAR, NEGATIVES = "rstar", "negatives"  # what a model's batches may need beyond the input rows
SCORE_BLOCK_FLOATS = 1 << 22  # scores per block of ``recommend`` on a CPU (16 MiB: measured best)


class Recommender(nn.Module):
    """The interface. Subclasses set the class attributes and implement ``model_args``, ``score``
    and either ``forward`` (gradient) or ``fit`` (closed-form)."""

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
    #: parts of the prepared rows the batches must carry besides the input items (RSTAR, NEGATIVES)
    needs: ClassVar[frozenset[str]] = frozenset()
    #: whether it has parameters per training user (indexed by ``Batch.users``; its constructor
    #: then takes ``n_users``; the vectors are ``users``, scored by ``score_users``). Scoring
    #: never uses them: such a model folds every user in from the input row (models/peruser.py),
    #: so ``score`` stays a function of the row. Validation may (``trained_scores``).
    per_user: ClassVar[bool] = False
    #: Adam's learning rate when ``--lr`` is not given (gradient models)
    learning_rate: ClassVar[float] = 3e-4
    #: users per step when ``--batch-size`` is not given (gradient models)
    batch_size: ClassVar[int] = 128
    #: epochs without a better validation NDCG before early stopping, when ``--patience`` is not
    #: given (gradient models; a model whose validation dips before it climbs needs more)
    patience: ClassVar[int] = 5
    #: loss terms that regularise rather than fit (they may rise while the model learns, e.g. an
    #: annealed KL weight): logged like any term, left out of "the fit improves" checks
    regularisers: ClassVar[frozenset[str]] = frozenset({"l2"})
    #: whether ``recommend`` may score a batch's users in cache-sized blocks (False where scoring
    #: has a per-call cost of its own, e.g. a fold-in's optimiser steps, that blocks would repeat)
    score_in_blocks: ClassVar[bool] = True
    #: run-level training flags it reads (``models.hparams.Option``: default, help, range, the
    #: error for a model that does not take one), the one place each is declared: training's
    #: config makes a field and a flag of each, checks it, and refuses it for other models;
    #: ``configure_training`` applies them
    training_options: ClassVar[dict[str, Option]] = {}

    n_items: int

    @classmethod
    def from_config(cls, n_items: int, hp: dict[str, Any], n_users: int | None = None,
                    data: dict[str, Any] | None = None) -> Recommender:
        """A new model for ``n_items`` items (and ``n_users`` user indices, for a ``per_user``
        model) from hyperparameters (missing ones take defaults; the constructor has none of its
        own, so ``hyperparameters`` is the only copy) and ``data``, its ``data_statistics``."""
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

    @classmethod
    def data_statistics(cls, prep, split: str = "train", config: Any = None) -> dict[str, Any]:
        """Facts of the training data (``prepared.reader.Prepared``'s ``split``: "train", or
        "train,valid" only for runs recorded before 2026-11-27) that the constructor takes beside
        the hyperparameters, e.g. a unit of lambda: read once by the driver, recorded in the run,
        handed to ``from_config`` on every worker. The driver computes them on the split model
        selection trains on (train) also for the final retraining on train+valid, so that a
        hyperparameter validation chose means the same in the final model
        (``training.train.STATISTICS_SPLIT``). ``config``: the run's TrainConfig, for a
        statistic only some settings need (None: none of those). Default: none."""
        return {}

    @classmethod
    def combination_problem(cls, hp: dict[str, Any], options: dict[str, Any]) -> str | None:
        """What is wrong with this combination of hyperparameters ``hp`` (defaults filled in) and
        training options ``options`` (as given, None where not), as one error line naming the
        flags and what to pass instead; None when it is fine. Default: nothing."""
        return None

    @classmethod
    def takes_option(cls, name: str, hp: dict[str, Any]) -> bool:
        """Whether the training option ``name`` applies to this model with hyperparameters ``hp``
        (defaults filled in): a flag that does not is refused with the option's ``refused``.
        Default: every option it declares."""
        return name in cls.training_options

    @classmethod
    def resolved_options(cls, options: dict[str, Any], hp: dict[str, Any], lr: float
                         ) -> dict[str, Any]:
        """The training options (``options``: as given, None for unset) that apply with
        hyperparameters ``hp``, with what None stands for filled in (``lr``: the run's learning
        rate): what the run logs beside the resolved hyperparameters. Default: none."""
        return {}

    @classmethod
    def converges_a_phase(cls, hp: dict[str, Any], options: dict[str, Any]) -> bool:
        """Whether, with hyperparameters ``hp`` (defaults filled in) and training options
        ``options`` (as given), a training phase runs until its loss converges
        (``--pretrain-epochs 0``) rather than for a set number of epochs: the final retraining,
        which has no validation split, then needs the count. Default: no."""
        return False

    @classmethod
    def upgrade_record(cls, config: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
        """A run's recorded configuration (run.json's ``config``) from an older version, brought
        to what this code would record for the same run, before a resume compares it with the
        flags ``given`` (the new configuration, as a dict); raises ``UsageError`` where the old
        run cannot resume as given. Default: as recorded."""
        return config

    @classmethod
    def saved_args(cls, model_args: dict[str, Any]) -> dict[str, Any]:
        """``model_args`` as saved by an older version, brought to what the constructor takes
        now (``models.registry.build``). Default: as saved."""
        return model_args

    @classmethod
    def fit_memory(cls, n_items: int) -> int:
        """Bytes a fit holds at its peak where that is large and known before it starts (a
        dense n_items x n_items state); 0 otherwise. The experiment runs no more such trials at
        once than the machine's memory holds."""
        return 0

    def model_args(self) -> dict[str, Any]:
        """The constructor's keyword arguments, JSON-able: ``type(self)(**model_args())`` rebuilds
        the model (then ``load_state_dict``)."""
        raise NotImplementedError

    # -- gradient models ---------------------------------------------------------------------

    def phases(self) -> list[list[Any]]:
        """The steps of each training phase; a step is whatever ``forward`` and
        ``step_parameters`` accept. Default: one phase of one step over every parameter."""
        return [[None]]

    def step_parameters(self, step: Any) -> list[nn.Parameter]:
        return list(self.parameters())

    def uses_every_parameter(self) -> bool:
        """Whether every step trains every parameter (DDP's find_unused_parameters stays off)."""
        every = set(map(id, self.parameters()))
        return all(set(map(id, self.step_parameters(s))) == every
                   for steps in self.phases() for s in steps)

    def configure_training(self, options: Any) -> None:
        """Apply the training flags in ``training_options`` (``options``: the run's
        TrainConfig). Default: none."""

    def phase_epochs(self, phase: int) -> int:
        """Epochs of ``phase`` when it is not the last, from a training option of the model (0:
        until its loss converges; ``--pretrain-epochs``, when given, overrides). Default: 0."""
        return 0

    def phase_lr(self, phase: int, lr: float) -> float:
        """Adam's learning rate in ``phase`` (0-based) for a run whose learning rate is ``lr``
        (a training option may give a later phase its own). Default: ``lr``."""
        return lr

    def between_phases(self, phase: int, batches: Any, ranks: Any) -> str | None:
        """Called on every rank when ``phase`` (not the last) ends, before the next one's
        optimizers exist. ``batches()`` iterates this rank's training batches (``Batch``, on the
        model's device); ``ranks`` sums (``sum_``) and shares rank 0's value of (``broadcast_``)
        a tensor in place over the ranks. Returns a line for the log when it did something.
        Default: nothing."""
        return None

    def monitor(self, phase: int, terms: dict[str, float]) -> float:
        """The loss whose convergence ends a phase that is not the last (its sum of terms)."""
        return sum(terms.values())

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
        """(B, n_items) float32 scores of every item for users with these input rows."""
        raise NotImplementedError

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
        at or above a per-row threshold instead of a sort of every score."""
        if exclude is None:
            exclude = (items, offsets) if exclude_seen else (items[:0], offsets[:0])
        blocks = self.score_in_blocks or users is not None  # no fold-in: no per-call cost
        per_block = (len(offsets) if not blocks or items.device.type != "cpu"
                     else max(1, SCORE_BLOCK_FLOATS // self.n_items))
        values, indices = [], []
        for lo in range(0, len(offsets), per_block):
            hi = min(lo + per_block, len(offsets))
            block_items, block_offsets = user_slice(items, offsets, lo, hi)
            scores = (self.score(block_items, block_offsets) if users is None
                      else self.trained_scores(users[lo:hi], block_items, block_offsets))
            ex_items, ex_offsets = user_slice(*exclude, lo, hi) if len(exclude[1]) else exclude
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
