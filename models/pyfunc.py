"""A trained model as an MLflow pyfunc ("models from code"): weights only, no pickled code.

    model = mlflow.pyfunc.load_model("models:/m-...")
    top = model.predict(pd.DataFrame({"train_items": [[3, 17, 42], [5]]}), params={"k": 10})
    # top["items"][i]: the user's k best item indices (training items excluded), top["scores"][i]

Input rows are users' input item indices (``train_items`` of the prepared ``rows/``), so a batch of
user rows is scored exactly as training's validation and Spark scoring do, for any model of
``models.registry``.
"""

from __future__ import annotations

import mlflow.pyfunc
import pandas as pd

from models.batch import sparse_rows
from models.registry import build, load_weights_only
from prepared.protocol import TOP_K

CHUNK = 1024  # users scored at once: bounded memory, CHUNK x n_items scores


class Recommender(mlflow.pyfunc.PythonModel):
    def load_context(self, context) -> None:
        cfg = context.model_config
        self.model = build(cfg["model"], cfg["model_args"])
        state = load_weights_only(context.artifacts["weights"], "the model's weights")
        self.model.load_state_dict(state)
        self.model.eval()

    def predict(self, context, model_input: pd.DataFrame, params: dict | None = None) -> pd.DataFrame:
        params = params or {}
        k, exclude_seen = int(params.get("k", TOP_K)), bool(params.get("exclude_seen", True))
        rows = list(model_input["train_items"])
        items_out, scores_out = [], []
        for lo in range(0, len(rows), CHUNK):
            items, offsets = sparse_rows(rows[lo:lo + CHUNK])
            scores, top = self.model.recommend(items, offsets, k, exclude_seen)
            items_out += top.tolist()
            scores_out += scores.tolist()
        return pd.DataFrame({"items": items_out, "scores": scores_out})


mlflow.models.set_model(Recommender())
