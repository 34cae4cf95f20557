"""Everything one training run needs, as one frozen, JSON-able dataclass.

The CLI is built from it (``runtime.cli``: one place for every flag's default and help); the
driver checks it (``check``), logs it to MLflow and ships it to every Ray Train worker; a checkpoint
stores it so that a resumed run can refuse a changed configuration.

Its run-level fields are written here (``RunConfig``); its model fields are generated from the
registered models' declarations (``models.hparams``): one optional field per hyperparameter name,
None meaning the model's own default, checked by the model that takes it, and one field per
training option a model's training policy declares (``Training.options``, models/training.py),
refused for the models that do not take it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from models.hparams import DataShape, Option
from models.registry import MODELS
from models.training import Training
from prepared.errors import UsageError
from runtime.cli import option

NEGATIVES = ("etl", "resample")
TRAIN_SPLITS = ("train", "train,valid")
DATA_CACHE = ("auto", "memory", "stream")
PLACEMENTS = ("PACK", "SPREAD")
VALID_BY = ("fold-in", "trained")
# the run settings only gradient training reads (a closed form is one fit, not epochs of Adam)
GRADIENT_ONLY = ("lr", "batch_size", "epochs", "pretrain_epochs", "patience", "negatives",
                 "num_negatives", "valid_by", "bf16")


# --preset's names and what each model's are (``models.hparams.Presets``)
PRESET_NAMES = list(dict.fromkeys(n for c in MODELS.values() if c.presets for n in c.presets.named))


def as_flags(values: dict) -> str:
    """``{"pos_weight": 10.0, "start_from": "svd"}`` as ``--pos-weight 10 --start-from svd``."""
    return " ".join(f"--{k.replace('_', '-')} " + (f"{v:g}" if isinstance(v, float) else str(v))
                    for k, v in values.items())


PRESETS_HELP = "; ".join(f"{m}: " + ", ".join(
    f"{n} = {as_flags(values)}" for n, values in c.presets.named.items())
    for m, c in MODELS.items() if c.presets) + "; auto = " + " / ".join(
    dict.fromkeys(c.presets.rule for c in MODELS.values() if c.presets))

DATA, HYPER, TRAINING, CLUSTER = ("data and model", "model hyperparameters (a model refuses one it "
                                  "does not take; defaults are the model's own)",
                                  "training (gradient models; a default not given is the "
                                  "model's own)", "cluster, tracking and output")


def model_defaults(field: str, models: dict | None = None) -> str:
    """Each model's default of one hyperparameter, for --help ("autorec 3, ohns-autorec 2, ..."),
    read from the models' classes (``hyperparameters``; ``learning_rate``, ``patience``,
    ``batch_size``: the gradient models' training policies), so the help cannot drift from the
    code."""
    shown = []
    for name, cls in (MODELS if models is None else models).items():
        value = (getattr(cls.trainer, field) if field in ("learning_rate", "patience", "batch_size")
                 and cls.kind == "gradient" else cls.defaults().get(field))
        if value is not None:
            shown.append(f"{name} {value:g}" if isinstance(value, float) else f"{name} {value}")
    return ", ".join(shown)


@dataclass(frozen=True)
class RunConfig:
    """The run-level flags of training/train.py, with their defaults; ``TrainConfig`` adds the
    models' hyperparameters (below). The CLI is built from the fields.

    Training defaults: benchmarks/tune_defaults.py on ml-100k, ml-latest-small, citeulike-a and
    a sparse synthetic set (results committed): for the AutoRec family width 200 and lambda in
    overlap units 3 (autorec), 2 (ohns-autorec) or 10 (ns-autorec, nce-autorec); batch 512 at lr
    1e-3 (ohns-autorec 128 at 3e-4) from benchmarks/batch_defaults.py; each model within 90% of
    its own tuned validation NDCG on ml-100k, ml-latest-small and citeulike-a."""

    data: str = option(help="a prepared directory (etl/prepare.py --output)", group=DATA)
    model: str = option("nce-autorec", help="one of " + ", ".join(MODELS), group=DATA,
                        choices=list(MODELS), metavar="MODEL")
    train_splits: str = option("train", group=DATA, choices=TRAIN_SPLITS,
                               help="train: select by validation NDCG with early stopping; "
                                    "train,valid: the protocol's final retraining for exactly "
                                    "--epochs")
    preset: str | None = option(None, group=TRAINING, choices=["auto", *PRESET_NAMES],
                                help="named settings beside the model (extension beyond the "
                                     "paper: what the searches chose; models/autorec/"
                                     "presets.py): " + PRESETS_HELP.replace("%", "%%")  # argparse's
                                     + "; a flag given "
                                     "beside it wins (default: none, the model as declared)")
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
    batch_size: int | None = option(None, group=TRAINING,
                                    help="users per step over all workers (default: the model's "
                                         f"own, {model_defaults('batch_size')})")
    epochs: int = option(200, group=TRAINING,
                         help="most epochs (of phase 2 for the fine-tune modes); early stopping "
                              "ends sooner; 0 in a final retraining of a model that starts from "
                              "data: the start is the model")
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
                        help="bf16 autocast on the products through the (batch, items) scores "
                             "(for GPUs): the NS head's, and the MSE heads' on their dense loss "
                             "(small batches, or the dense loss path). The AutoRec family's fast "
                             "loss, its encoder and the optimizer stay float32: at its default "
                             "batch sizes --bf16 changes nothing for AutoRec and NCE-AutoRec "
                             "(docs/gpu.md)")
    placement: str = option("PACK", group=CLUSTER, choices=PLACEMENTS,
                            help="PACK fills one node before the next (fast on one machine); "
                                 "SPREAD puts the workers on different nodes first")
    max_failures: int = option(3, group=CLUSTER,
                               help="worker-group restarts from the last checkpoint")
    keep_checkpoints: bool = option(False, group=CLUSTER,
                                    help="keep Ray Train's checkpoints (the training state with "
                                         "the optimizer's moments, and the best epoch's "
                                         "weights) after the run has finished; by default they "
                                         "are deleted then: model.pt holds the best weights, a "
                                         "finished run never resumes, and they take about 0.2 GB "
                                         "a run at width 500 on 7k items")
    run_name: str = option("", group=CLUSTER, show_default=False,
                           help="names the checkpoints and the MLflow run; an existing name "
                                "resumes (default: MODEL-MODE-DATASET-TIME)")
    experiment: str = option("", group=CLUSTER, show_default=False,
                             help="MLflow experiment (default: the dataset)")
    # --runs-dir, not --output: in the Spark stages --output is the output folder itself, here
    # it would be the folder of many runs (issue 29); --output is still taken, with a note
    output: str = option("", group=CLUSTER, show_default=False, flag="runs-dir",
                         renamed_from="output",
                         help="the folder of runs: this one goes to RUNS_DIR/RUN_NAME "
                              "(checkpoints, model.pt); absolute path or URI (default: "
                              "./var/runs, made absolute)", metavar="RUNS_DIR")
    mlflow_wait: float = option(60.0, group=CLUSTER,
                                help="seconds the end of a run waits for a tracking server that "
                                     "stopped answering; then it stops, with the model saved, and "
                                     "a rerun logs it")
    data_cache: str = option("auto", group=CLUSTER, choices=DATA_CACHE,
                             help="memory: read the user rows once into Ray's object store; "
                                  "stream: re-read them every epoch; auto: memory for the "
                                  "training rows and the validation rows each, when the columns "
                                  "read fit in a quarter of the object store")

    #: the order of the groups in --help
    option_groups = (DATA, HYPER, TRAINING, CLUSTER)

    def __post_init__(self):
        # --batch-size not given: the model's own (``Training.batch_size``), resolved here
        # once, so that the loop, the records and a resume all see the number the run uses
        if self.batch_size is None:
            cls = MODELS.get(self.model)
            object.__setattr__(self, "batch_size", (cls.trainer if cls is not None
                                                    else Training).batch_size)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> RunConfig:
        return cls(**{k: v for k, v in d.items() if k in {f.name for f in dataclasses.fields(cls)}})

    @property
    def final_retraining(self) -> bool:
        return self.train_splits == "train,valid"

    @property
    def learning_rate(self) -> float:
        """--lr, or the model's own default."""
        return self.lr if self.lr is not None else MODELS[self.model].trainer.learning_rate

    @property
    def stop_patience(self) -> int:
        """--patience, or the model's own default."""
        return self.patience if self.patience is not None else MODELS[self.model].trainer.patience

    def hyperparameters(self) -> dict:
        """The model's hyperparameters (the fields of the HYPER group) as given (None = its
        default, from its class in models/, the one place it lives: not in the dict)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.metadata.get("group") == HYPER and getattr(self, f.name) is not None}

    def training_options(self) -> dict:
        """Every training option a model's policy declares (``Training.options``), as given
        (None or its default where not)."""
        return {name: getattr(self, name) for name in declared_options(MODELS)}

    def logged_params(self) -> dict:
        """The run's MLflow parameters: its settings and the model's own hyperparameters and
        training options as it uses them (``resolved``), not the other models' (their None), nor
        the settings a closed form does not read (lr, epochs, ...). A setting left unset (None:
        "the ETL's" beta and N) is left out; the run logs the value it stands for beside."""
        cls, own = MODELS[self.model], self.resolved()
        others = {f.name for f in dataclasses.fields(self) if f.metadata.get("group") == HYPER}
        others |= set(declared_options(MODELS))
        if cls.kind != "gradient":
            others |= set(GRADIENT_ONLY)
        generic = {k: v for k, v in self.to_dict().items() if k not in others and v is not None}
        # the model's own training options that apply to it (--loss-path for the AutoRec
        # family), as given or their default; ``resolved`` fills in those whose None stands
        # for something
        hp = {**cls.defaults(), **self.hyperparameters()}
        taken = {k: v for k, v in self.training_options().items() if v is not None
                 and k in cls.trainer.options and cls.trainer.takes_option(k, hp)}
        return {**generic, **taken, **own}

    def resolved(self) -> dict:
        """Every hyperparameter of the model, defaults filled in, and the training options that
        apply to it as the run uses them (what the run logs)."""
        cls = MODELS[self.model]
        hp = {**cls.defaults(), **self.hyperparameters()}
        return {**hp, **({"lr": self.learning_rate, "patience": self.stop_patience}
                         if cls.kind == "gradient" else {}),
                **cls.trainer.resolved_options(self.training_options(), hp, self.learning_rate)}


def hyper_fields(models: dict) -> list[tuple[str, str, dataclasses.Field]]:
    """One optional field per hyperparameter name the models declare (first declared, first),
    with the help and type the models share, every choice any of them allows, and each model's
    default in the help. A name declared with two types or two helps is a mistake in models/."""
    declared: dict[str, list] = {}
    for cls in models.values():
        for name, hp in cls.hyperparameters.items():
            declared.setdefault(name, []).append(hp)
    out = []
    for name, hps in declared.items():
        kinds, helps = {hp.kind for hp in hps}, {hp.help for hp in hps}
        if len(kinds) > 1 or len(helps) > 1:
            raise TypeError(f"hyperparameter {name!r} is declared with {len(kinds)} types and "
                            f"{len(helps)} helps across models; a shared flag needs one of each")
        choices = list(dict.fromkeys(c for hp in hps for c in hp.choices or ())) or None
        shown = model_defaults(name, models)
        text = hps[0].help + (f" (default: {shown})" if shown else "")
        out.append((name, f"{hps[0].kind.__name__} | None",
                    option(None, group=HYPER, choices=choices, help=text)))
    return out


def declared_options(models: dict) -> dict[str, Option]:
    """Every training option the models declare, by name (first declared, first). Models that
    share a name share its declaration's type, default and help; two are a mistake in models/."""
    declared: dict[str, Option] = {}
    for name, cls in models.items():
        for key, opt in cls.trainer.options.items():
            first = declared.setdefault(key, opt)
            if (first.kind, first.default, first.help) != (opt.kind, opt.default, opt.help):
                raise TypeError(f"training option {key!r} of {name} is declared with another "
                                "type, default or help than another model's; a shared flag needs "
                                "one of each")
    return declared


