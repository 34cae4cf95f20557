"""How a model trains, beside the model rather than inside its interface.

``Recommender`` holds what scoring, serving and the registry need; a family that trains in its own
way declares a ``Training`` subclass next to its model (``models/autorec/training.py``) and names it
in the model's ``trainer`` attribute. The generic loop (``training/loop.py``) builds one per run,
``type(model).trainer(model, cfg)``, and asks it for the phases, their optimisers' parameters,
learning rates and lengths, the work between phases and the loss that ends a phase; the driver
(``training/train.py``, ``training/config.py``) asks its class for the defaults, the data
statistics, the training options and their checks. Neither knows any family by name.

The default is what most models need: one phase of one step over every parameter, with the
class's learning rate, batch size and patience (``tuned`` sets other ones in one line).
"""

from __future__ import annotations

from typing import Any, ClassVar

from torch import nn

from models.hparams import Option

#: what any run whose validation says it is unhealthy may try (``Training.remedy``)
RETUNE = "another --lr"


class Training:
    """One run's training policy for ``model`` (``options``: the run's TrainConfig, whose fields
    include every declared option; None: each option's default)."""

    #: Adam's learning rate when ``--lr`` is not given
    learning_rate: ClassVar[float] = 3e-4
    #: users per step when ``--batch-size`` is not given
    batch_size: ClassVar[int] = 128
    #: epochs without a better validation NDCG before early stopping, when ``--patience`` is not
    #: given (a model whose validation dips before it climbs needs more)
    patience: ClassVar[int] = 5
    #: loss terms that regularise rather than fit (they may rise while the model learns, e.g. an
    #: annealed KL weight): logged like any term, left out of "the fit improves" checks
    regularisers: ClassVar[frozenset[str]] = frozenset({"l2"})
    #: run-level training flags it reads (``models.hparams.Option``: default, help, range, the
    #: error for a model that does not take one), the one place each is declared: training's
    #: config makes a field and a flag of each, checks it, and refuses it for other models
    options: ClassVar[dict[str, Option]] = {}

    def __init__(self, model: nn.Module, options: Any = None):
        self.model = model

    def prepare(self, popularity: Any) -> None:
        """What the policy takes from the training data before the first step: ``popularity``,
        the (n_items,) training positives per item of the train split (also in the final
        retraining, as ``data_statistics``; None where the caller has none). Default: nothing."""

    @classmethod
    def tuned(cls, **defaults) -> type[Training]:
        """This policy with other class defaults (``learning_rate``, ``patience``, ...): a model
        that trains the default way at its own pace says so in one line."""
        unknown = set(defaults) - {"learning_rate", "batch_size", "patience", "regularisers"}
        if unknown:
            raise TypeError(f"Training.tuned: no default named {', '.join(sorted(unknown))}")
        return type(cls.__name__, (cls,), {"__module__": cls.__module__, **defaults})

    # -- the driver's questions, before a model exists --------------------------------------------

    @classmethod
    def data_statistics(cls, prep, split: str = "train", config: Any = None) -> dict[str, Any]:
        """Facts of the training data (``prepared.reader.Prepared``'s ``split``) that the model's
        constructor takes beside its hyperparameters, e.g. a unit of lambda: read once by the
        driver, recorded in the run, handed to ``from_config`` on every worker. The driver asks
        for the split model selection trains on (train) also in the final retraining on
        train+valid, so that a hyperparameter validation chose means the same in the final model
        (``training.train.STATISTICS_SPLIT``). ``config``: the run's TrainConfig, for a statistic
        only some settings need (None: none of those). Default: none."""
        return {}

    @classmethod
    def combination_problem(cls, hp: dict[str, Any], options: dict[str, Any]) -> str | None:
        """What is wrong with this combination of hyperparameters ``hp`` (defaults filled in) and
        training options ``options`` (as given, None where not), as one error line naming the
        flags and what to pass instead; None when it is fine. Default: nothing."""
        return None

    @classmethod
    def takes_option(cls, name: str, hp: dict[str, Any]) -> bool:
        """Whether the training option ``name`` applies with hyperparameters ``hp`` (defaults
        filled in): a flag that does not is refused with the option's ``refused``."""
        return name in cls.options

    @classmethod
    def resolved_options(cls, options: dict[str, Any], hp: dict[str, Any], lr: float
                         ) -> dict[str, Any]:
        """The training options (as given, None for unset) that apply with hyperparameters
        ``hp``, with what None stands for filled in (``lr``: the run's learning rate): what the
        run logs beside the resolved hyperparameters. Default: none."""
        return {}

    @classmethod
    def converges_a_phase(cls, hp: dict[str, Any], options: dict[str, Any]) -> bool:
        """Whether a phase runs until its loss converges (``--pretrain-epochs 0``) rather than
        for a set number of epochs: the final retraining, which has no validation split, then
        needs the count. Default: no."""
        return False

    @classmethod
    def starts_from_data(cls, options: Any) -> bool:
        """Whether a run with ``options`` (its TrainConfig) starts from weights computed from the
        training matrices (``start``) rather than from its random initialisation: the driver
        then builds the model, calls ``start`` once and hands the weights to every worker, and
        the loop validates them before the first epoch (epoch 0, a candidate for the best).
        Default: no."""
        return False

    @classmethod
    def fit_memory(cls, n_items: int) -> int:
        """Bytes a closed-form fit holds at its peak where that is large and known before it
        starts (a dense n_items x n_items state); 0 otherwise. The experiment runs no more such
        trials at once than the machine's memory holds."""
        return 0

    @classmethod
    def remedy(cls, hp: dict[str, Any], searched: list[str]) -> str:
        """What a run whose validation says it is unhealthy should try next, with
        hyperparameters ``hp`` (defaults filled in); ``searched``: its hyperparameters a grid
        searches, as flags."""
        flags = ["--lr", *searched]
        return "try another " + (", ".join(flags[:-1]) + " or " + flags[-1] if len(flags) > 1
                                 else flags[0])

    @classmethod
    def divergence_hint(cls, hp: dict[str, Any]) -> str:
        """What to change, besides a lower ``--lr``, after the loss became NaN or infinite."""
        return f"raise --lam (now {hp['lam']})" if "lam" in hp else "check the data"

    # -- the loop's questions, on every rank -------------------------------------------------------

    def start(self, train, rstar, seed: int) -> str | None:
        """Set the model's weights from the binary training rows ``train`` (users x items, scipy
        CSR) and their R* values ``rstar`` (None unless the model needs R*), when
        ``starts_from_data``; returns a line for the log. Default: nothing."""
        return None

    def phases(self) -> list[list[Any]]:
        """The steps of each training phase; a step is whatever the model's ``forward`` and
        ``step_parameters`` accept. Default: one phase of one step over every parameter."""
        return [[None]]

    def step_parameters(self, step: Any) -> list[nn.Parameter]:
        """What the optimizer of ``step`` trains."""
        return list(self.model.parameters())

    def uses_every_parameter(self) -> bool:
        """Whether every step trains every parameter (DDP's find_unused_parameters stays off)."""
        every = set(map(id, self.model.parameters()))
        return all(set(map(id, self.step_parameters(s))) == every
                   for steps in self.phases() for s in steps)

    def phase_epochs(self, phase: int) -> int:
        """Epochs of ``phase`` when it is not the last (0: until its loss converges;
        ``--pretrain-epochs``, when given, overrides). Default: 0."""
        return 0

    def phase_lr(self, phase: int, lr: float) -> float:
        """Adam's learning rate in ``phase`` (0-based) for a run whose learning rate is ``lr``.
        Default: ``lr``."""
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

    def state_dict(self) -> dict[str, Any]:
        """What of the policy a checkpoint keeps (plain data: a schedule's position). Default:
        nothing."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Back from a checkpoint's ``state_dict``."""
