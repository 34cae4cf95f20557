"""The trained model as an MLflow pyfunc ("models from code"): weights only, no pickled code.

    model = mlflow.pyfunc.load_model("models:/m-...")
    top = model.predict(pd.DataFrame({"train_items": [[3, 17, 42], [5]]}), params={"k": 10})
    # top["items"][i]: the user's k best item indices (training items excluded), top["scores"][i]

Input rows are users' training item indices (``train_items`` of the prepared ``rows/``), so a
batch of user rows is scored exactly as training's validation does.
"""

from __future__ import annotations

import mlflow.pyfunc
import numpy as np
import pandas as pd
import torch

from training.models import AutoRec


class AutoRecRecommender(mlflow.pyfunc.PythonModel):
    def load_context(self, context) -> None:
        cfg = context.model_config
        self.model = AutoRec(int(cfg["n_items"]), int(cfg["width"]), tuple(cfg["heads"]))
        state = torch.load(context.artifacts["weights"], map_location="cpu", weights_only=True)
        self.model.load_state_dict(state)
        self.model.eval()
        self.head = cfg["recommend_head"]

    @torch.no_grad()
    def predict(self, context, model_input: pd.DataFrame, params: dict | None = None) -> pd.DataFrame:
        params = params or {}
        k = min(int(params.get("k", 50)), self.model.n_items)
        exclude_seen = bool(params.get("exclude_seen", True))
        rows = [np.asarray(r, dtype=np.int64) for r in model_input["train_items"]]
        items_out, scores_out = [], []
        for lo in range(0, len(rows), 1024):  # bounded memory: 1024 x n_items scores at a time
            chunk = rows[lo:lo + 1024]
            lengths = np.array([len(r) for r in chunk])
            offsets = torch.from_numpy(np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64))
            flat = torch.from_numpy(np.concatenate(chunk) if len(chunk) else np.zeros(0, np.int64))
            scores = self.model(flat, offsets, (self.head,))[self.head]
            if exclude_seen and len(flat):
                rows_of = torch.repeat_interleave(torch.arange(len(chunk)), torch.from_numpy(lengths))
                scores[rows_of, flat] = -torch.inf
            top = torch.topk(scores, k, dim=1)
            items_out += top.indices.tolist()
            scores_out += top.values.tolist()
        return pd.DataFrame({"items": items_out, "scores": scores_out})


mlflow.models.set_model(AutoRecRecommender())