def option_fields(models: dict) -> list[tuple[str, str, dataclasses.Field]]:
    """One field per training option the models declare, with its default and help, and the
    models that take it named in the help."""
    out = []
    for name, opt in declared_options(models).items():
        takers = ", ".join(m for m, c in models.items() if name in c.trainer.options)
        kind = opt.kind.__name__ + (" | None" if opt.default is None else "")
        out.append((name, kind, option(opt.default, group=TRAINING, choices=opt.choices,
                                       help=f"{opt.help} ({takers} only)")))
    return out


def resumable_options(models: dict | None = None) -> set[str]:
    """The training options a resumed run may change (how it computes, not what it trains)."""
    return {name for name, opt in declared_options(MODELS if models is None else models).items()
            if opt.resumable}


TrainConfig = dataclasses.make_dataclass(
    "TrainConfig", hyper_fields(MODELS) + option_fields(MODELS), bases=(RunConfig,), frozen=True,
    namespace={"__doc__": "Every flag of training/train.py: ``RunConfig``'s, one per model "
                          "hyperparameter (``hyper_fields``), each None unless given, and one per "
                          "training option a model declares (``option_fields``)."})
TrainConfig.__module__ = __name__  # pickles and reprs as training.config.TrainConfig


def check(cfg: TrainConfig) -> None:
    """Raise UsageError naming the flag, its value and what to pass instead."""
    def bad(flag: str, value, want: str) -> None:
        raise UsageError(f"--{flag} {value}: {want}")

    if cfg.model not in MODELS:
        bad("model", cfg.model, "no such model; choose one of " + ", ".join(MODELS))
    cls = MODELS[cfg.model]
    for field, value in cfg.hyperparameters().items():
        flag, hp = field.replace("_", "-"), cls.hyperparameters.get(field)
        if hp is None:
            takes = ", ".join("--" + k.replace("_", "-") for k in cls.hyperparameters) or "none"
            others = [m for m, c in MODELS.items() if field in c.hyperparameters]
            bad(flag, value, f"{cfg.model} does not take it (only {', '.join(others)} do); its "
                f"hyperparameters: {takes}. Drop the flag")
        problem = hp.problem(value)
        if problem:
            bad(flag, value, problem)
    if cfg.preset is not None:
        preset_named(cfg.model, cfg.preset)
    hp = {**cls.defaults(), **cfg.hyperparameters()}
    for field, opt in declared_options(MODELS).items():
        value = getattr(cfg, field)
        if value == opt.default:
            continue
        problem = opt.problem(value)
        if problem:
            bad(field.replace("_", "-"), value, problem)
        if not cls.trainer.takes_option(field, hp):
            takers = ", ".join(m for m, c in MODELS.items() if field in c.trainer.options)
            bad(field.replace("_", "-"), value, opt.refused.format(model=cfg.model, takers=takers))
    problem = cls.trainer.combination_problem(hp, cfg.training_options())
    if problem:
        raise UsageError(problem)
    if cfg.valid_by != "fold-in" and not cls.per_user:
        bad("valid-by", cfg.valid_by, f"{cfg.model} has no trained user vectors (only "
            + ", ".join(m for m, c in MODELS.items() if c.per_user) + " have); drop the flag")
    if cfg.beta is not None and not 0 <= cfg.beta <= 10:
        bad("beta", cfg.beta, "beta must be in 0..10 (the paper: 0.7..1.3)")
    if cfg.negatives not in NEGATIVES:
        bad("negatives", cfg.negatives, "choose etl or resample")
    if cfg.num_negatives is not None and not 0 < cfg.num_negatives <= 10_000_000:
        bad("num-negatives", cfg.num_negatives, "draws per user must be in 1..10^7")
    if cfg.lr is not None and not 0 < cfg.lr <= 1:
        bad("lr", cfg.lr, "the learning rate must be in (0, 1]")
    if not 1 <= cfg.batch_size <= 1_000_000:
        bad("batch-size", cfg.batch_size, "must be in 1..10^6")
    if cfg.batch_size < cfg.num_workers:
        bad("batch-size", cfg.batch_size, f"the global batch is split over {cfg.num_workers} "
            "workers: pass at least one user per worker")
    if not 0 < cfg.valid_sample <= 1:
        bad("valid-sample", cfg.valid_sample, "a fraction of the validation users, in (0, 1]")
    # 0 epochs: the start itself, for a final retraining whose chosen epoch was the start's
    least = 0 if cfg.final_retraining and cls.trainer.starts_from_data(cfg) else 1
    if not least <= cfg.epochs <= 100_000:
        bad("epochs", cfg.epochs, "must be in 1..100000 (0 only for a final retraining "
            "(--train-splits train,valid) of a model that starts from data, such as the "
            "AutoRec family's SVD start: the start is the model)")
    if cfg.pretrain_epochs < 0:
        bad("pretrain-epochs", cfg.pretrain_epochs, "must be >= 0 (0 = until converged)")
    if cfg.patience is not None and cfg.patience < 1:
        bad("patience", cfg.patience, "must be >= 1")
    if cfg.train_splits not in TRAIN_SPLITS:
        bad("train-splits", cfg.train_splits, "choose train (model selection) or train,valid "
            "(the final retraining with a fixed --epochs)")
    if cfg.final_retraining and cfg.pretrain_epochs == 0 \
            and cls.trainer.converges_a_phase(hp, cfg.training_options()):
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


