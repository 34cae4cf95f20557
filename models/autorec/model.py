"""The AutoRec family of the paper (protocol.md, "Models"): one encoder and named linear heads.

Input is a batch of users' binary training rows in sparse form (``models.batch``): the encoder
computes ``h = ReLU(W_e r + b_e)`` as a sum of W_e's columns for the user's items, so the
(B, n_items) input is never formed. Each head is linear with bias and identity output, ``W h + b``.

    autorec       encoder + predict head (MSE against r)
    ohns-autorec  encoder + ns head (negative sampling); it also recommends with that head
    ns-autorec    encoder + ns head + predict head; recommends with the predict head
    nce-autorec   encoder + nce head (MSE against R*) + predict head; recommends with predict

The modes of the two-headed models (protocol.md, "Modes"), fine-tune phase 2's ridge start and
the family's training flags are its training policy's, beside this module
(``models.autorec.training``).

Extensions beyond the paper (issue 32), each off by default, where the paper's model is unchanged
loss for loss (tests/models/test_losses.py), each in the fast loss and its dense reference alike:

    pos_weight   confidence on positives: each positive's squared error in the predict and NCE
                 heads weighs 1 + alpha (WRMF's confidence 1 + alpha r, Hu, Koren & Volinsky
                 2008; the weighted loss of CDAE-style models); an O(nnz d) term of the fast
                 loss (models/autorec/losses.py). Not OHNS-AutoRec (no MSE head). With the
                 fine-tune modes phase 2 starts as-is: the ridge start solves the unweighted
                 normal equations (``AutoRecTraining.combination_problem``).
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
    nce_pos_weight  the NCE head's own confidence on positives (NCE-AutoRec; issue 57): its
                 positives' squared errors weigh 1 + nce_pos_weight, the predict head's keep
                 1 + pos_weight. None (the default) is pos_weight for both, as before; the two
                 heads' targets differ in scale (R* is 14-43 in mean square on the shared sets'
                 positives), so one alpha for both is a compromise the search can undo.
    emphasis     emphasized denoising (issue 57; EDLAE, Steck, "Autoencoders that don't overfit
                 towards the Identity", NeurIPS 2020): with --dropout, each positive dropped from
                 the input has its squared error in the MSE heads weigh an extra ``emphasis`` (on
                 top of 1 + pos_weight), so the code learns to predict an item from the others
                 rather than copy it. The sparse form: only a dropped positive changes the input
                 (a dropped zero is still zero), and weighting random zeros up would only rescale
                 the zeros' loss in expectation, which pos_weight already searches. A per-positive
                 weight in the same O(nnz d) term as pos_weight. Needs dropout > 0; 0 is off.
                 Fine-tune phase 2 starts as-is, as with pos_weight.
    pop_l2       popularity-scaled L2 (issue 57): item i's rows of the encoder and of every head
                 weigh w_i = ((c_i + 1) / mean(c + 1))^pop_l2 in the L2 term, normalised to
                 mean 1 (the same total strength, moved toward the popular items), c the train
                 split's positives per item (the training policy's ``prepare``; the train
                 split's also in the final retraining, as omega). iALS's frequency-scaled
                 regularisation (Rendle et al., "Revisiting the Performance of iALS on Item
                 Recommendation Benchmarks", RecSys 2022) and DLAE's p / (1 - p) diag(X'X)
                 (Steck, "Autoencoders that don't overfit towards the Identity", NeurIPS 2020)
                 at pop_l2 = 1. 0 (the default) is the paper's plain L2, bit for bit. The
                 ridge and SVD starts solve the plain-L2 problem: a start, not the optimum.
    predict_loss the predict head's loss (issue 57): "mse" (the paper's) or "multinomial", Mult-DAE's
                 multinomial log-likelihood of the user's items under a softmax over every item
                 (Liang et al., "Variational Autoencoders for Collaborative Filtering", WWW 2018;
                 ``losses.multinomial_loss``), per (user, item) entry like the other heads. It
                 has no fast form, so the predict head then trains through the dense scores; it
                 has no squared errors, so --pos-weight and --emphasis (which weigh them) are
                 refused with it; the ridge and SVD starts solve the MSE problem (a start, not
                 its optimum), so fine-tune phase 2 starts as-is by default.
    phase 1      fine-tune phase 1's length and learning rate, searchable (the training
                 policy's options, models/autorec/training.py).

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
(benchmarks/results/tune_defaults.md). ``lam_units="plain"`` is lam * mean(W^2) against the NS
head's loss per user, the project's first form.

omega is computed on the split model selection trains on (train), also for the final retraining
on train+valid (the training policy's ``data_statistics``; ``training.train.STATISTICS_SPLIT``),
and recorded in the run (MLflow params ``overlap`` and ``data_statistics_split``; run.json's
``data_statistics``): train+valid's omega is larger (about 1.9x on citeulike-a), so recomputing
it would give the final model a stronger L2 than the lambda validation chose. The model file
records its own omega (``model_args``), so a trained model scores as it trained.
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
from torch import nn

from models.autorec import ridge
from models.autorec.losses import bag_with_l2, linear_mse, linear_ns, mse_loss, multinomial_loss, ns_loss
from models.autorec.presets import AUTOREC, NCE_AUTOREC
from models.autorec.training import MODES, AutoRecTraining, NCETraining, OHNSTraining, Step, TwoHeadedTraining
from models.base import NEGATIVES, RSTAR, Recommender
from models.batch import Batch
from models.hparams import (
    DROPOUT_HELP,
    HP,
    LAM_HELP,
    PAPER_BETAS,
    PAPER_LAMBDAS,
    PAPER_NEGATIVES,
    PAPER_WIDTHS,
    WIDTH_HELP,
)
from models.losses import l2_penalty
from models.product import linear

LAM_UNITS = ("overlap", "plain")
NCE_SCALES = ("none", "rms", "head-weight")
PREDICT_LOSSES = ("mse", "multinomial")

# The named grids. "small" (the default: a few trials per model) searches joint mode only:
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
                  "mean(W^2) with the NS head's loss per user (the project's first form)",
                  choices=LAM_UNITS)
# The levers beyond the paper (issue 32; the module docstring gives each one's source), each off
# by default: the paper's model
POS_WEIGHT = HP(0.0, "confidence on positives: each positive's squared error weighs 1 + "
                "pos_weight in the predict and NCE heads (WRMF's alpha; 0 = the paper's "
                "unweighted MSE)", lo=0, hi=1e6)
DROPOUT = HP(0.0, DROPOUT_HELP, lo=0, hi=1, open_hi=True)  # --dropout, shared with CDAE and VAE
NCE_POS_WEIGHT = HP(None, "the NCE head's own confidence on positives: its positives' squared "
                    "errors weigh 1 + nce_pos_weight, the predict head's 1 + pos_weight "
                    "(default: --pos-weight)", type=float, lo=0, hi=1e6)
NCE_SCALE = HP("none", "the NCE head's scale: none = R* as the paper; rms = R* divided by its "
               "root mean square on the training positives; head-weight = the NCE loss "
               "weighted by 1 / mean(R*^2) on them", choices=NCE_SCALES)
EMPHASIS = HP(0.0, "emphasized denoising (EDLAE): each positive --dropout drops from the input "
               "weighs an extra emphasis in the MSE heads' squared error, on top of 1 + "
               "pos_weight (0 = off; needs --dropout > 0)", lo=0, hi=1e6)
POP_L2 = HP(0.0, "popularity-scaled L2: item i's rows of the encoder and heads weigh ((c_i + 1) / "
             "mean(c + 1))^pop_l2 in the L2 term (mean 1), c its training positives (iALS's "
             "frequency-scaled regularisation; 0 = the paper's plain L2)", lo=0, hi=4)
PREDICT_LOSS = HP("mse", "the predict head's loss: mse = the paper's squared error over every "
                  "item; multinomial = Mult-DAE's multinomial log-likelihood, -sum over the "
                  "user's items of log softmax(scores), trained through the dense scores (no "
                  "--pos-weight or --emphasis with it)", choices=PREDICT_LOSSES)
TWO_HEADED = {  # what NS- and NCE-AutoRec share beyond AutoRec's (lam: its default and grids)
    "lam": LAM.but(default=10.0, search={"paper": PAPER_LAMBDAS, "small": TWO_HEAD_LAMBDAS}),
    "mode": HP("joint", "how the two heads train", choices=MODES, search={"paper": list(MODES)},
               label=True),
    "embed_weight": HP(1.0, "weight of the embedding head's loss (nce or ns) against the MSE "
                       "head's (1: the paper's sum; matters in joint mode: Adam is blind to a "
                       "step's overall scale)", lo=0, hi=1e6),
    "embed_lam": HP(None, "L2 of the embedding head's matrix (default: --lam)", type=float, lo=0,
                    hi=1e6, open_hi=True),
}


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
                       "pos_weight": POS_WEIGHT, "emphasis": EMPHASIS, "pop_l2": POP_L2,
                       "predict_loss": PREDICT_LOSS}
    trainer = AutoRecTraining
    presets = AUTOREC  # --preset (models/autorec/presets.py)
    #: train each head through the dense (B, n_items) scores (True) or its exact fast loss
    #: (False); None: whichever is cheaper. For the predict and NCE heads the dense way costs
    #: about 3 B n d (product and two gradients), the fast one about 2 n d^2 (W'W and its
    #: gradient): fast from B >= 2d/3 on (NCE-AutoRec's step at batch 4096: 12.8x at the Yahoo
    #: shape). The NS head stays dense: scoring its positives and N negatives per user gathers
    #: (nnz + N) x d per batch in each direction, which measured 0.5-2.2x of the dense product on
    #: a CPU, slower for OHNS-AutoRec at every batch size (benchmarks/results/loss_speed.md).
    #: The model and its gradients are the same either way.
    dense_loss: bool | None = None

    def __init__(self, n_items: int, width: int, lam: float, mode: str | None = None,
                 embed_weight: float = 1.0, embed_lam: float | None = None,
                 lam_units: str = "overlap", overlap: float | None = None,
                 pos_weight: float = 0.0, dropout: float = 0.0, nce_scale: str = "none",
                 rstar_mean_square: float | None = None, nce_pos_weight: float | None = None,
                 pop_l2: float = 0.0, emphasis: float = 0.0, predict_loss: str = "mse"):
        super().__init__()
        self.predict_loss = checked_predict_loss(self, predict_loss, pos_weight or emphasis)
        if emphasis < 0 or (emphasis and not (dropout > 0 and "predict" in self.heads_trained)):
            raise ValueError(f"{self.name}: emphasis weighs the positives --dropout drops from the "
                             "MSE heads' input: it must be >= 0, and 0 without dropout > 0 or "
                             f"without a predict head; got emphasis {emphasis}, dropout {dropout}")
        self.emphasis = float(emphasis)
        if not 0 <= pop_l2 <= 4:
            raise ValueError(f"need 0 <= pop_l2 <= 4; got {pop_l2}")
        self.pop_l2 = float(pop_l2)
        if nce_pos_weight is not None and (nce_pos_weight < 0 or "nce" not in self.heads_trained):
            raise ValueError(f"{self.name}: nce_pos_weight weighs the NCE head's positives: it "
                             f"must be >= 0, and unset without an NCE head; got {nce_pos_weight}")
        self.nce_pos_weight = None if nce_pos_weight is None else float(nce_pos_weight)
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
                             "training positives > 0 (NCETraining.data_statistics with the "
                             "run's "
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
        if self.pop_l2:
            # the per-item L2 weights, None until ``set_item_popularity`` sets them from the
            # training data (not part of the model's state: scoring never reads them)
            self.register_buffer("item_l2", None, persistent=False)

    def set_item_popularity(self, counts) -> None:
        """``pop_l2``'s item weights from the training positives per item, ``counts`` (n_items,)."""
        c = torch.as_tensor(counts, dtype=torch.float64).reshape(-1) + 1.0
        if len(c) != self.n_items:
            raise ValueError(f"{self.name}: {len(c)} item counts for {self.n_items} items")
        w = c ** self.pop_l2
        self.item_l2 = (w / w.mean()).to(self.encoder.weight)

    def l2_rows(self) -> torch.Tensor | None:
        """The per-item L2 weights under ``pop_l2``, else None (the plain L2)."""
        if not self.pop_l2:
            return None
        if self.item_l2 is None:
            raise RuntimeError(f"{self.name}: pop_l2 {self.pop_l2:g} needs the training items' "
                               "popularity: set_item_popularity (the training policy's prepare) "
                               "before the first step")
        return self.item_l2

    def model_args(self) -> dict:
        args = {"n_items": self.n_items, "width": self.width, "lam": self.lam,
                "lam_units": self.lam_units}
        if self.lam_units == "overlap":
            args["overlap"] = self.overlap
        # the levers only where on (absent: off, as in a model saved before they existed)
        args.update({k: v for k, v in (("pos_weight", self.pos_weight), ("dropout", self.dropout),
                                       ("emphasis", self.emphasis)) if v})
        if self.nce_scale != "none":
            args.update(nce_scale=self.nce_scale, rstar_mean_square=self.rstar_mean_square)
        if self.nce_pos_weight is not None:
            args["nce_pos_weight"] = self.nce_pos_weight
        if self.pop_l2:
            args["pop_l2"] = self.pop_l2
        if self.predict_loss != "mse":
            args["predict_loss"] = self.predict_loss
        if not self.mode:
            return args
        return {**args, "mode": self.mode, "embed_weight": self.embed_weight,
                "embed_lam": self.embed_lam}

    def encode(self, items: torch.Tensor, offsets: torch.Tensor,
               weights: torch.Tensor | None = None) -> torch.Tensor:
        """(B, width) user codes from sparse binary rows; ``weights``: one per input entry (the
        training dropout's ``dropout_weights``), None for the row as it is."""
        return torch.relu(self.encoder(items, offsets, per_sample_weights=weights)
                          + self.encoder_bias)

    def user_codes(self, items: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        return self.encode(items, offsets)

    def head_scores(self, items: torch.Tensor, offsets: torch.Tensor, heads: tuple[str, ...],
                    frozen_encoder: bool = False) -> dict[str, torch.Tensor]:
        """(B, n_items) scores of the named heads. ``frozen_encoder`` computes the code without
        autograd (limited fine-tune's phase 2) inside the same forward, so DDP sees every step."""
        h = self.code(items, offsets, frozen_encoder)
        # on the faster kernel when nothing is recorded for autograd (models.product): scoring's
        # and validation's products; training's forward stays nn.Linear's
        return {name: linear(h, self.heads[name].weight, self.heads[name].bias) for name in heads}

    def code(self, items: torch.Tensor, offsets: torch.Tensor, frozen: bool = False,
             weights: torch.Tensor | None = None) -> torch.Tensor:
        """``encode``, without autograd when ``frozen``."""
        if frozen:
            with torch.no_grad():
                return self.encode(items, offsets, weights)
        return self.encode(items, offsets, weights)

    def score(self, items: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        head = self.recommend_head
        return self.head_scores(items, offsets, (head,))[head]

    def score_factors(self, items: torch.Tensor, offsets: torch.Tensor):
        head = self.heads[self.recommend_head]
        return self.code(items, offsets), head.weight.T, head.bias

    # -- fine-tune phase 2's start (AutoRecTraining.between_phases): the exact predict head ------

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

    def dense_for(self, head: str, batch_size: int) -> bool:
        """Whether ``head`` trains through the dense scores for a batch of this size."""
        if head == "predict" and self.predict_loss == "multinomial":
            return True  # no fast form (losses.multinomial_loss)
        if self.dense_loss is not None:
            return self.dense_loss
        return head == "ns" or 3 * batch_size < 2 * self.width

    def levers(self, head: str, keep: torch.Tensor | None = None) -> dict:
        """The MSE levers of ``head``'s loss: its confidence on positives (one per positive
        under ``emphasis``: ``keep`` is the step's dropout weights, 0 where dropped) and R*'s
        unit."""
        weight = (self.nce_pos_weight if head == "nce" and self.nce_pos_weight is not None
                  else self.pos_weight)
        if self.emphasis and keep is not None and head != "ns":
            weight = weight + self.emphasis * (keep == 0).to(keep.dtype)
        return {"pos_weight": weight, "rstar_scale": self.rstar_unit}

    def forward(self, batch: Batch, step: Step | None = None) -> dict[str, torch.Tensor]:
        """Each trained head's loss, and ``l2`` over the matrices the step trains."""
        step = step or Step(self.heads_trained)  # every head and the encoder: joint
        items, offsets, frozen = batch.train_items, batch.train_offsets, not step.train_encoder
        # input dropout while training only; the targets stay the uncorrupted rows
        keep = (dropout_weights(len(items), self.dropout, self.encoder.weight)
                if self.training and self.dropout else None)
        rows = self.l2_rows()  # every matrix here has a row per item
        terms, squares = {}, {}  # squares: mean(W^2) of the matrices whose own node gave it
        if step.train_encoder and rows is None:  # the bag and its plain L2 in one node
            bag, squares[None] = bag_with_l2(items, offsets, keep, self.encoder.weight)
            h = torch.relu(bag + self.encoder_bias)
        else:
            h = self.code(items, offsets, frozen, keep)
        for name in step.heads:
            levers = self.levers(name, keep)
            if self.dense_for(name, len(offsets)):
                terms[name] = head_loss(name, self.heads[name](h), batch, **levers,
                                        predict_loss=self.predict_loss)
            elif name != "ns" and rows is None:  # the MSE heads' loss also gives their plain L2
                terms[name], squares[name] = linear_head_loss(name, self.heads[name], h, batch,
                                                              with_l2=True, **levers)
            else:
                terms[name] = linear_head_loss(name, self.heads[name], h, batch, **levers)
        if "ns" in terms and self.ns_scale != 1.0:  # per (user, item) entry, as the MSE heads
            terms["ns"] = terms["ns"] * self.ns_scale
        if "nce" in terms and self.nce_weight != 1.0:  # --nce-scale head-weight
            terms["nce"] = terms["nce"] * self.nce_weight
        if self.embed_head in terms and self.mode is not None:
            terms[self.embed_head] = terms[self.embed_head] * self.embed_weight
        l2 = []  # (lambda, the matrices it weighs)
        for name in step.heads:
            own = self.mode is not None and name == self.embed_head and self.embed_lam is not None
            l2.append((self.embed_lam if own else self.lam, name))
        if step.train_encoder:
            l2.append((self.lam, None))
        terms["l2"] = sum(
            lam * self.lam_scale * squares[name] if name in squares
            else l2_penalty([self.encoder.weight if name is None else self.heads[name].weight],
                            lam * self.lam_scale, rows)
            for lam, name in l2)
        return terms


def checked_predict_loss(model: AutoRec, predict_loss: str, weighted: float) -> str:
    """``predict_loss`` where ``model`` can take it: one of PREDICT_LOSSES, mse without a predict
    head, and not multinomial with a weight on squared errors (``weighted``: --pos-weight or
    --emphasis, which the multinomial loss has none of)."""
    if predict_loss not in PREDICT_LOSSES or (predict_loss != "mse"
                                              and "predict" not in model.heads_trained):
        raise ValueError(f"{model.name}: predict_loss {predict_loss!r}: choose one of "
                         f"{', '.join(PREDICT_LOSSES)}, and mse without a predict head")
    if predict_loss == "multinomial" and weighted:
        raise ValueError(f"{model.name}: --pos-weight and --emphasis weigh squared errors, which "
                         "the multinomial loss has none of: drop them (0), or use "
                         "--predict-loss mse")
    return predict_loss


def dropout_weights(n: int, p: float, like: torch.Tensor) -> torch.Tensor:
    """(n,) per-entry input weights of dropout with probability ``p``: 0 for a dropped entry,
    1 / (1 - p) for a kept one (torch's dropout, so the expected input is the row), in
    ``like``'s dtype and device. Drawn from torch's global generator."""
    keep = torch.rand(n, device=like.device) >= p
    return keep.to(like.dtype) / (1 - p)


def rstar_target(batch: Batch, rstar_scale: float) -> torch.Tensor:
    """The NCE head's target values: R* (times ``rstar_scale`` under --nce-scale rms)."""
    return batch.train_rstar if rstar_scale == 1.0 else batch.train_rstar * rstar_scale


def head_loss(name: str, scores: torch.Tensor, batch: Batch,
              pos_weight: float | torch.Tensor = 0.0, rstar_scale: float = 1.0,
              predict_loss: str = "mse") -> torch.Tensor:
    """A head's loss from its dense (B, n_items) scores (the reference); ``pos_weight`` and
    ``rstar_scale``: the levers of the MSE heads; ``predict_loss``: the predict head's (the
    module docstring)."""
    if name == "predict" and predict_loss == "multinomial":
        return multinomial_loss(scores, batch.train_items, batch.train_offsets)
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
                     pos_weight: float | torch.Tensor = 0.0, rstar_scale: float = 1.0,
                     with_l2: bool = False):
    """``head_loss(name, head(h), batch, ...)`` without the (B, n_items) scores
    (models/autorec/losses.py); ``with_l2`` (the MSE heads): (loss, mean(W^2)) (``linear_mse``)."""
    w, b = head.weight, head.bias
    if name == "predict":
        return linear_mse(h, w, b, batch.train_items, batch.train_offsets, pos_weight=pos_weight,
                          with_l2=with_l2)
    if name == "nce":
        return linear_mse(h, w, b, batch.train_items, batch.train_offsets,
                          rstar_target(batch, rstar_scale), pos_weight, with_l2=with_l2)
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
    # no predict head: nothing for --pos-weight or --emphasis to weigh (its NS loss has no
    # confidence form here)
    hyperparameters = {**{k: v for k, v in AutoRec.hyperparameters.items()
                          if k not in ("pos_weight", "emphasis", "predict_loss")},
                       "lam": LAM.but(default=2.0)}
    run_axes = {"paper": {"num_negatives": PAPER_NEGATIVES}}
    trainer = OHNSTraining  # its own learning rate and batch size
    presets = None  # no search chose settings for it


class NSAutoRec(AutoRec):
    name = "ns-autorec"
    heads_trained = ("ns", "predict")
    embed_head = "ns"
    needs = frozenset({NEGATIVES})
    hyperparameters = {**AutoRec.hyperparameters, **TWO_HEADED}
    trainer = TwoHeadedTraining
    run_axes = {"paper": {"num_negatives": PAPER_NEGATIVES}}
    presets = None  # no search chose settings for it


class NCEAutoRec(AutoRec):
    name = "nce-autorec"
    heads_trained = ("nce", "predict")
    embed_head = "nce"
    needs = frozenset({RSTAR})
    hyperparameters = {**AutoRec.hyperparameters, **TWO_HEADED, "nce_scale": NCE_SCALE,
                       "nce_pos_weight": NCE_POS_WEIGHT}
    trainer = NCETraining
    presets = NCE_AUTOREC
    run_axes = {"paper": {"beta": PAPER_BETAS}, "small": {"beta": [0.8, 1.0]}}
