"""The AutoRec family of the paper (protocol.md, "Models"): one encoder and named linear heads.

Input is a batch of users' binary training rows in sparse form (``models.batch``): the encoder
computes ``h = ReLU(W_e r + b_e)`` as a sum of W_e's columns for the user's items, so the
(B, n_items) input is never formed. Each head is linear with bias and identity output, ``W h + b``.

    autorec       encoder + predict head (MSE against r)
    ohns-autorec  encoder + ns head (negative sampling); it also recommends with that head
    ns-autorec    encoder + ns head + predict head; recommends with the predict head
    nce-autorec   encoder + nce head (MSE against R*) + predict head; recommends with predict

Modes of the two-headed models (protocol.md, "Modes"), as this model's phases of steps:

    joint             one optimizer, loss = embedding-head loss + MSE loss
    alternating       per batch: a step on the embedding head's loss (encoder + that head),
                      then a step on the MSE loss (encoder + predict head)
    limited-finetune  phase 1: encoder + embedding head on its loss until it converges;
                      phase 2: predict head alone on MSE, the encoder frozen
    full-finetune     phase 1 as above; phase 2: encoder + predict head on MSE

Phase 2 may start from the exact minimiser of its loss on phase 1's encoder (``between_phases``,
the hook training calls when a phase ends, with ``--finetune-init ridge``; ``models.autorec.ridge``):
a ridge regression per item, where Adam from the untrained head needs hundreds of epochs
(deviation from the paper, which starts phase 2's head untrained; ``--finetune-init as-is`` does
that).

Extensions beyond the paper (issue 32), each off by default, where the paper's model is unchanged
loss for loss (tests/test_losses.py), each in the fast loss and its dense reference alike:

    pos_weight   confidence on positives: each positive's squared error in the predict and NCE
                 heads weighs 1 + alpha (WRMF's confidence 1 + alpha r, Hu, Koren & Volinsky
                 2008; the weighted loss of CDAE-style models); an O(nnz d) term of the fast
                 loss (models/autorec/losses.py). Not OHNS-AutoRec (no MSE head). With the
                 fine-tune modes phase 2 starts as-is: the ridge start solves the unweighted
                 normal equations (``combination_problem``).
    dropout      input dropout (denoising, as CDAE, Wu et al. 2016, and Mult-VAE, Liang et al.
                 2018): while training, each input entry dropped with probability p and the kept
                 ones scaled 1 / (1 - p); the target is the uncorrupted row; none in eval mode or
                 when scoring. The ridge start uses the clean codes.
    nce_scale    the NCE head's scale (NCE-AutoRec): "rms" divides R* by its root mean square on
                 the training positives, "head-weight" weights the NCE loss by 1 / mean(R*^2);
                 "none" is the paper. mean(R*^2) (``rstar_mean_square``) is a data statistic at
                 the run's beta, on the train split, recorded with the model like omega. Why:
                 R*'s mean square on positives is 14-43 on the shared sets, so the NCE loss
                 outweighs the MSE head's and sets the encoder's regularisation.
    phase 1      fine-tune phase 1's length and learning rate as training options
                 (``--finetune-phase1-epochs``, 0: until its loss converges, the rule before;
                 ``--finetune-phase1-lr``), searchable.

Training need not form the (B, n_items) scores: each head's loss is computed exactly from the code
and the head's parameters (``models.autorec.losses.linear_mse`` for the predict and NCE heads: O(n d^2 +
nnz d) a batch instead of O(B n d)) where that is cheaper (``dense_for``); else, and as the
reference, through the dense scores (same values and gradients up to rounding).
Scoring is dense: a recommendation ranks every item.

Loss and L2 units (protocol.md, "L2"; ``lam_units``). Every head's loss is a mean over the
batch's (user, item) entries: the MSE heads' squared errors, and the NS head's per-user sum (the
paper's form) divided by n_items, so that in NS-AutoRec the two heads weigh as in the paper's sum
over users. The L2 term, over the matrices a step trains (biases are not regularised), is

    lam * omega * sum over matrices of mean(W^2)        (lam_units "overlap", the default)

with omega = ``prepared.protocol.user_overlap`` of the training data: sum_i c_i^2 / U^2, the mean
number of training items two users share. In the paper's form (loss summed over users,
lambda_paper ||W||_F^2) that is lambda_paper = lam * omega * U / d per matrix (U training users,
d the width). omega makes one lam mean about the same on every dataset: the L2 weighs against the
spectrum of the user Gram R R', whose leading eigenvalue is about U * omega; measured, the best
lambda on mean(W^2) alone moved by 100x between ml-100k and citeulike-a
(benchmarks/results/tune_defaults.md). ``lam_units="plain"`` is the form before 2026-11-25,
lam * mean(W^2) against the NS head's loss per user, which runs recorded then keep.

omega is computed on the split model selection trains on (train), also for the final retraining
on train+valid (``data_statistics``; ``training.train.STATISTICS_SPLIT``), and recorded in the
run (MLflow params ``overlap`` and ``data_statistics_split``; run.json's ``data_statistics``):
train+valid's omega is larger (about 1.9x on citeulike-a), so recomputing it would give the final
model a stronger L2 than the lambda validation chose. The model file records its own omega
(``model_args``), so a trained model scores as it trained; runs recorded before this rule
(2026-11-27) resume with the omega of the splits they trained on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch
from torch import nn

from models.autorec import ridge
from models.autorec.losses import linear_mse, linear_ns, mse_loss, ns_loss
from models.base import NEGATIVES, RSTAR, Recommender
from models.batch import Batch
from models.hparams import (DROPOUT_HELP, HP, LAM_HELP, PAPER_BETAS, PAPER_LAMBDAS,
                            PAPER_NEGATIVES, PAPER_WIDTHS, WIDTH_HELP, Option)
from models.losses import l2_penalty
from prepared.errors import UsageError

MODES = ("joint", "alternating", "limited-finetune", "full-finetune")
FINETUNE_MODES = ("limited-finetune", "full-finetune")  # the modes with a phase 2
LAM_UNITS = ("overlap", "plain")
FINETUNE_INITS = ("ridge", "as-is")
LOSS_PATHS = ("auto", "fast", "dense")
NCE_SCALES = ("none", "rms", "head-weight")

# The named grids. "small" (the default: 45 trials over every model) searches joint mode only:
# on ml-100k a joint trial takes about 1.5 minutes on 2 cores, a fine-tune one several times that
# (phase 1 runs until its loss converges, 135-200 epochs), so the modes are searched by --grid
# paper or a grid file. lambda (overlap units) a decade around each model's default: best values
# lay within 1-10 for the one-headed models and 3-30 for the two-headed on four datasets
# (benchmarks/results/tune_defaults.md). The paper's 1e-7..1e4 was on ||W||_F^2; in overlap
# units the same numbers mean other things (protocol.md).
ONE_HEAD_LAMBDAS, TWO_HEAD_LAMBDAS = [1.0, 3.0, 10.0], [3.0, 10.0, 30.0]

WIDTH = HP(200, WIDTH_HELP, lo=1, hi=100_000, why="the paper: 50..500",
           search={"paper": PAPER_WIDTHS})
LAM = HP(3.0, LAM_HELP, lo=0, hi=1e6, open_hi=True,
         search={"paper": PAPER_LAMBDAS, "small": ONE_HEAD_LAMBDAS})
LAM_UNITS_HP = HP("overlap", "the AutoRec family's lambda: overlap = times omega, the mean number "
                  "of training items two users share, so that one value transfers across "
                  "datasets, with every head's loss per (user, item) entry; plain = lambda * "
                  "mean(W^2) with the NS head's loss per user (runs before 2026-11-25)",
                  choices=LAM_UNITS)
# The levers beyond the paper (issue 32; the module docstring gives each one's source), each off
# by default: the paper's model
POS_WEIGHT = HP(0.0, "confidence on positives: each positive's squared error weighs 1 + "
                "pos_weight in the predict and NCE heads (WRMF's alpha; 0 = the paper's "
                "unweighted MSE)", lo=0, hi=1e6)
DROPOUT = HP(0.0, DROPOUT_HELP, lo=0, hi=1, open_hi=True)  # --dropout, shared with CDAE and VAE
NCE_SCALE = HP("none", "the NCE head's scale: none = R* as the paper; rms = R* divided by its "
               "root mean square on the training positives; head-weight = the NCE loss "
               "weighted by 1 / mean(R*^2) on them", choices=NCE_SCALES)
# the flags the levers added (2026-11-27): absent from the runs recorded before, which ran without
LEVER_FLAGS = ("pos_weight", "dropout", "nce_scale", "finetune_phase1_epochs", "finetune_phase1_lr")
# The family's run-level training flags (``training_options``: training/train.py makes a flag of
# each and refuses it for other models with ``refused``)
PHASE_2_ONLY = ("sets phase 2 of --mode limited-finetune or full-finetune; other modes have one "
                "phase. Drop the flag or pass such a mode")
PHASE_1_ONLY = ("sets phase 1 of --mode limited-finetune or full-finetune; other modes have one "
                "phase. Drop the flag or pass such a mode")
LOSS_PATH = {
    "loss_path": Option("auto", "the AutoRec family's losses: fast = the exact expansion without "
                        "the (batch, items) scores; dense = through the scores (the reference, "
                        "same values and gradients); auto = the cheaper per head and batch size",
                        choices=LOSS_PATHS, resumable=True,
                        refused="{model} has one way to compute its loss; only {takers} have a "
                                "fast and a dense one. Drop the flag"),
}
FINETUNE = {  # the two-headed models' (their modes with a phase 2)
    "finetune_lr": Option(None, "Adam learning rate of fine-tune phase 2 (default: --lr's)",
                          type=float, lo=0, open_lo=True, hi=1, why="a learning rate",
                          refused=PHASE_2_ONLY, searchable=True),
    "finetune_init": Option(None, "where fine-tune phase 2's predict head starts: ridge "
                            "(default) = the exact minimiser of its loss on phase 1's encoder "
                            "(one pass over the data; limited fine-tune then starts at its "
                            "optimum), as-is = as phase 1 left it, untrained (the paper's "
                            "procedure); with --pos-weight > 0 only as-is (the default then): "
                            "the ridge start solves the unweighted normal equations",
                            type=str, choices=FINETUNE_INITS, refused=PHASE_2_ONLY),
    # phase 1's length and learning rate, searchable (extension beyond the paper, which trains
    # the embedding first to convergence; issue 32: the paper says a good embedding first
    # matters most on small data, so its length is chosen on validation like any setting)
    "finetune_phase1_epochs": Option(None, "fine-tune phase 1's epochs; 0 (the default) = "
                                     "until its loss converges (--pretrain-epochs, when given, "
                                     "overrides: the "
                                     "final retraining passes the selection run's count)",
                                     type=int, lo=0, hi=100_000, refused=PHASE_1_ONLY,
                                     searchable=True),
    "finetune_phase1_lr": Option(None, "Adam learning rate of fine-tune phase 1 (default: --lr's)",
                                 type=float, lo=0, open_lo=True, hi=1, why="a learning rate",
                                 refused=PHASE_1_ONLY, searchable=True),
}
TWO_HEADED = {  # what NS- and NCE-AutoRec share beyond AutoRec's (lam: its default and grids)
    "lam": LAM.but(default=10.0, search={"paper": PAPER_LAMBDAS, "small": TWO_HEAD_LAMBDAS}),
    "mode": HP("joint", "how the two heads train", choices=MODES, search={"paper": list(MODES)}),
    "embed_weight": HP(1.0, "weight of the embedding head's loss (nce or ns) against the MSE "
                       "head's (1: the paper's sum; matters in joint mode: Adam is blind to a "
                       "step's overall scale)", lo=0, hi=1e6),
    "embed_lam": HP(None, "L2 of the embedding head's matrix (default: --lam)", type=float, lo=0,
                    hi=1e6, open_hi=True),
}


@dataclass(frozen=True)
class Step:
    """Heads whose losses are summed, and whether the encoder is trained by this step."""

    heads: tuple[str, ...]
    train_encoder: bool = True


class AutoRec(Recommender):
    """Encoder (n_items -> width, ReLU) and one linear head (width -> n_items) per name in
    ``heads``; the subclasses below fix the heads."""

    name = "autorec"
    heads_trained: ClassVar[tuple[str, ...]] = ("predict",)
    embed_head: ClassVar[str | None] = None   # the de-popularising head (nce | ns), if any
    recommend_head: ClassVar[str] = "predict"
    #: lambda in overlap units (see above): 3 for AutoRec, 2 for OHNS-AutoRec (it collapses from
    #: 10 on), 10 for the two-headed models, whose encoder fits two heads' losses
    #: (benchmarks/results/tune_defaults.md: on four datasets each within 90% of its own tuned NDCG)
    hyperparameters = {"width": WIDTH, "lam": LAM, "lam_units": LAM_UNITS_HP, "dropout": DROPOUT,
                       "pos_weight": POS_WEIGHT}
    #: Adam's rate and users per step without --lr / --batch-size (issue 32): batch 512 at lr
    #: 1e-3 kept 0.97-1.02 of the validation NDCG of batch 128 at 3e-4 (the defaults before) on
    #: ml-100k, ml-latest-small and citeulike-a, mostly in fewer seconds (the loss is exact at
    #: any batch; each step pays Adam over the n x d matrices); larger steps were not safe on
    #: the sparse set: lr 3e-3 at batch 1024 lost 19% on citeulike-a, and lr 1e-2 at 2048 killed
    #: every ReLU of the code there (effective rank 0 from epoch 6: popularity's NDCG)
    #: (benchmarks/results/batch_defaults.md, collapse.md). OHNS-AutoRec keeps its own.
    learning_rate = 1e-3
    batch_size = 512
    #: train each head through the dense (B, n_items) scores (True) or its exact fast loss
    #: (False); None: whichever is cheaper. For the predict and NCE heads the dense way costs
    #: about 3 B n d (product and two gradients), the fast one about 2 n d^2 (W'W and its
    #: gradient): fast from B >= 2d/3 on (NCE-AutoRec's step at batch 4096: 12.8x at the Yahoo
    #: shape). The NS head stays dense: scoring its positives and N negatives per user gathers
    #: (nnz + N) x d per batch in each direction, which measured 0.5-2.2x of the dense product on
    #: a CPU, slower for OHNS-AutoRec at every batch size (benchmarks/results/loss_speed.md).
    #: The model and its gradients are the same either way.
    dense_loss: bool | None = None
    #: whether fine-tune phase 2 starts from the exact predict head (``--finetune-init ridge``,
    #: the default) or from phase 1's untrained one (``as-is``: the paper's way)
    start_from_ridge: bool = True
    training_options = LOSS_PATH
    #: fine-tune phase 2's own learning rate (``--finetune-lr``; None: the run's)
    finetune_lr: float | None = None
    #: fine-tune phase 1's learning rate and epochs (``--finetune-phase1-lr``, None: the run's;
    #: ``--finetune-phase1-epochs``, 0: until its loss converges)
    phase1_lr: float | None = None
    phase1_epochs: int = 0

    def __init__(self, n_items: int, width: int, lam: float, mode: str | None = None,
                 embed_weight: float = 1.0, embed_lam: float | None = None,
                 lam_units: str = "plain", overlap: float | None = None,
                 pos_weight: float = 0.0, dropout: float = 0.0, nce_scale: str = "none",
                 rstar_mean_square: float | None = None):
        super().__init__()
        if pos_weight < 0 or (pos_weight and "predict" not in self.heads_trained):
            raise ValueError(f"{self.name}: pos_weight weighs the MSE heads' positives: it must "
                             f"be >= 0, and 0 without a predict head; got {pos_weight}")
        if not 0 <= dropout < 1:
            raise ValueError(f"need 0 <= dropout < 1; got {dropout}")
        if nce_scale not in NCE_SCALES or (nce_scale != "none" and "nce" not in self.heads_trained):
            raise ValueError(f"{self.name}: nce_scale {nce_scale!r}: choose one of "
                             f"{', '.join(NCE_SCALES)}, and none without an NCE head")
        if nce_scale != "none" and not (rstar_mean_square and rstar_mean_square > 0):
            raise ValueError(f"nce_scale {nce_scale!r} needs the mean square of R* on the "
                             "training positives > 0 (NCEAutoRec.data_statistics with the run's "
                             f"config); got {rstar_mean_square!r}")
        self.pos_weight, self.dropout, self.nce_scale = float(pos_weight), float(dropout), nce_scale
        self.rstar_mean_square = None if nce_scale == "none" else float(rstar_mean_square)
        # the NCE head's target R* times rstar_unit, and its loss times nce_weight
        self.rstar_unit = (1.0 / math.sqrt(self.rstar_mean_square) if nce_scale == "rms"
                           else 1.0)
        self.nce_weight = 1.0 / self.rstar_mean_square if nce_scale == "head-weight" else 1.0
        if n_items < 1 or width < 1:
            raise ValueError(f"need n_items >= 1 and width >= 1; got {n_items}, {width}")
        if lam_units not in LAM_UNITS:
            raise ValueError(f"unknown lam_units {lam_units!r}; choose one of {', '.join(LAM_UNITS)}")
        if lam_units == "overlap" and not (overlap and overlap > 0):
            raise ValueError("lam_units 'overlap' needs the training data's user overlap > 0 "
                             f"(prepared.protocol.user_overlap); got {overlap!r}")
        self.lam_units = lam_units
        self.overlap = float(overlap) if lam_units == "overlap" else None
        # what lam and embed_lam multiply, and what the NS head's per-user loss is divided by
        self.lam_scale = self.overlap if lam_units == "overlap" else 1.0
        self.ns_scale = 1.0 / n_items if lam_units == "overlap" else 1.0
        two_headed = len(self.heads_trained) > 1
        if mode is not None and not two_headed:
            raise ValueError(f"{self.name} has one head, so it has no mode; modes apply to the "
                             "two-headed models (ns-autorec, nce-autorec)")
        if two_headed and (mode or "joint") not in MODES:
            raise ValueError(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}")
        self.n_items, self.width, self.lam = n_items, width, float(lam)
        self.mode = (mode or "joint") if two_headed else None
        # the levers the paper leaves implicit (two-headed models): the embedding head's loss
        # weight, and its own L2 (None: lam)
        self.embed_weight = float(embed_weight)
        self.embed_lam = None if embed_lam is None else float(embed_lam)
        self.encoder = nn.EmbeddingBag(n_items, width, mode="sum")
        self.encoder_bias = nn.Parameter(torch.zeros(width))
        self.heads = nn.ModuleDict({h: nn.Linear(width, n_items) for h in self.heads_trained})
        # the encoder initialised as nn.Linear(n_items, width) would be (EmbeddingBag's N(0, 1)
        # summed over hundreds of items saturates the first steps)
        bound = 1.0 / math.sqrt(n_items)
        nn.init.uniform_(self.encoder.weight, -bound, bound)

    @classmethod
    def data_statistics(cls, prep, split: str = "train", config=None) -> dict:
        """omega, the unit of lambda (``lam_units`` "overlap"), of ``split``'s rows: the train
        split's also in the final retraining (the module's docstring says why)."""
        return {"overlap": prep.user_overlap(split == "train,valid")}

    @classmethod
    def combination_problem(cls, hp: dict, options: dict) -> str | None:
        """A confidence weight with the ridge start of fine-tune phase 2: the start solves the
        unweighted normal equations (one (d+1)^2 system for every item); the weighted ones
        differ per item (WRMF's), which ``ridge`` does not solve."""
        if hp.get("pos_weight") and hp.get("mode") in FINETUNE_MODES \
                and options.get("finetune_init") == "ridge":
            return (f"--finetune-init ridge with --pos-weight {hp['pos_weight']:g}: the ridge "
                    "start solves the unweighted loss, not the weighted one; pass "
                    "--finetune-init as-is (the default with --pos-weight) or --pos-weight 0")
        return None

    @classmethod
    def default_finetune_init(cls, hp: dict) -> str:
        """ridge, or as-is with a confidence weight (``combination_problem``)."""
        return "as-is" if hp.get("pos_weight") else "ridge"

    @classmethod
    def takes_option(cls, name: str, hp: dict) -> bool:
        """The fine-tune flags only in the modes with a phase 2."""
        return name in cls.training_options and (not name.startswith("finetune_")
                                                 or hp.get("mode") in FINETUNE_MODES)

    @classmethod
    def resolved_options(cls, options: dict, hp: dict, lr: float) -> dict:
        """In the fine-tune modes, phase 2's learning rate and start as the run uses them."""
        if hp.get("mode") not in FINETUNE_MODES:
            return {}
        given = lambda name: options.get(name)
        return {"finetune_lr": lr if given("finetune_lr") is None else given("finetune_lr"),
                "finetune_init": given("finetune_init") or cls.default_finetune_init(hp),
                "finetune_phase1_lr": (lr if given("finetune_phase1_lr") is None
                                       else given("finetune_phase1_lr")),
                "finetune_phase1_epochs": given("finetune_phase1_epochs") or 0}

    @classmethod
    def converges_a_phase(cls, hp: dict, options: dict) -> bool:
        """The fine-tune modes' phase 1 runs until its loss converges (``--pretrain-epochs 0``),
        unless ``--finetune-phase1-epochs`` sets its length."""
        return hp.get("mode") in FINETUNE_MODES and not options.get("finetune_phase1_epochs")

    @classmethod
    def upgrade_record(cls, config: dict, given: dict) -> dict:
        """A run recorded before the levers (2026-11-27, issue 32) trained with each off: their
        flags as not given. A run recorded before lambda had units (2026-11-25: no
        ``lam_units``; its lambda multiplies mean(W^2) alone) resumes only as it was, with
        --lam-units plain."""
        config = {**dict.fromkeys(LEVER_FLAGS), **config}
        if "lam_units" in config:
            return config
        if given.get("lam_units") != "plain":
            raise UsageError(
                f"run {given.get('run_name')!r} in {given.get('output')} was recorded before "
                "lambda's units changed (2026-11-25; its lambda multiplies mean(W^2) alone): pass "
                "--lam-units plain to resume it as it was, or another --run-name for a new run")
        return {**config, "lam_units": "plain"}

    @classmethod
    def saved_args(cls, model_args: dict) -> dict:
        if "lam_units" not in model_args:  # saved before lambda had units (2026-11-25)
            return {**model_args, "lam_units": "plain"}  # as it trained
        return model_args

    def configure_training(self, options) -> None:
        """``--loss-path`` (auto leaves ``dense_loss`` to the batch size), ``--finetune-init``,
        ``--finetune-lr`` and phase 1's ``--finetune-phase1-lr`` and ``-epochs``."""
        if options.loss_path != "auto":
            self.dense_loss = options.loss_path == "dense"
        init = options.finetune_init or self.default_finetune_init({"pos_weight": self.pos_weight})
        self.start_from_ridge = init == "ridge"
        self.finetune_lr = options.finetune_lr
        self.phase1_lr = getattr(options, "finetune_phase1_lr", None)
        self.phase1_epochs = getattr(options, "finetune_phase1_epochs", 0) or 0

    def phase_lr(self, phase: int, lr: float) -> float:
        """Fine-tune phase 2 may have its own (``--finetune-lr``), and so may phase 1
        (``--finetune-phase1-lr``)."""
        own = self.finetune_lr if phase > 0 else self.phase1_lr if self.mode in FINETUNE_MODES \
            else None
        return own if own is not None else lr

    def phase_epochs(self, phase: int) -> int:
        """Fine-tune phase 1's ``--finetune-phase1-epochs`` (0: until its loss converges)."""
        return self.phase1_epochs if phase == 0 and self.mode in FINETUNE_MODES else 0

    def model_args(self) -> dict:
        args = {"n_items": self.n_items, "width": self.width, "lam": self.lam}
        if self.lam_units != "plain":  # absent: a model saved before the units existed
            args.update(lam_units=self.lam_units, overlap=self.overlap)
        # the levers only where on (absent: off, as in a model saved before they existed)
        args.update({k: v for k, v in (("pos_weight", self.pos_weight), ("dropout", self.dropout))
                     if v})
        if self.nce_scale != "none":
            args.update(nce_scale=self.nce_scale, rstar_mean_square=self.rstar_mean_square)
        if not self.mode:
            return args
        return {**args, "mode": self.mode, "embed_weight": self.embed_weight,
                "embed_lam": self.embed_lam}

    def encode(self, items: torch.Tensor, offsets: torch.Tensor, dropout: float = 0.0
               ) -> torch.Tensor:
        """(B, width) user codes from sparse binary rows; ``dropout``: of the input row
        (``dropout_weights``), for training only."""
        weights = dropout_weights(len(items), dropout, self.encoder.weight) if dropout else None
        return torch.relu(self.encoder(items, offsets, per_sample_weights=weights)
                          + self.encoder_bias)

    def user_codes(self, items: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        return self.encode(items, offsets)

    def head_scores(self, items: torch.Tensor, offsets: torch.Tensor, heads: tuple[str, ...],
                    frozen_encoder: bool = False) -> dict[str, torch.Tensor]:
        """(B, n_items) scores of the named heads. ``frozen_encoder`` computes the code without
        autograd (limited fine-tune's phase 2) inside the same forward, so DDP sees every step."""
        h = self.code(items, offsets, frozen_encoder)
        return {name: self.heads[name](h) for name in heads}

    def code(self, items: torch.Tensor, offsets: torch.Tensor, frozen: bool = False,
             dropout: float = 0.0) -> torch.Tensor:
        """``encode``, without autograd when ``frozen``."""
        if frozen:
            with torch.no_grad():
                return self.encode(items, offsets, dropout)
        return self.encode(items, offsets, dropout)

    def score(self, items: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        head = self.recommend_head
        return self.head_scores(items, offsets, (head,))[head]

    # -- training ----------------------------------------------------------------------------

    def phases(self) -> list[list[Step]]:
        if self.mode is None:
            return [[Step(self.heads_trained)]]
        e = self.embed_head
        return {"joint": [[Step((e, "predict"))]],
                "alternating": [[Step((e,)), Step(("predict",))]],
                "limited-finetune": [[Step((e,))], [Step(("predict",), train_encoder=False)]],
                "full-finetune": [[Step((e,))], [Step(("predict",))]]}[self.mode]

    def step_parameters(self, step: Step) -> list[nn.Parameter]:
        params = [p for name in step.heads for p in self.heads[name].parameters()]
        if step.train_encoder:
            params += list(self.encoder.parameters()) + [self.encoder_bias]
        return params

    # -- fine-tune phase 2's start: the exact predict head on the frozen encoder ----------------

    @torch.no_grad()
    def between_phases(self, phase: int, batches, ranks) -> str | None:
        """Fine-tune phase 2's predict head set to the exact minimiser of its loss on phase 1's
        encoder: one pass over this rank's ``batches`` for the sums, summed over the ranks,
        solved, and rank 0's solution shared so every rank holds the same parameters (DDP's
        invariant)."""
        if phase != 0 or not self.start_from_ridge:  # only fine-tune has a phase 1 to end
            return None
        device = self.encoder.weight.device
        d, n = self.width + 1, self.n_items
        gram = torch.zeros(d, d, dtype=torch.float64, device=device)
        rtx = torch.zeros(n, d, dtype=torch.float64, device=device)
        users = 0
        for batch in batches():
            g, r = self.ridge_statistics(batch.train_items, batch.train_offsets)
            gram += g
            rtx += r
            users += len(batch)
        ranks.sum_(gram)
        ranks.sum_(rtx)
        n_users = ranks.sum_(torch.tensor([users], dtype=torch.float64, device=device)).item()
        self.set_ridge_head(gram, rtx, n_users)
        for p in self.heads["predict"].parameters():
            ranks.broadcast_(p.data)
        return (f"phase 2 starts from the exact predict head on phase 1's encoder "
                f"({n_users:,.0f} users")

    @torch.no_grad()
    def ridge_statistics(self, items: torch.Tensor, offsets: torch.Tensor
                         ) -> tuple[torch.Tensor, torch.Tensor]:
        """``ridge.statistics`` of one batch of binary rows on this encoder's codes."""
        return ridge.statistics(self.encode(items, offsets), items, offsets, self.n_items)

    @torch.no_grad()
    def set_ridge_head(self, gram: torch.Tensor, rtx: torch.Tensor, n_users: float) -> None:
        """The predict head that minimises phase 2's loss on the current encoder's codes, over
        the ``n_users`` rows ``gram`` and ``rtx`` sum (``ridge_statistics``):

            sum over users and items of (r_ui - w_i . h_u - b_i)^2 + (N lam omega / d) ||W||^2

        (an epoch's mean MSE over the (users, items) entries plus lam * omega * mean(W^2), scaled
        by N n_items; omega = 1 under lam_units "plain"); per item a ridge regression on [h, 1],
        the bias unpenalised (``ridge.solve``)."""
        weight, bias = ridge.solve(gram, rtx, n_users, self.lam * self.lam_scale)
        head = self.heads["predict"]
        head.weight.copy_(weight)
        head.bias.copy_(bias)

    def monitor(self, phase: int, terms: dict[str, float]) -> float:
        return terms[self.embed_head] if self.embed_head in terms else sum(terms.values())

    def dense_for(self, head: str, batch_size: int) -> bool:
        """Whether ``head`` trains through the dense scores for a batch of this size."""
        if self.dense_loss is not None:
            return self.dense_loss
        return head == "ns" or 3 * batch_size < 2 * self.width

    def forward(self, batch: Batch, step: Step | None = None) -> dict[str, torch.Tensor]:
        """Each trained head's loss, and ``l2`` over the matrices the step trains."""
        step = step or self.phases()[0][0]
        items, offsets, frozen = batch.train_items, batch.train_offsets, not step.train_encoder
        # input dropout while training only; the targets stay the uncorrupted rows
        h = self.code(items, offsets, frozen, self.dropout if self.training else 0.0)
        levers = {"pos_weight": self.pos_weight, "rstar_scale": self.rstar_unit}
        terms = {name: head_loss(name, self.heads[name](h), batch, **levers)
                 if self.dense_for(name, len(offsets))
                 else linear_head_loss(name, self.heads[name], h, batch, **levers)
                 for name in step.heads}
        if "ns" in terms and self.ns_scale != 1.0:  # per (user, item) entry, as the MSE heads
            terms["ns"] = terms["ns"] * self.ns_scale
        if "nce" in terms and self.nce_weight != 1.0:  # --nce-scale head-weight
            terms["nce"] = terms["nce"] * self.nce_weight
        if self.embed_head in terms and self.mode is not None:
            terms[self.embed_head] = terms[self.embed_head] * self.embed_weight
        weights = [self.heads[name].weight for name in step.heads
                   if self.mode is None or name != self.embed_head or self.embed_lam is None]
        if step.train_encoder:
            weights.append(self.encoder.weight)
        terms["l2"] = l2_penalty(weights, self.lam * self.lam_scale)
        if self.mode is not None and self.embed_head in step.heads and self.embed_lam is not None:
            terms["l2"] = terms["l2"] + l2_penalty([self.heads[self.embed_head].weight],
                                                   self.embed_lam * self.lam_scale)
        return terms


def dropout_weights(n: int, p: float, like: torch.Tensor) -> torch.Tensor:
    """(n,) per-entry input weights of dropout with probability ``p``: 0 for a dropped entry,
    1 / (1 - p) for a kept one (torch's dropout, so the expected input is the row), in
    ``like``'s dtype and device. Drawn from torch's global generator."""
    keep = torch.rand(n, device=like.device) >= p
    return keep.to(like.dtype) / (1 - p)


def rstar_target(batch: Batch, rstar_scale: float) -> torch.Tensor:
    """The NCE head's target values: R* (times ``rstar_scale`` under --nce-scale rms)."""
    return batch.train_rstar if rstar_scale == 1.0 else batch.train_rstar * rstar_scale


def head_loss(name: str, scores: torch.Tensor, batch: Batch, pos_weight: float = 0.0,
              rstar_scale: float = 1.0) -> torch.Tensor:
    """A head's loss from its dense (B, n_items) scores (the reference); ``pos_weight`` and
    ``rstar_scale``: the levers of the MSE heads (the module docstring)."""
    if name == "predict":
        return mse_loss(scores, batch.train_items, batch.train_offsets, pos_weight=pos_weight)
    if name == "nce":
        return mse_loss(scores, batch.train_items, batch.train_offsets,
                        rstar_target(batch, rstar_scale), pos_weight)
    if name == "ns":
        return ns_loss(scores, batch.train_items, batch.train_offsets, batch.neg_items,
                       batch.neg_counts, batch.neg_offsets)
    raise ValueError(f"unknown head {name!r}")


def linear_head_loss(name: str, head: nn.Linear, h: torch.Tensor, batch: Batch,
                     pos_weight: float = 0.0, rstar_scale: float = 1.0) -> torch.Tensor:
    """``head_loss(name, head(h), batch, ...)`` without the (B, n_items) scores
    (models/autorec/losses.py)."""
    w, b = head.weight, head.bias
    if name == "predict":
        return linear_mse(h, w, b, batch.train_items, batch.train_offsets, pos_weight=pos_weight)
    if name == "nce":
        return linear_mse(h, w, b, batch.train_items, batch.train_offsets,
                          rstar_target(batch, rstar_scale), pos_weight)
    if name == "ns":
        return linear_ns(h, w, b, batch.train_items, batch.train_offsets, batch.neg_items,
                         batch.neg_counts, batch.neg_offsets)
    raise ValueError(f"unknown head {name!r}")


class OHNSAutoRec(AutoRec):
    name = "ohns-autorec"
    heads_trained = ("ns",)
    embed_head = "ns"
    recommend_head = "ns"
    needs = frozenset({NEGATIVES})
    # no predict head: nothing for --pos-weight to weigh (its NS loss has no confidence form here)
    hyperparameters = {**{k: v for k, v in AutoRec.hyperparameters.items() if k != "pos_weight"},
                       "lam": LAM.but(default=2.0)}
    run_axes = {"paper": {"num_negatives": PAPER_NEGATIVES}}
    # the family's batch 512 at lr 1e-3 kept 0.80 of its tuned NDCG on ml-latest-small (0.94 at
    # these, the defaults before); its NS head is always dense, so a larger batch saves it
    # little time (benchmarks/results/tune_defaults.md)
    learning_rate = 3e-4
    batch_size = 128


class NSAutoRec(AutoRec):
    name = "ns-autorec"
    heads_trained = ("ns", "predict")
    embed_head = "ns"
    needs = frozenset({NEGATIVES})
    hyperparameters = {**AutoRec.hyperparameters, **TWO_HEADED}
    training_options = {**LOSS_PATH, **FINETUNE}
    run_axes = {"paper": {"num_negatives": PAPER_NEGATIVES}}


class NCEAutoRec(AutoRec):
    name = "nce-autorec"
    heads_trained = ("nce", "predict")
    embed_head = "nce"
    needs = frozenset({RSTAR})
    hyperparameters = {**AutoRec.hyperparameters, **TWO_HEADED, "nce_scale": NCE_SCALE}
    training_options = {**LOSS_PATH, **FINETUNE}
    run_axes = {"paper": {"beta": PAPER_BETAS}, "small": {"beta": [0.8, 1.0]}}

    @classmethod
    def data_statistics(cls, prep, split: str = "train", config=None) -> dict:
        """omega, and with ``--nce-scale`` rms or head-weight (read from ``config``, the run's
        TrainConfig; None: not asked) mean(R*^2) over ``split``'s training positives at the
        run's beta: sum_j pop_j R*_j^2 / sum_j pop_j from the per-item tables. The train split's
        also in the final retraining, as omega, so the scale validation chose is the final
        model's."""
        out = super().data_statistics(prep, split, config)
        scale = (config.hyperparameters().get("nce_scale") if config is not None else None) \
            or cls.hyperparameters["nce_scale"].default
        if scale != "none":
            out["rstar_mean_square"] = rstar_mean_square(prep, config.beta, split == "train,valid")
        return out


def rstar_mean_square(prep, beta: float | None, train_valid: bool) -> float:
    """mean(R*^2) over the training positives (``prepared.reader.Prepared``), R* at ``beta``
    (None: the ETL's)."""
    pop = (prep.pop_train_valid if train_valid else prep.pop_train).astype(np.float64)
    table = prep.rstar_table(prep.beta() if beta is None else beta, train_valid).astype(np.float64)
    return float(pop.dot(table ** 2) / max(pop.sum(), 1.0))