def data_shape(prep) -> DataShape:
    """The training data's shape as a preset's rule reads it (``prepared.reader.Prepared``): the
    warm users, the items, and the warm users' train positives."""
    counts = prep.manifest["counts"]
    users = counts.get("warm_users", prep.n_users - counts.get("cold_users", 0))
    return DataShape(users=int(users), items=prep.n_items, positives=int(prep.pop_train.sum()))


def preset_named(model: str, name: str, shape: DataShape | None = None) -> str:
    """The preset ``--preset name`` stands for (``auto``: the model's rule on ``shape``; None:
    not known yet, ``auto`` returned as is); a model without presets, or a name it lacks, is a
    UsageError naming the choices."""
    presets = MODELS[model].presets
    if presets is None:
        takers = ", ".join(m for m, c in MODELS.items() if c.presets)
        raise UsageError(f"--preset {name}: {model} has no presets (only {takers} have); drop "
                         "the flag")
    if name == "auto":
        return name if shape is None else presets.choose(shape)
    if name not in presets.named:
        raise UsageError(f"--preset {name}: {model} has no such preset; choose auto or one of "
                         + ", ".join(presets.named))
    return name


def with_preset(settings: dict, given: frozenset[str] | None, shape: DataShape | None
                ) -> tuple[dict, str]:
    """``settings`` (a TrainConfig's fields as parsed) with its ``preset`` applied to the fields
    not in ``given`` (those the command line or --config set; None: every field whose value is
    not its default), the preset's name resolved (``auto`` by the model's rule on the data's
    ``shape``, which only ``auto`` needs); and a line saying what it set. Without a preset,
    ``settings`` as they are."""
    name = settings.get("preset")
    if name is None:
        return settings, ""
    if name == "auto" and shape is None:
        raise ValueError("--preset auto needs the data's shape")
    chosen = preset_named(settings["model"], name, shape)
    if given is None:
        defaults = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
        given = frozenset(k for k, v in settings.items() if v != defaults.get(k))
    values = MODELS[settings["model"]].presets.named[chosen]
    applied = {k: v for k, v in values.items() if k not in given}
    why = (f" (train density {shape.density:.3%}; {MODELS[settings['model']].presets.rule})"
           if name == "auto" else "")
    kept = [k for k in values if k in given]
    line = (f"preset {chosen}{why}: {as_flags(applied)}"
            + (f"; kept as given: {', '.join('--' + k.replace('_', '-') for k in kept)}" if kept else ""))
    return {**settings, **applied, "preset": chosen}, line
