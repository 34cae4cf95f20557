"""A trained model as an MLflow pyfunc ("models from code"): weights only, no pickled code.

    model = mlflow.pyfunc.load_model("models:/NAME@champion")
    top = model.predict(pd.DataFrame({"item_ids": [["50", "172"], ["1"]]}), params={"k": 10})
    # top["item_ids"][i]: user i's k best items by the dataset's ids (their history left out),
    # top["item_indices"][i] the same as indices, top["scores"][i], top["unknown_items"][i]
    # (ids the model does not know: refused, or with params={"unknown_items": "ignore"} counted)

The request is checked by ``models/serving.py`` (what is accepted, and when unknown ids in a
history are ignored and counted); a bad one raises an ``MlflowException`` with its message, which
``mlflow models serve`` answers as HTTP 400. This file is what MLflow runs to load the model for a
service; the project's own loaders never run it (``evaluation/model_source.py``).
"""

from __future__ import annotations

import logging
import re
import threading

import mlflow.pyfunc
import pandas as pd
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE

from models import serving
from models.batch import sparse_rows
from models.registry import fitted, load_weights_only

CHUNK = 1024  # users scored at once: bounded memory, CHUNK x n_items scores


class DroppedParams(logging.Filter):
    """MLflow drops the params of a request that its signature does not declare, with a warning
    and nothing else (``mlflow.models.utils._enforce_params_schema``): a misspelt ``"K"`` would be
    served as k = 50. The warning is logged in the thread that then calls ``predict``, which
    refuses the request with the names it read here. Its own words are matched: if MLflow
    rewords it, ``tests/evaluation/test_model_store.py``'s misspelt-param requests fail."""

    WORDS = re.compile(r"^Unrecognized params \[(.*?)\] are ignored")

    def __init__(self) -> None:
        super().__init__()
        self.seen = threading.local()

    def filter(self, record: logging.LogRecord) -> bool:
        found = self.WORDS.match(record.getMessage())
        if found:
            self.seen.names = [n.strip(" '\"") for n in found.group(1).split(",")]
        return True

    def take(self) -> list[str]:
        names, self.seen.names = getattr(self.seen, "names", None) or [], None
        return names


DROPPED = DroppedParams()


def watch_dropped_params() -> None:
    log = logging.getLogger("mlflow.models.utils")
    if DROPPED not in log.filters:
        log.addFilter(DROPPED)
    if log.getEffectiveLevel() > logging.WARNING:  # a filter sees only records logged
        log.setLevel(logging.WARNING)


class Recommender(mlflow.pyfunc.PythonModel):
    def load_context(self, context) -> None:
        import pyarrow.parquet as pq

        cfg = context.model_config
        state = load_weights_only(context.artifacts[serving.WEIGHTS], "the model's weights")
        self.model = fitted(cfg["model"], cfg["model_args"], state, "the model").eval()
        path = context.artifacts.get(serving.ITEM_IDS)
        self.ids = serving.ItemIds(pq.read_table(path).column(0).to_pylist()) if path else None
        watch_dropped_params()

    def predict(self, context, model_input: pd.DataFrame, params: dict | None = None) -> pd.DataFrame:
        dropped = DROPPED.take()
        try:
            if dropped:
                raise ValueError(serving.unknown_params(dropped))
            rows, unknown, k, exclude_seen = serving.parse(model_input, self.model.n_items,
                                                           self.ids, params)
        except ValueError as e:
            raise MlflowException(str(e), error_code=INVALID_PARAMETER_VALUE) from None
        indices, scores = [], []
        for lo in range(0, len(rows), CHUNK):
            items, offsets = sparse_rows(rows[lo:lo + CHUNK])
            values, top = self.model.recommend(items, offsets, k, exclude_seen)
            for v, t in zip(values, top):
                keep = v > -float("inf")  # fewer than k unseen items: a shorter list, not padding
                indices.append(t[keep].tolist())
                scores.append(v[keep].tolist())
        out = {"item_indices": indices, "scores": scores, "unknown_items": unknown}
        if self.ids is not None:
            out = {"item_ids": [self.ids.ids[row].tolist() for row in indices], **out}
        return pd.DataFrame(out)


mlflow.models.set_model(Recommender())
