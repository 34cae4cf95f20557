"""How the AutoRec family trains (protocol.md, "Modes"), beside its model (``models.autorec.model``):
the modes as phases of steps, fine-tune phase 2's exact ridge start, the family's training flags
and their checks, its data statistics, and its defaults of learning rate and batch size.

    joint             one optimizer, loss = embedding-head loss + MSE loss
    alternating       per batch: a step on the embedding head's loss (encoder + that head),
                      then a step on the MSE loss (encoder + predict head)
    limited-finetune  phase 1: encoder + embedding head on its loss until it converges;
                      phase 2: predict head alone on MSE, the encoder frozen
    full-finetune     phase 1 as above; phase 2: encoder + predict head on MSE

Phase 2 may start from the exact minimiser of its loss on phase 1's encoder (``between_phases``,
with ``--finetune-init ridge``; ``models.autorec.ridge``): a ridge regression per item, where Adam
from the untrained head needs hundreds of epochs (deviation from the paper, which starts phase 2's
head untrained; ``--finetune-init as-is`` does that). Fine-tune phase 1's length and learning rate
are training options (``--finetune-phase1-epochs``, 0: until its loss converges;
``--finetune-phase1-lr``), searchable: an extension beyond the paper, which trains the embedding
first to convergence.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from models.hparams import Option
from models.training import Training

if TYPE_CHECKING:
    from models.autorec.model import AutoRec

MODES = ("joint", "alternating", "limited-finetune", "full-finetune")
FINETUNE_MODES = ("limited-finetune", "full-finetune")  # the modes with a phase 2
FINETUNE_INITS = ("ridge", "as-is")
LOSS_PATHS = ("auto", "fast", "dense")

# The family's run-level training flags (``Training.options``: training/train.py makes a flag of
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
STARTS = ("random", "svd")
START_FROM = {  # the models whose heads all have a closed form (MSE heads): not the NS head's
    "start_from": Option("random", "where training starts: random = the paper's initialisation; svd "
                   "= the linear closed form (extension beyond the paper: the encoder from the "
                   "top --width singular vectors of R, of R* for NCE-AutoRec, the heads from "
                   "their ridge solution at --lam, so that epoch 0 is PLRec / NCE-PLRec; the "
                   "run validates it as epoch 0 and keeps it unless an epoch does better)",
                   choices=STARTS, searchable=True,
                   refused="{model} has an NS head, which has no closed form to start from; "
                           "only {takers} take it. Drop the flag"),
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
                                     "overrides: the final retraining passes the selection "
                                     "run's count)",
                                     type=int, lo=0, hi=100_000, refused=PHASE_1_ONLY,
                                     searchable=True),
    "finetune_phase1_lr": Option(None, "Adam learning rate of fine-tune phase 1 (default: --lr's)",
                                 type=float, lo=0, open_lo=True, hi=1, why="a learning rate",
                                 refused=PHASE_1_ONLY, searchable=True),
}


@dataclass(frozen=True)
class Step:
    """Heads whose losses are summed, and whether the encoder is trained by this step."""

    heads: tuple[str, ...]
    train_encoder: bool = True


class AutoRecTraining(Training):
    """One run of a model of the family: its mode's phases, their optimisers' parameters,
    learning rates and lengths, and the ridge start between fine-tune's phases."""

    #: Adam's rate and users per step without --lr / --batch-size (issue 32): batch 512 at lr
    #: 1e-3 kept 0.97-1.02 of the validation NDCG of batch 128 at 3e-4 (the defaults before) on
    #: ml-100k, ml-latest-small and citeulike-a, mostly in fewer seconds (the loss is exact at
    #: any batch; each step pays Adam over the n x d matrices); larger steps were not safe on
    #: the sparse set: lr 3e-3 at batch 1024 lost 19% on citeulike-a, and lr 1e-2 at 2048 killed
    #: every ReLU of the code there (effective rank 0 from epoch 6: popularity's NDCG)
    #: (benchmarks/results/batch_defaults.md, collapse.md). OHNS-AutoRec keeps its own.
    learning_rate = 1e-3
    batch_size = 512
    options = {**LOSS_PATH, **START_FROM}

    def __init__(self, model: AutoRec, options: Any = None):
        """``options``: the run's TrainConfig (``--loss-path``: auto leaves the model's
        ``dense_loss`` to the batch size; ``--finetune-init``, ``--finetune-lr`` and phase 1's
        ``--finetune-phase1-lr`` and ``-epochs``); None: every option's default."""
        super().__init__(model, options)
        given = lambda name: getattr(options, name, None)
        path = given("loss_path") or "auto"
        if path != "auto":
            model.dense_loss = path == "dense"
        init = given("finetune_init") or self.default_finetune_init(
            {"pos_weight": model.pos_weight, "emphasis": model.emphasis,
             "predict_loss": model.predict_loss})
        self.start_from_ridge = init == "ridge"
        self.finetune_lr = given("finetune_lr")
        self.phase1_lr = given("finetune_phase1_lr")
        self.phase1_epochs = given("finetune_phase1_epochs") or 0
        self.start_from = given("start_from") or "random"

    def prepare(self, popularity) -> None:
        """``--pop-l2``'s item weights from the train split's positives per item."""
        if self.model.pop_l2 and popularity is not None:
            self.model.set_item_popularity(popularity)

    # -- the driver's questions ------------------------------------------------------------------

    @classmethod
    def data_statistics(cls, prep, split: str = "train", config=None) -> dict:
        """omega, the unit of lambda (``lam_units`` "overlap"), of ``split``'s rows: the train
        split's also in the final retraining (models/autorec/model.py says why)."""
        return {"overlap": prep.user_overlap(split == "train,valid")}

    @classmethod
    def combination_problem(cls, hp: dict, options: dict) -> str | None:
        """A weight on positives (``--pos-weight``, ``--emphasis``) with the ridge start of
        fine-tune phase 2: the start solves the unweighted normal equations (one (d+1)^2 system
        for every item); the weighted ones differ per item (WRMF's), which ``ridge`` does not
        solve."""
        flag = weighting(hp)
        if flag and hp.get("mode") in FINETUNE_MODES and options.get("finetune_init") == "ridge":
            return (f"--finetune-init ridge with --{flag.replace('_', '-')} {hp[flag]:g}: the "
                    "ridge start solves the unweighted loss, not the weighted one; pass "
                    f"--finetune-init as-is (the default with --{flag.replace('_', '-')}) or "
                    f"--{flag.replace('_', '-')} 0")
        return None

    @classmethod
    def default_finetune_init(cls, hp: dict) -> str:
        """ridge, or as-is with a weight on positives (``combination_problem``) or the
        multinomial predict loss (the ridge start solves the MSE problem)."""
        return "as-is" if weighting(hp) or hp.get("predict_loss") == "multinomial" else "ridge"

    @classmethod
    def takes_option(cls, name: str, hp: dict) -> bool:
        """The fine-tune flags only in the modes with a phase 2."""
        return name in cls.options and (not name.startswith("finetune_")
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
    def starts_from_data(cls, options) -> bool:
        """``--start-from svd`` (``models.autorec.start``)."""
        return "start_from" in cls.options and getattr(options, "start_from", None) == "svd"

    @classmethod
    def converges_a_phase(cls, hp: dict, options: dict) -> bool:
        """The fine-tune modes' phase 1 runs until its loss converges (``--pretrain-epochs 0``),
        unless ``--finetune-phase1-epochs`` sets its length."""
        return hp.get("mode") in FINETUNE_MODES and not options.get("finetune_phase1_epochs")

    @classmethod
    def remedy(cls, hp: dict, searched: list[str]) -> str:
        """A confidence on positives left at 0 is tried first: on a hard generated sparse set
        AutoRec stayed below popularity (0.87x) with its defaults and reached 18x with
        ``--pos-weight 10`` (``benchmarks/results/collapse.md``)."""
        retune = super().remedy(hp, searched)  # "try another --lr, ..." of its searched flags
        if "pos_weight" in hp and not hp["pos_weight"]:
            return ("try --pos-weight 10 (a confidence on positives, an extension beyond the "
                    f"paper: docs/training.md), or {retune.removeprefix('try ')}")
        return retune

    # -- the loop's questions ---------------------------------------------------------------------

    def phases(self) -> list[list[Step]]:
        model = self.model
        if model.mode is None:
            return [[Step(model.heads_trained)]]
        e = model.embed_head
        return {"joint": [[Step((e, "predict"))]],
                "alternating": [[Step((e,)), Step(("predict",))]],
                "limited-finetune": [[Step((e,))], [Step(("predict",), train_encoder=False)]],
                "full-finetune": [[Step((e,))], [Step(("predict",))]]}[model.mode]

    def step_parameters(self, step: Step) -> list[nn.Parameter]:
        model = self.model
        params = [p for name in step.heads for p in model.heads[name].parameters()]
        if step.train_encoder:
            params += list(model.encoder.parameters()) + [model.encoder_bias]
        return params

    def phase_lr(self, phase: int, lr: float) -> float:
        """Fine-tune phase 2 may have its own (``--finetune-lr``), and so may phase 1
        (``--finetune-phase1-lr``)."""
        finetune = self.model.mode in FINETUNE_MODES
        own = self.finetune_lr if phase > 0 else self.phase1_lr if finetune else None
        return own if own is not None else lr

    def phase_epochs(self, phase: int) -> int:
        """Fine-tune phase 1's ``--finetune-phase1-epochs`` (0: until its loss converges)."""
        return self.phase1_epochs if phase == 0 and self.model.mode in FINETUNE_MODES else 0

    def monitor(self, phase: int, terms: dict[str, float]) -> float:
        """Phase 1 ends when the embedding head's loss converges."""
        e = self.model.embed_head
        return terms[e] if e in terms else sum(terms.values())

    def start(self, train, rstar, seed: int) -> str | None:
        """``--start-from svd``: the model at its linear closed form (``models.autorec.start``)."""
        if self.start_from != "svd":
            return None
        from models.autorec.start import svd_start

        return svd_start(self.model, train, rstar, seed)

    @torch.no_grad()
    def between_phases(self, phase: int, batches, ranks) -> str | None:
        """Fine-tune phase 2's predict head set to the exact minimiser of its loss on phase 1's
        encoder: one pass over this rank's ``batches`` for the sums, summed over the ranks,
        solved, and rank 0's solution shared so every rank holds the same parameters (DDP's
        invariant)."""
        if phase != 0 or not self.start_from_ridge:  # only fine-tune has a phase 1 to end
            return None
        model = self.model
        device = model.encoder.weight.device
        d, n = model.width + 1, model.n_items
        gram = torch.zeros(d, d, dtype=torch.float64, device=device)
        rtx = torch.zeros(n, d, dtype=torch.float64, device=device)
        users = 0
        for batch in batches():
            g, r = model.ridge_statistics(batch.train_items, batch.train_offsets)
            gram += g
            rtx += r
            users += len(batch)
        ranks.sum_(gram)
        ranks.sum_(rtx)
        n_users = ranks.sum_(torch.tensor([users], dtype=torch.float64, device=device)).item()
        model.set_ridge_head(gram, rtx, n_users)
        for p in model.heads["predict"].parameters():
            ranks.broadcast_(p.data)
        return (f"phase 2 starts from the exact predict head on phase 1's encoder "
                f"({n_users:,.0f} users")


class TwoHeadedTraining(AutoRecTraining):
    """NS- and NCE-AutoRec: the fine-tune flags beside the loss path."""

    options = {**LOSS_PATH, **FINETUNE}  # NS-AutoRec: no --start-from svd (its NS head)


class NCETraining(TwoHeadedTraining):
    options = {**LOSS_PATH, **START_FROM, **FINETUNE}

    @classmethod
    def data_statistics(cls, prep, split: str = "train", config=None) -> dict:
        """omega, and with ``--nce-scale`` rms or head-weight (read from ``config``, the run's
        TrainConfig; None: not asked) mean(R*^2) over ``split``'s training positives at the
        run's beta: sum_j pop_j R*_j^2 / sum_j pop_j from the per-item tables. The train split's
        also in the final retraining, as omega, so the scale validation chose is the final
        model's."""
        out = super().data_statistics(prep, split, config)
        scale = (config.hyperparameters().get("nce_scale") if config is not None else None) \
            or "none"
        if scale != "none":
            out["rstar_mean_square"] = rstar_mean_square(prep, config.beta, split == "train,valid")
        return out


# the family's batch 512 at lr 1e-3 kept 0.80 of OHNS-AutoRec's tuned NDCG on ml-latest-small
# (0.94 at these, the defaults before); its NS head is always dense, so a larger batch saves it
# little time (benchmarks/results/tune_defaults.md)
class OHNSTraining(AutoRecTraining):
    learning_rate = 3e-4
    batch_size = 128
    options = LOSS_PATH  # no --start-from svd: its one head is the NS head


def rstar_mean_square(prep, beta: float | None, train_valid: bool) -> float:
    """mean(R*^2) over the training positives (``prepared.reader.Prepared``), R* at ``beta``
    (None: the ETL's)."""
    pop = (prep.pop_train_valid if train_valid else prep.pop_train).astype(np.float64)
    table = prep.rstar_table(prep.beta() if beta is None else beta, train_valid).astype(np.float64)
    return float(pop.dot(table ** 2) / max(pop.sum(), 1.0))


def weighting(hp: dict) -> str | None:
    """The first lever of ``hp`` that weighs positives up in the MSE heads, if any."""
    return next((k for k in ("pos_weight", "emphasis") if hp.get(k)), None)
