"""Shared behaviour every model passes (implicit's test-mixin idea), and what each mode trains."""

import io

import numpy as np
import pyarrow as pa
import pytest
import torch

from etl import protocol
from training.data import batch_from_arrow
from training.models import MODELS, build_model, model_spec
from training.step import Step, make_optimizers, phases, train_batch

N = 20  # users and items


def checkerboard(negatives=40, seed=0):
    """Even users like even items, odd users odd items; one liked item per user is withheld."""
    rng = np.random.default_rng(seed)
    train, withheld = [], []
    for u in range(N):
        liked = [i for i in range(N) if i % 2 == u % 2]
        out = int(rng.choice(liked))
        withheld.append(out)
        train.append(sorted(set(liked) - {out}))
    pop = np.bincount(np.concatenate(train), minlength=N)
    off, items, counts = protocol.negative_counts(np.arange(N), pop, negatives, seed)
    table = pa.table({
        "user_index": pa.array(range(N), pa.int32()),
        "train_items": pa.array(train, pa.list_(pa.int32())),
        "train_rstar": pa.array([[1.0] * len(t) for t in train], pa.list_(pa.float32())),
        "neg_items": pa.array([items[off[u]:off[u + 1]].tolist() for u in range(N)], pa.list_(pa.int32())),
        "neg_counts": pa.array([counts[off[u]:off[u + 1]].tolist() for u in range(N)], pa.list_(pa.int32())),
    })
    return table, train, withheld


def fit(name, mode=None, epochs=150, seed=0):
    torch.manual_seed(seed)
    table, train, withheld = checkerboard()
    batch = batch_from_arrow(table)
    model = build_model(name, N, width=4)  # a bottleneck: the model must learn the two groups
    history = []
    for steps in phases(model_spec(name), mode):
        opts = make_optimizers(model, steps, lr=0.02)
        for _ in range(epochs):
            history.append(train_batch(model, batch, steps, opts, lam=1e-2))
    return model, batch, train, withheld, history


def scores(model, name, batch):
    head = model_spec(name).recommend_head
    with torch.no_grad():
        return model(batch.train_items, batch.train_offsets, (head,))[head]


CASES = [(m, None) for m in ("autorec", "ohns-autorec")] + \
        [(m, mode) for m in ("ns-autorec", "nce-autorec")
         for mode in ("joint", "alternating", "limited-finetune", "full-finetune")]


@pytest.mark.parametrize("name, mode", CASES)
def test_checkerboard_withheld_item_ranks_first(name, mode):
    model, batch, train, withheld, history = fit(name, mode)
    s = scores(model, name, batch)
    for u in range(N):
        s[u, train[u]] = -np.inf  # training items are excluded from recommendations
    assert s.argmax(dim=1).tolist() == withheld
    first, last = history[0], history[-1]
    assert all(last[k] < first[k] for k in last if k in first)  # every loss fell


@pytest.mark.parametrize("name", list(MODELS))
def test_batch_scores_equal_per_user_scores_and_save_load_round_trips(name):
    model, batch, *_ = fit(name, None if name in ("autorec", "ohns-autorec") else "joint", epochs=5)
    whole = scores(model, name, batch)
    for u in (0, 7, 19):
        lo = int(batch.train_offsets[u])
        hi = int(batch.train_offsets[u + 1]) if u + 1 < N else len(batch.train_items)
        one = model(batch.train_items[lo:hi], torch.tensor([0]), (model_spec(name).recommend_head,))
        torch.testing.assert_close(one[model_spec(name).recommend_head][0], whole[u])
    buf = io.BytesIO()
    torch.save({"model_args": model.model_args(), "state": model.state_dict()}, buf)
    buf.seek(0)
    ckpt = torch.load(buf, weights_only=True)
    clone = build_model(name, ckpt["model_args"]["n_items"], ckpt["model_args"]["width"])
    clone.load_state_dict(ckpt["state"])
    assert torch.equal(scores(clone, name, batch), whole)


def _snapshot(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _changed(before, model, prefix):
    return any(not torch.equal(before[k], v) for k, v in model.state_dict().items() if k.startswith(prefix))


def test_limited_finetune_freezes_the_encoder_in_phase_two():
    table, *_ = checkerboard()
    batch = batch_from_arrow(table)
    model = build_model("nce-autorec", N, 8)
    p1, p2 = phases(model_spec("nce-autorec"), "limited-finetune")
    assert p2 == [Step(("predict",), train_encoder=False)]
    train_batch(model, batch, p1, make_optimizers(model, p1, 0.01), 1e-3)
    before = _snapshot(model)
    train_batch(model, batch, p2, make_optimizers(model, p2, 0.01), 1e-3)
    assert not _changed(before, model, "encoder") and _changed(before, model, "heads.predict")
    assert not _changed(before, model, "heads.nce")


def test_full_finetune_trains_the_encoder_in_phase_two():
    table, *_ = checkerboard()
    batch = batch_from_arrow(table)
    model = build_model("nce-autorec", N, 8)
    _, p2 = phases(model_spec("nce-autorec"), "full-finetune")
    before = _snapshot(model)
    train_batch(model, batch, p2, make_optimizers(model, p2, 0.01), 1e-3)
    assert _changed(before, model, "encoder") and _changed(before, model, "heads.predict")
    assert not _changed(before, model, "heads.nce")


def test_alternating_updates_what_each_loss_touches():
    table, *_ = checkerboard()
    batch = batch_from_arrow(table)
    model = build_model("ns-autorec", N, 8)
    (embed, predict), = phases(model_spec("ns-autorec"), "alternating")
    opts = make_optimizers(model, [embed, predict], 0.01)
    before = _snapshot(model)
    train_batch(model, batch, [embed], opts[:1], 1e-3)
    assert _changed(before, model, "heads.ns") and _changed(before, model, "encoder")
    assert not _changed(before, model, "heads.predict")
    before = _snapshot(model)
    train_batch(model, batch, [predict], opts[1:], 1e-3)
    assert _changed(before, model, "heads.predict") and not _changed(before, model, "heads.ns")


def test_mode_on_a_one_headed_model_is_an_error():
    with pytest.raises(ValueError, match="two-headed"):
        phases(model_spec("autorec"), "joint")
