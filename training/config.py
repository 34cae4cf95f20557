"""Everything one training run needs, as one frozen, JSON-able dataclass.

The driver builds it from the CLI, checks it (``check``), logs it to MLflow and ships it to every
Ray Train worker; a checkpoint stores it so that a resumed run can refuse a changed configuration.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from etl.errors import UsageError
from models.autorec import MODES
from models.registry import MODELS

NEGATIVES = ("etl", "resample")
TRAIN_SPLITS = ("train", "train,valid")
DATA_CACHE = ("auto", "memory", "stream")
PLACEMENTS = ("PACK", "SPREAD")


# the model's hyperparameters: None = the model's own default (``hyperparameters`` of its class
# in models/, the one place a model's default lives); a model refuses one it does not take
MODEL_FIELDS = ("width", "lam", "mode", "rank")


@dataclass(frozen=True)
class TrainConfig:
    # Training defaults: benchmarks/tune_defaults.py on ml-100k and ml-latest-small (results
    # committed): for the AutoRec family width 200, lr 3e-4, lambda 30 has the best worst case
    # (97.7% of the best NDCG of each model on each dataset).
    data: str                       # prepared directory (absolute path or URI)
    model: str = "nce-autorec"
    mode: str | None = None         # two-headed AutoRecs: joint (default) | alternating | ...
    width: int | None = None        # latent width d (AutoRec family)
    lam: float | None = None        # regularisation weight; its meaning is the model's
    rank: int | None = None         # closed-form low-rank models: factors kept
    beta: float | None = None       # None = the ETL's beta (R* as stored)
    negatives: str = "etl"          # etl: the ETL's counts; resample: new draws every epoch
    num_negatives: int | None = None  # draws per user when resampling; None = the ETL's N
    lr: float = 3e-4
    batch_size: int = 128           # global: split evenly over the workers
    epochs: int = 200               # most epochs of the (last) phase; early stopping ends sooner
    pretrain_epochs: int = 0        # fine-tune phase 1: 0 = until its loss converges
    patience: int = 5               # early stopping on validation NDCG (epochs without a gain)
    seed: int = 0
    train_splits: str = "train"     # "train,valid": the protocol's final retraining
    num_workers: int = 2
    cpus_per_worker: float = 0.0    # 0 = share the local CPUs out
    use_gpu: bool = False
    placement: str = "PACK"         # PACK: fill nodes in turn; SPREAD: one worker per node first
    run_name: str = ""
    experiment: str = ""            # MLflow experiment; "" = the dataset's name
    output: str = ""                # Ray Train storage (checkpoints); absolute path or URI
    max_failures: int = 3
    mlflow_wait: float = 60.0       # seconds the end of a run waits for a tracking server that is down
    data_cache: str = "auto"        # auto | memory | stream (see feed.fits_in_object_store)
    fault_kill_epoch: int = -1      # test only: rank 1 exits hard once at the start of this epoch

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> TrainConfig:
        return cls(**{k: v for k, v in d.items() if k in {f.name for f in dataclasses.fields(cls)}})

    @property
    def final_retraining(self) -> bool:
        return self.train_splits == "train,valid"

    def hyperparameters(self) -> dict:
        """The model's hyperparameters as given (None = its default: not in the dict)."""
        return {k: getattr(self, k) for k in MODEL_FIELDS if getattr(self, k) is not None}

    def resolved(self) -> dict:
        """Every hyperparameter of the model, defaults filled in (what the run logs)."""
        return {**MODELS[self.model].hyperparameters, **self.hyperparameters()}


def check(cfg: TrainConfig) -> None:
    """Raise UsageError naming the flag, its value and what to pass instead."""
    def bad(flag: str, value, want: str) -> None:
        raise UsageError(f"--{flag} {value}: {want}")

    if cfg.model not in MODELS:
        bad("model", cfg.model, "no such model; choose one of " + ", ".join(MODELS))
    cls = MODELS[cfg.model]
    for field in cfg.hyperparameters():
        if field not in cls.hyperparameters:
            takes = ", ".join("--" + k for k in cls.hyperparameters) or "none"
            what = ("has one head, so it has no mode (modes apply to ns-autorec and nce-autorec)"
                    if field == "mode" else "does not take it")
            bad(field.replace("_", "-"), getattr(cfg, field),
                f"{cfg.model} {what}; its hyperparameters: {takes}. Drop the flag")
    if cfg.mode is not None and cfg.mode not in MODES:
        bad("mode", cfg.mode, "choose one of " + ", ".join(MODES))
    if cfg.width is not None and not 1 <= cfg.width <= 100_000:
        bad("width", cfg.width, "the latent width must be in 1..100000 (the paper: 50..500)")
    if cfg.rank is not None and not 1 <= cfg.rank <= 100_000:
        bad("rank", cfg.rank, "the rank must be in 1..100000")
    if cfg.lam is not None and not 0 <= cfg.lam < 1e6:
        bad("lam", cfg.lam, "lambda must be >= 0 and < 10^6")
    if cfg.beta is not None and not 0 <= cfg.beta <= 10:
        bad("beta", cfg.beta, "beta must be in 0..10 (the paper: 0.7..1.3)")
    if cfg.negatives not in NEGATIVES:
        bad("negatives", cfg.negatives, "choose etl or resample")
    if cfg.num_negatives is not None and not 0 < cfg.num_negatives <= 10_000_000:
        bad("num-negatives", cfg.num_negatives, "draws per user must be in 1..10^7")
    if not 0 < cfg.lr <= 1:
        bad("lr", cfg.lr, "the learning rate must be in (0, 1]")
    if not 1 <= cfg.batch_size <= 1_000_000:
        bad("batch-size", cfg.batch_size, "must be in 1..10^6")
    if cfg.batch_size < cfg.num_workers:
        bad("batch-size", cfg.batch_size, f"the global batch is split over {cfg.num_workers} "
            "workers: pass at least one user per worker")
    if not 1 <= cfg.epochs <= 100_000:
        bad("epochs", cfg.epochs, "must be in 1..100000")
    if cfg.pretrain_epochs < 0:
        bad("pretrain-epochs", cfg.pretrain_epochs, "must be >= 0 (0 = until converged)")
    if cfg.patience < 1:
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
