"""Everything one training run needs, as one frozen, JSON-able dataclass.

The CLI is built from it (``runtime.cli``: one place for every flag's default and help); the
driver checks it (``check``), logs it to MLflow and ships it to every Ray Train worker; a checkpoint
stores it so that a resumed run can refuse a changed configuration.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from models.autorec import LAM_UNITS, MODES
from models.registry import MODELS
from prepared.errors import UsageError
from runtime.cli import option

FINETUNE_MODES = ("limited-finetune", "full-finetune")
FINETUNE_INITS = ("ridge", "as-is")

NEGATIVES = ("etl", "resample")
TRAIN_SPLITS = ("train", "train,valid")
DATA_CACHE = ("auto", "memory", "stream")
PLACEMENTS = ("PACK", "SPREAD")
LOSS_PATHS = ("auto", "fast", "dense")
VALID_BY = ("fold-in", "trained")


DATA, HYPER, TRAINING, CLUSTER = ("data and model", "model hyperparameters (a model refuses one it "
                                  "does not take; defaults are the model's own)",
                                  "training (the AutoRec family; defaults chosen on the shared "
                                  "real datasets, see README)", "cluster, tracking and output")


def model_defaults(field: str) -> str:
    """Each model's default of one hyperparameter, for --help ("autorec 3, ohns-autorec 2, ..."),
    read from the models' classes (``hyperparameters``; ``learning_rate``, ``patience``: the
    gradient models' class attributes), so the help cannot drift from the code."""
    shown = []
    for name, cls in MODELS.items():
        value = (getattr(cls, field) if field in ("learning_rate", "patience")
                 and cls.kind == "gradient" else cls.hyperparameters.get(field))
        if value is not None:
            shown.append(f"{name} {value:g}" if isinstance(value, float) else f"{name} {value}")
    return ", ".join(shown)


