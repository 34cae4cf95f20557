"""The AutoRec family's presets: what the fair searches of issue 57 chose, as one flag
(``--preset sparse|dense|auto``; extensions beyond the paper, whose model is ``--model
nce-autorec`` without a preset).

No one configuration won on every set; which lever wins follows the data's density (train
positives / (warm users x items)), measured on the four searched sets
(``benchmarks/results/experiment-*``, choices on validation, finals on test with 3 seeds):

    set               train density   the family's winning lever
    Gowalla           0.06%           confidence on positives (--pos-weight 10), random start
    citeulike-a       0.11%           confidence on positives (--pos-weight 10), random start
    ml-latest-small   0.72%           the SVD start at lambda 1000-3000 (--pos-weight lowers it)
    ml-100k           2.1%            the SVD start at lambda 1000 (--pos-weight lowers it)

On the sparse sets a row's few positives are ~0.1% of the predict head's squared error, and
without weighing them up the family fell below popularity (collapse.md); on the denser sets
confidence cost 2-5% of validation NDCG and the start from the linear closed form (PLRec /
NCE-PLRec with a ReLU on the code) was the family's best, level with the closed forms. The
boundary, 0.3%, is the geometric middle of the two nearest sets (0.11% and 0.72%): a set between
them is untested. Each preset is the searches' choice rounded to what both sets of its side
chose (width 500 everywhere: width 1000 did not carry its validation gain to Gowalla's test).
``benchmarks/preset_check.py`` checks the rule on generated sets no search saw.
"""

from __future__ import annotations

from models.hparams import DataShape, Presets

SPARSE_BELOW = 0.003  # train density under which confidence on positives is the lever

RULE = (f"sparse below {SPARSE_BELOW:.1%} train density (positives / (users x items)), else "
        "dense")


def by_density(shape: DataShape) -> str:
    return "sparse" if shape.density < SPARSE_BELOW else "dense"


# the dense sets' choice: epoch 0 is (NCE-)PLRec with a ReLU on the code; lr 1e-4 keeps it or
# adds a little (experiment-ml-100k-start, experiment-ml-latest-small-start)
DENSE = {"start_from": "svd", "width": 500, "lam": 1000.0, "lr": 1e-4}

AUTOREC = Presets(
    named={"sparse": {"width": 500, "lam": 3.0, "pos_weight": 10.0},  # Gowalla's lambda
           "dense": DENSE},
    choose=by_density, rule=RULE)

NCE_AUTOREC = Presets(
    named={"sparse": {"width": 500, "lam": 10.0, "pos_weight": 10.0},  # both sets' lambda
           "dense": DENSE},
    choose=by_density, rule=RULE)
