"""A model's hyperparameters, declared once, in the model's own module.

    class EASE(Recommender):
        hyperparameters = {
            "lam": HP(500.0, LAM_HELP, lo=0, open_lo=True, hi=1e6,
                      search={"paper": PAPER_LAMBDAS, "small": [100.0, 500.0, 2000.0]}),
        }

Everything else is generated from these declarations: ``training/train.py``'s model options (one
flag per name any registered model declares; its help lists each model's default), their range
checks and error messages (``check``, per model: ``--neg-ratio 0`` is CDAE's whole row and an
error for BPR), the set of flags a grid may search, and the named grids (``search``: values per
grid name). A model that declares a new name gets a new flag; nothing outside its module and its
registry line changes.

Models that share a name share the flag, so they share its ``help`` and type (a test checks
it); what the value means for one model (lambda's unit, say) is documented in that model's module.
Run-level flags a model's grids also search (NCE's beta, NS's number of negatives) are the
model's ``run_axes``: values per grid name, checked like any point.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# The paper's grids (its section 4.2; protocol.md), shared by the models' declarations
PAPER_WIDTHS = [50, 100, 200, 500]
PAPER_LAMBDAS = [10.0 ** e for e in range(-7, 5)]
PAPER_BETAS = [0.7, 0.8, 0.9, 1.0, 1.1, 1.2, 1.3]
PAPER_NEGATIVES = [5, 50, 500, 5000, 50000, 500000]
PAPER_CORRUPTION = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]  # rho; 1 would drop every input

# help shared by the models that take the flag (what the value multiplies is each model's own)
WIDTH_HELP = "latent width d: the code, or the user and item factors"
RANK_HELP = "factors kept"
LAM_HELP = ("regularisation strength lambda; what it multiplies is the model's own (see its "
            "module in models/)")
DROPOUT_HELP = "input dropout probability, the corruption of a denoising model"
NEG_RATIO_HELP = "uniform negatives drawn per training positive"


@dataclass(frozen=True)
class HP:
    """One hyperparameter: its default, what it is, the values it may take and those searched."""

    default: Any
    help: str
    type: type | None = None  # the default's type, unless the default is None
    lo: float | None = None
    hi: float | None = None
    open_lo: bool = False  # lo itself refused
    open_hi: bool = False
    choices: tuple | None = None
    why: str = ""  # the range's reason, quoted in its error ("the paper: 50..500")
    search: Mapping[str, Sequence] = field(default_factory=dict)  # grid name -> values
    #: shown beside the model's name where a run is named and tagged (the two-headed models'
    #: mode): a value that changes what the model is, not only how strong
    label: bool = False

    @property
    def kind(self) -> type:
        return self.type or type(self.default)

    def but(self, **changes) -> HP:
        """This declaration with some parts changed (a subclass's other default, say)."""
        return dataclasses.replace(self, **changes)

    def problem(self, value) -> str | None:
        """What is wrong with ``value``, as the end of an error line; None when it is fine."""
        if self.choices is not None:
            return None if value in self.choices else "choose one of " + ", ".join(
                map(str, self.choices))
        numeric = self.kind in (int, float)
        if isinstance(value, bool) or not isinstance(value, (int, float) if self.kind is float
                                                     else self.kind):
            return f"want {'an integer' if self.kind is int else 'a number' if numeric else 'text'}"
        if isinstance(value, float) and not math.isfinite(value):  # passes every comparison
            return "want a finite number"
        low_bad = self.lo is not None and (value <= self.lo if self.open_lo else value < self.lo)
        high_bad = self.hi is not None and (value >= self.hi if self.open_hi else value > self.hi)
        if not (low_bad or high_bad):
            return None
        return f"must be {self.range_text()}" + (f" ({self.why})" if self.why else "")

    def range_text(self) -> str:
        """``in 1..100000``, ``in [0, 1)``, ``>= 1``, ``> 0``."""
        fmt = lambda v: (str(int(v)) if isinstance(v, float) and v.is_integer()
                         else f"{v:g}" if isinstance(v, float) else str(v))
        if self.lo is not None and self.hi is not None:
            if not (self.open_lo or self.open_hi):
                return f"in {fmt(self.lo)}..{fmt(self.hi)}"
            return (f"in {'(' if self.open_lo else '['}{fmt(self.lo)}, {fmt(self.hi)}"
                    f"{')' if self.open_hi else ']'}")
        if self.lo is not None:
            return f"{'>' if self.open_lo else '>='} {fmt(self.lo)}"
        return f"{'<' if self.open_hi else '<='} {fmt(self.hi)}"


@dataclass(frozen=True)
class Option(HP):
    """A run-level training flag a model's training policy reads (``Training.options``,
    models/training.py), declared like a hyperparameter but not a constructor argument: the
    policy reads it from the run's config, and the run records it among its flags. Models that
    declare one name share its flag, default and help (``training.config`` makes one field of
    it and names the models in its help).

    ``refused``: the end of the one-line error when the flag is given to a model (or a
    configuration of it, ``Training.takes_option``) that does not take it; ``{model}`` is the
    model, ``{takers}`` the models that declare the flag. ``resumable``: it changes how the run
    computes, not what it trains, so a resumed run may change it. ``searchable``: a grid may
    search it beside the hyperparameters."""

    refused: str = ""
    resumable: bool = False
    searchable: bool = False


def grid_axes(cls, grid_name: str) -> dict[str, list]:
    """A model class's axes in the named grid: its hyperparameters' ``search`` values, then its
    ``run_axes``."""
    axes = {name: list(hp.search[grid_name]) for name, hp in cls.hyperparameters.items()
            if grid_name in hp.search}
    return {**axes, **{k: list(v) for k, v in cls.run_axes.get(grid_name, {}).items()}}


@dataclass(frozen=True)
class DataShape:
    """What a preset's rule reads of the training data: the warm users, the items and the train
    split's positives (``training.config.data_shape`` reads them from a prepared manifest)."""

    users: int
    items: int
    positives: int

    @property
    def density(self) -> float:
        """The share of the (users x items) matrix that is positive."""
        return self.positives / max(self.users * self.items, 1)


@dataclass(frozen=True)
class Presets:
    """A model's named settings, asked for with ``--preset NAME`` (extensions beyond the paper:
    what fair searches chose, so that a run gets it without a search), and the rule by which
    ``--preset auto`` picks one from the data. A preset's values are flags' values: the model's
    hyperparameters, its training options, and the run's ``lr``, ``batch_size`` and
    ``patience``; a flag given on the command line wins over the preset's value."""

    named: Mapping[str, Mapping[str, Any]]
    choose: Callable[[DataShape], str]  # the name ``auto`` stands for on data of this shape
    rule: str  # ``choose`` in words, for --help and the run's log