@dataclass(frozen=True)
class TrainConfig:
    """Every flag of training/train.py, with its default: the CLI is built from these fields.

    Training defaults: benchmarks/tune_defaults.py on ml-100k, ml-latest-small, citeulike-a and
    a sparse synthetic set (results committed): for the AutoRec family width 200, lr 3e-4 and
    lambda in overlap units 3 (autorec), 2 (ohns-autorec) or 10 (ns-autorec, nce-autorec), each
    model within 90% of its own tuned validation NDCG on every one of them."""

    data: str = option(help="a prepared directory (etl/prepare.py --output)", group=DATA)
    model: str = option("nce-autorec", help="one of " + ", ".join(MODELS), group=DATA,
                        choices=list(MODELS), metavar="MODEL")
    train_splits: str = option("train", group=DATA, choices=TRAIN_SPLITS,
                               help="train: select by validation NDCG with early stopping; "
                                    "train,valid: the protocol's final retraining for exactly "
                                    "--epochs")
    mode: str | None = option(None, group=HYPER, choices=MODES,
                              help="how the two heads train (ns-autorec, nce-autorec; default joint)")
    embed_weight: float | None = option(None, group=HYPER,
                                        help="weight of the embedding head's loss (nce or ns) "
                                             "against the MSE head's (ns-autorec, nce-autorec; "
                                             "default 1, the paper's sum; matters in joint mode: "
                                             "Adam is blind to a step's overall scale)")
    embed_lam: float | None = option(None, group=HYPER,
                                     help="L2 of the embedding head's matrix (ns-autorec, "
                                          "nce-autorec; default --lam)")
    width: int | None = option(None, group=HYPER,
                               help="latent width d: the code, or the factors of bpr and cml "
                                    f"(default: {model_defaults('width')})")
    lam: float | None = option(None, group=HYPER,
                               help="regularisation lambda: the AutoRec family on omega * "
                                    "mean(W^2) per matrix (--lam-units), cdae on "
                                    "mean(W^2) per matrix, bpr on each triple's squared norms, "
                                    "vae-cf on squared weights, nce-plrec the ridge, ease the "
                                    f"diagonal, wrmf Spark's regParam (default: {model_defaults('lam')})")
    lam_units: str | None = option(None, group=HYPER, choices=LAM_UNITS,
                                   help="the AutoRec family's lambda: overlap (default) = "
                                        "times omega, the mean number of training items two "
                                        "users share, so that one value transfers across "
                                        "datasets, with every head's loss per (user, item) "
                                        "entry; plain = lambda * mean(W^2) with the NS head's "
                                        "loss per user (runs before 2026-11-25)")
    rank: int | None = option(None, group=HYPER, help=f"factors kept (default: {model_defaults('rank')})")
    alpha: float | None = option(None, group=HYPER,
                                 help="confidence 1 + alpha of a positive "
                                      f"(default: {model_defaults('alpha')})")
    iterations: int | None = option(None, group=HYPER,
                                    help=f"ALS sweeps (default: {model_defaults('iterations')})")
    hidden: int | None = option(None, group=HYPER,
                                help=f"hidden layer width (default: {model_defaults('hidden')})")
    dropout: float | None = option(None, group=HYPER,
                                   help="input dropout probability, the corruption of a denoising "
                                        f"model (default: {model_defaults('dropout')})")
    kl_cap: float | None = option(None, group=HYPER,
                                  help=f"the KL weight's cap (default: {model_defaults('kl_cap')})")
    anneal_steps: int | None = option(None, group=HYPER,
                                      help="updates over which the KL weight rises from 0 to its "
                                           f"cap (default: {model_defaults('anneal_steps')})")
    margin: float | None = option(None, group=HYPER,
                                  help=f"hinge margin (default: {model_defaults('margin')})")
    neg_ratio: int | None = option(None, group=HYPER,
                                   help="uniform negatives drawn per training positive; cdae: 0 = "
                                        f"the whole row (default: {model_defaults('neg_ratio')})")
    cov_weight: float | None = option(None, group=HYPER,
                                      help="weight of the covariance regulariser, 0 = off "
                                           f"(default: {model_defaults('cov_weight')})")
    beta: float | None = option(None, group=TRAINING,
                                help="NCE popularity exponent; R* is recomputed from the stored "
                                     "popularity when it differs from the ETL's (default: the ETL's)")
    negatives: str = option("etl", group=TRAINING, choices=NEGATIVES,
                            help="etl: the ETL's negative-sample counts; resample: new seeded "
                                 "draws every epoch")
    num_negatives: int | None = option(None, group=TRAINING,
                                       help="draws per user when resampling (default: the ETL's N)")
    lr: float | None = option(None, group=TRAINING,
                              help="Adam learning rate (default: the model's own, "
                                   f"{model_defaults('learning_rate')})")
    finetune_lr: float | None = option(None, group=TRAINING,
                                       help="Adam learning rate of fine-tune phase 2 (default: "
                                            "--lr's)")
    finetune_init: str | None = option(None, group=TRAINING, choices=FINETUNE_INITS,
                                       help="where fine-tune phase 2's predict head starts: ridge "
                                            "(default) = the exact minimiser of its loss on phase "
                                            "1's encoder (one pass over the data; limited "
                                            "fine-tune then starts at its optimum), as-is = as "
                                            "phase 1 left it, untrained (the paper's procedure)")
    batch_size: int = option(128, group=TRAINING, help="users per step over all workers")
    loss_path: str = option("auto", group=TRAINING, choices=LOSS_PATHS,
                            help="the AutoRec family's losses: fast = the exact expansion without "
                                 "the (batch, items) scores; dense = through the scores (the "
                                 "reference, same values and gradients); auto = the cheaper per "
                                 "head and batch size")
    epochs: int = option(200, group=TRAINING,
                         help="most epochs (of phase 2 for the fine-tune modes); early stopping "
                              "ends sooner")
    pretrain_epochs: int = option(0, group=TRAINING,
                                  help="fine-tune phase 1 epochs; 0 = until its loss converges")
    patience: int | None = option(None, group=TRAINING,
                                  help="stop after this many epochs without a better validation "
                                       f"NDCG (default: the model's own, "
                                       f"{model_defaults('patience')})")
    valid_sample: float = option(1.0, group=TRAINING,
                                 help="the fraction of validation users scored each epoch: a "
                                      "fixed subset, the same every epoch and run (1 = all). "
                                      "Scoring every user dominates an epoch at millions of "
                                      "users; 0.1 of Yahoo's 1.8M still measures NDCG to about "
                                      "+-0.001")
    valid_by: str = option("fold-in", group=TRAINING, choices=VALID_BY,
                           help="how BPR, CML and CDAE score validation users: fold-in (as "
                                "scoring does: each row refitted, 60 Adam steps) or trained "
                                "(the users' trained vectors: about 100x cheaper, most of an "
                                "epoch on sparse catalogues; early stopping then watches the "
                                "vectors training fits, and scoring still folds in)")
    seed: int = option(0, group=TRAINING, help="model init, data order, resampling")
    num_workers: int = option(2, group=CLUSTER, help="Ray Train workers (DDP ranks)")
    cpus_per_worker: float = option(0.0, group=CLUSTER,
                                    help="CPUs (and torch threads) per worker; 0 = share the "
                                         "CPUs out")
    use_gpu: bool = option(False, group=CLUSTER, help="one GPU per worker (NCCL)")
    bf16: bool = option(False, group=CLUSTER,
                        help="bf16 autocast on the matrix products (for GPUs; the fast loss's "
                             "expansion and the optimizer stay float32)")
    placement: str = option("PACK", group=CLUSTER, choices=PLACEMENTS,
                            help="PACK fills one node before the next (fast on one machine); "
                                 "SPREAD puts the workers on different nodes first")
    max_failures: int = option(3, group=CLUSTER,
                               help="worker-group restarts from the last checkpoint")
    run_name: str = option("", group=CLUSTER, show_default=False,
                           help="names the checkpoints and the MLflow run; an existing name "
                                "resumes (default: MODEL-MODE-DATASET-TIME)")
    experiment: str = option("", group=CLUSTER, show_default=False,
                             help="MLflow experiment (default: the dataset)")
    output: str = option("", group=CLUSTER, show_default=False,
                         help="parent folder: the run goes to OUTPUT/RUN_NAME (checkpoints, "
                              "model.pt); absolute path or URI (default: ./var/runs, made "
                              "absolute)")
    mlflow_wait: float = option(60.0, group=CLUSTER,
                                help="seconds the end of a run waits for a tracking server that "
                                     "stopped answering; then it stops, with the model saved, and "
                                     "a rerun logs it")
    data_cache: str = option("auto", group=CLUSTER, choices=DATA_CACHE,
                             help="memory: read the user rows once into Ray's object store; "
                                  "stream: re-read them every epoch; auto: memory when they fit "
                                  "in a quarter of the object store")
    # test only: rank 1 exits hard once at the start of this epoch (the older spelling of
    # NCE_TEST_HOOK=training.faults:kill_a_rank:EPOCH, training/hooks.py)
    fault_kill_epoch: int = option(-1, group=CLUSTER, hidden=True, help="")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> TrainConfig:
        return cls(**{k: v for k, v in d.items() if k in {f.name for f in dataclasses.fields(cls)}})

    @property
    def final_retraining(self) -> bool:
        return self.train_splits == "train,valid"

    @property
    def learning_rate(self) -> float:
        """--lr, or the model's own default."""
        return self.lr if self.lr is not None else MODELS[self.model].learning_rate

    @property
    def phase2_start(self) -> str:
        """--finetune-init, or its default (ridge)."""
        return self.finetune_init or "ridge"

    def phase_lr(self, phase: int) -> float:
        """The learning rate of ``phase`` (0-based): fine-tune phase 2 may have its own."""
        return self.finetune_lr if phase > 0 and self.finetune_lr is not None else self.learning_rate

    @property
    def stop_patience(self) -> int:
        """--patience, or the model's own default."""
        return self.patience if self.patience is not None else MODELS[self.model].patience

    def hyperparameters(self) -> dict:
        """The model's hyperparameters (the fields of the HYPER group) as given (None = its
        default, from its class in models/, the one place it lives: not in the dict)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.metadata.get("group") == HYPER and getattr(self, f.name) is not None}

    def resolved(self) -> dict:
        """Every hyperparameter of the model, defaults filled in (what the run logs)."""
        return {**MODELS[self.model].hyperparameters, **self.hyperparameters(),
                **({"lr": self.learning_rate, "patience": self.stop_patience}
                   if MODELS[self.model].kind == "gradient" else {}),
                **({"finetune_lr": self.phase_lr(1), "finetune_init": self.phase2_start}
                   if self.mode in FINETUNE_MODES else {})}


def check(cfg: TrainConfig) -> None:
    """Raise UsageError naming the flag, its value and what to pass instead."""
    def bad(flag: str, value, want: str) -> None:
        raise UsageError(f"--{flag} {value}: {want}")

    if cfg.model not in MODELS:
        bad("model", cfg.model, "no such model; choose one of " + ", ".join(MODELS))
    cls = MODELS[cfg.model]
    for field in cfg.hyperparameters():
        if field not in cls.hyperparameters:
            takes = ", ".join("--" + k.replace("_", "-") for k in cls.hyperparameters) or "none"
            what = ("has one head, so it has no mode (modes apply to ns-autorec and nce-autorec)"
                    if field == "mode" else "does not take it")
            bad(field.replace("_", "-"), getattr(cfg, field),
                f"{cfg.model} {what}; its hyperparameters: {takes}. Drop the flag")
    if cfg.loss_path != "auto" and not hasattr(cls, "dense_loss"):
        bad("loss-path", cfg.loss_path, f"{cfg.model} has one way to compute its loss; only the "
            "AutoRec family has a fast and a dense one. Drop the flag")
    if cfg.valid_by != "fold-in" and not cls.per_user:
        bad("valid-by", cfg.valid_by, f"{cfg.model} has no trained user vectors (only "
            + ", ".join(m for m, c in MODELS.items() if c.per_user) + " have); drop the flag")
    if cfg.mode is not None and cfg.mode not in MODES:
        bad("mode", cfg.mode, "choose one of " + ", ".join(MODES))
    if cfg.width is not None and not 1 <= cfg.width <= 100_000:
        bad("width", cfg.width, "the latent width must be in 1..100000 (the paper: 50..500)")
    if cfg.rank is not None and not 1 <= cfg.rank <= 100_000:
        bad("rank", cfg.rank, "the rank must be in 1..100000")
    if cfg.alpha is not None and not 0 <= cfg.alpha <= 1e6:
        bad("alpha", cfg.alpha, "the confidence weight must be in 0..10^6")
    if cfg.iterations is not None and not 1 <= cfg.iterations <= 10_000:
        bad("iterations", cfg.iterations, "must be in 1..10000")
    if cfg.lam is not None and not 0 <= cfg.lam < 1e6:
        bad("lam", cfg.lam, "lambda must be >= 0 and < 10^6")
    if cfg.embed_lam is not None and not 0 <= cfg.embed_lam < 1e6:
        bad("embed-lam", cfg.embed_lam, "lambda must be >= 0 and < 10^6")
    if cfg.embed_weight is not None and not 0 <= cfg.embed_weight <= 1e6:
        bad("embed-weight", cfg.embed_weight, "a loss weight must be in 0..10^6")
    if cfg.hidden is not None and not 1 <= cfg.hidden <= 100_000:
        bad("hidden", cfg.hidden, "the hidden width must be in 1..100000 (the paper: 600)")
    if cfg.dropout is not None and not 0 <= cfg.dropout < 1:
        bad("dropout", cfg.dropout, "a probability in [0, 1)")
    if cfg.kl_cap is not None and not 0 <= cfg.kl_cap <= 10:
        bad("kl-cap", cfg.kl_cap, "must be in 0..10 (the paper: 0.2; 1 is the full ELBO)")
    if cfg.anneal_steps is not None and cfg.anneal_steps < 1:
        bad("anneal-steps", cfg.anneal_steps, "must be >= 1")
    if cfg.margin is not None and not 0 < cfg.margin <= 4:
        bad("margin", cfg.margin, "must be in (0, 4]: squared distances in the unit ball are at "
            "most 4")
    if cfg.neg_ratio is not None and not 0 <= cfg.neg_ratio <= 10_000:
        bad("neg-ratio", cfg.neg_ratio, "must be in 0..10000")
    if cfg.neg_ratio == 0 and cfg.model != "cdae":
        bad("neg-ratio", 0, f"{cfg.model} needs at least one negative per positive (0, the "
            "whole row, is cdae's)")
    if cfg.cov_weight is not None and not 0 <= cfg.cov_weight < 1e6:
        bad("cov-weight", cfg.cov_weight, "must be >= 0 and < 10^6")
    if cfg.beta is not None and not 0 <= cfg.beta <= 10:
        bad("beta", cfg.beta, "beta must be in 0..10 (the paper: 0.7..1.3)")
    if cfg.negatives not in NEGATIVES:
        bad("negatives", cfg.negatives, "choose etl or resample")
    if cfg.num_negatives is not None and not 0 < cfg.num_negatives <= 10_000_000:
        bad("num-negatives", cfg.num_negatives, "draws per user must be in 1..10^7")
    if cfg.lr is not None and not 0 < cfg.lr <= 1:
        bad("lr", cfg.lr, "the learning rate must be in (0, 1]")
    if cfg.finetune_lr is not None and not 0 < cfg.finetune_lr <= 1:
        bad("finetune-lr", cfg.finetune_lr, "the learning rate must be in (0, 1]")
    if cfg.finetune_init is not None and cfg.finetune_init not in FINETUNE_INITS:
        bad("finetune-init", cfg.finetune_init, "choose ridge or as-is")
    if cfg.finetune_init is not None and cfg.mode not in FINETUNE_MODES:
        bad("finetune-init", cfg.finetune_init, "sets phase 2 of --mode limited-finetune or "
            "full-finetune; other modes have one phase. Drop the flag or pass such a mode")
    if cfg.finetune_lr is not None and cfg.mode not in FINETUNE_MODES:
        bad("finetune-lr", cfg.finetune_lr, "sets phase 2 of --mode limited-finetune or "
            "full-finetune; other modes have one phase. Drop the flag or pass such a mode")
    if not 1 <= cfg.batch_size <= 1_000_000:
        bad("batch-size", cfg.batch_size, "must be in 1..10^6")
    if cfg.batch_size < cfg.num_workers:
        bad("batch-size", cfg.batch_size, f"the global batch is split over {cfg.num_workers} "
            "workers: pass at least one user per worker")
    if not 0 < cfg.valid_sample <= 1:
        bad("valid-sample", cfg.valid_sample, "a fraction of the validation users, in (0, 1]")
    if not 1 <= cfg.epochs <= 100_000:
        bad("epochs", cfg.epochs, "must be in 1..100000")
    if cfg.pretrain_epochs < 0:
        bad("pretrain-epochs", cfg.pretrain_epochs, "must be >= 0 (0 = until converged)")
    if cfg.patience is not None and cfg.patience < 1:
        bad("patience", cfg.patience, "must be >= 1")
    if cfg.train_splits not in TRAIN_SPLITS:
        bad("train-splits", cfg.train_splits, "choose train (model selection) or train,valid "
            "(the final retraining with a fixed --epochs)")
    if cfg.final_retraining and cfg.mode in ("limited-finetune", "full-finetune") \
            and cfg.pretrain_epochs == 0:
        bad("pretrain-epochs", 0, "the final retraining has no validation set to detect "
            "convergence: pass phase 1's epoch count from the selection run")
    if cfg.num_workers < 1:
        bad("num-workers", cfg.num_workers, "need at least one worker")
    if cfg.cpus_per_worker < 0:
        bad("cpus-per-worker", cfg.cpus_per_worker, "must be >= 0 (0 = automatic)")
    if cfg.data_cache not in DATA_CACHE:
        bad("data-cache", cfg.data_cache, "choose " + ", ".join(DATA_CACHE))
    if cfg.max_failures < 0:
        bad("max-failures", cfg.max_failures, "must be >= 0")
