"""VAE-CF: the multinomial variational autoencoder of Liang, Krishnan, Hoffman and Jebara,
"Variational Autoencoders for Collaborative Filtering", WWW 2018 (Mult-VAE^PR).

For a user's binary row x (n items):

    encoder    h = tanh(W_1 (dropout(x / |x|_2)) + b_1); mu, log sigma^2 = W_2 h + b_2  (d each)
    sample     z = mu + sigma * eps  (training);  z = mu  (scoring)
    decoder    logits = W_4 tanh(W_3 z + b_3) + b_4;  pi = softmax(logits)
    loss       -sum_j x_j log pi_j + beta_t * KL(q(z|x) || N(0, I)), averaged over the batch
               (+ lam * sum of squared weights, the paper's L2; 0 by default as in its Mult-VAE)

``hidden`` is 600 and ``width`` (the code d) 200 as in the paper; input dropout 0.5. The KL weight
rises linearly with the number of updates, beta_t = min(kl_cap, t / anneal_steps), from 0 to its
cap (the paper's "partially regularised" Mult-VAE, cap 0.2). Scores are the logits of the mean code
(softmax is monotone, so they rank as pi does).

Deviations, all to fit this project's shapes, none to the model:
- ``anneal_steps`` defaults to 2000 updates, not the paper's 200,000: the paper's count is for
  ML-20M's 116k users at batch 500 (about 860 epochs); at this project's data sizes and batch 128
  the cap would never be reached. The update counter is the training policy's (``VAETraining``,
  its one step a ``KLSchedule``), saved in every checkpoint, so a resumed run continues the
  schedule; every DDP rank counts the same updates.
- The input layer reads the sparse row (an EmbeddingBag with per-item weights 1/|x|_2, dropped items
  weighted 0 and kept ones 1/(1-p), as inverted dropout of the normalised row is), so the (B, n)
  input is never formed; the decoder's (B, n) logits are inherent to the multinomial likelihood.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from models.base import Recommender
from models.batch import Batch, row_ids
from models.hparams import (
    DROPOUT_HELP,
    HP,
    LAM_HELP,
    PAPER_CORRUPTION,
    PAPER_LAMBDAS,
    PAPER_WIDTHS,
    WIDTH_HELP,
)
from models.losses import densify
from models.training import Training


class KLSchedule:
    """The KL weight's schedule, beta_t = min(cap, t / steps) after t updates: the one step of a
    VAE-CF phase, advanced by each training forward. A plain object, not a dataclass: DDP hands
    it to the forward as it is, where it would rebuild a dataclass on the way."""

    def __init__(self, cap: float, steps: int, updates: int = 0):
        self.cap, self.steps, self.updates = float(cap), int(steps), int(updates)

    def weight(self) -> float:
        return min(self.cap, self.updates / self.steps)


class VAETraining(Training):
    """One phase of one step, the ``KLSchedule``, whose position the checkpoint keeps."""

    regularisers = frozenset({"kl", "l2"})  # the KL weight rises from 0: its term may too
    learning_rate = 1e-3  # the paper's Adam rate; probed on ml-100k validation

    def __init__(self, model: VAECF, options=None):
        super().__init__(model, options)
        self.schedule = KLSchedule(model.kl_cap, model.anneal_steps)

    def phases(self) -> list[list[KLSchedule]]:
        return [[self.schedule]]

    def state_dict(self) -> dict:
        return {"updates": self.schedule.updates}

    def load_state_dict(self, state: dict) -> None:
        self.schedule.updates = int(state["updates"])


class VAECF(Recommender):
    name = "vae-cf"
    hyperparameters = {
        "width": HP(200, WIDTH_HELP, lo=1, hi=100_000, search={"paper": PAPER_WIDTHS}),
        "hidden": HP(600, "hidden layer width", lo=1, hi=100_000, why="the paper: 600"),
        "dropout": HP(0.5, DROPOUT_HELP, lo=0, hi=1, open_hi=True,
                      search={"paper": PAPER_CORRUPTION, "small": [0.2, 0.5]}),
        "kl_cap": HP(0.2, "the KL weight's cap", lo=0, hi=10,
                     why="the paper: 0.2; 1 is the full ELBO"),
        "anneal_steps": HP(2000, "updates over which the KL weight rises from 0 to its cap", lo=1),
        "lam": HP(0.0, LAM_HELP, lo=0, hi=1e6, open_hi=True, search={"paper": PAPER_LAMBDAS}),
    }
    trainer = VAETraining

    def __init__(self, n_items: int, width: int, hidden: int, dropout: float, kl_cap: float,
                 anneal_steps: int, lam: float):
        super().__init__()
        if n_items < 1 or width < 1 or hidden < 1 or not 0 <= dropout < 1 or kl_cap < 0 \
                or anneal_steps < 1 or lam < 0:
            raise ValueError(f"need n_items, width, hidden, anneal_steps >= 1, 0 <= dropout < 1, "
                             f"kl_cap, lam >= 0; got {n_items}, {width}, {hidden}, "
                             f"{anneal_steps}, {dropout}, {kl_cap}, {lam}")
        self.n_items, self.width, self.hidden = n_items, width, hidden
        self.dropout, self.kl_cap, self.anneal_steps = float(dropout), float(kl_cap), anneal_steps
        self.lam = float(lam)
        self.encoder_in = nn.EmbeddingBag(n_items, hidden, mode="sum")
        self.encoder_bias = nn.Parameter(torch.zeros(hidden))
        self.encoder_out = nn.Linear(hidden, 2 * width)
        self.decoder = nn.Sequential(nn.Linear(width, hidden), nn.Tanh(), nn.Linear(hidden, n_items))
        # Xavier-uniform weights as the paper's code; the sparse input layer is n_items -> hidden
        bound = math.sqrt(6.0 / (n_items + hidden))
        nn.init.uniform_(self.encoder_in.weight, -bound, bound)
        for layer in (self.encoder_out, self.decoder[0], self.decoder[2]):
            nn.init.xavier_uniform_(layer.weight)
            nn.init.normal_(layer.bias, std=0.001)

    def model_args(self) -> dict:
        return {"n_items": self.n_items, "width": self.width, "hidden": self.hidden,
                "dropout": self.dropout, "kl_cap": self.kl_cap,
                "anneal_steps": self.anneal_steps, "lam": self.lam}

    def user_codes(self, items: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        return self.encode(items, offsets, drop=False)[0]  # the posterior means

    def encode(self, items: torch.Tensor, offsets: torch.Tensor, drop: bool
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """(mu, logvar), each (B, width), of the normalised (and, if ``drop``, dropped-out) rows."""
        rows = row_ids(offsets, len(items))
        counts = torch.zeros(len(offsets), device=items.device).index_add_(
            0, rows, torch.ones(len(items), device=items.device))
        weights = counts.clamp(min=1).rsqrt()[rows]
        if drop and self.dropout > 0:
            keep = torch.rand(len(items), device=items.device) >= self.dropout
            weights = weights * keep / (1 - self.dropout)
        h = torch.tanh(self.encoder_in(items, offsets, per_sample_weights=weights)
                       + self.encoder_bias)
        mu, logvar = self.encoder_out(h).chunk(2, dim=1)
        return mu, logvar

    def forward(self, batch: Batch, step: KLSchedule | None = None) -> dict[str, torch.Tensor]:
        """``nll`` (multinomial, per user, batch mean), ``kl`` (weighted by ``step``'s beta_t;
        None: the cap, the schedule's end), and ``l2`` when lam > 0. Each training forward
        advances ``step`` by one update."""
        mu, logvar = self.encode(batch.train_items, batch.train_offsets, drop=self.training)
        z = mu + torch.randn_like(mu) * torch.exp(0.5 * logvar) if self.training else mu
        logp = F.log_softmax(self.decoder(z), dim=1)
        target = densify(batch.train_items, batch.train_offsets, None, self.n_items)
        terms = {"nll": -(logp * target).sum(dim=1).mean(),
                 "kl": (step.weight() if step is not None else self.kl_cap)
                       * kl_divergence(mu, logvar)}
        if self.lam > 0:
            weights = [self.encoder_in.weight, self.encoder_out.weight, self.decoder[0].weight,
                       self.decoder[2].weight]
            terms["l2"] = self.lam * sum(w.pow(2).sum() for w in weights)
        if self.training and step is not None:
            step.updates += 1
        return terms

    def score(self, items: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        mu, _ = self.encode(items, offsets, drop=False)
        return self.decoder(mu)


def kl_divergence(mu: torch.Tensor, logvar: torch.Tensor) -> torch.Tensor:
    """Batch mean of KL(N(mu, diag(exp(logvar))) || N(0, I)) = 1/2 sum(exp(lv) + mu^2 - 1 - lv)."""
    return 0.5 * (logvar.exp() + mu.pow(2) - 1 - logvar).sum(dim=1).mean()
