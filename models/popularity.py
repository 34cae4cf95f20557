import torch

from models.closed_form import ClosedForm


class Popularity(ClosedForm):
    """Every user gets the most popular training items: the floor any model must beat."""

    name = "popularity"
    hyperparameters = {}

    def __init__(self, n_items: int):
        super().__init__()
        self.n_items = n_items
        self.register_buffer("counts", torch.zeros(n_items))

    def model_args(self) -> dict:
        return {"n_items": self.n_items}

    def fit(self, train, rstar=None, seed: int = 0) -> dict:
        self.counts.copy_(torch.from_numpy(train.sum(axis=0).A1))
        return {}

    def score(self, items, offsets):
        return self.counts.expand(len(offsets), -1).clone()
