"""The AutoRec family's losses as pure functions of scores and sparse targets (protocol.md, "Models").

Sparse targets use the EmbeddingBag layout of ``models.batch``: values for user i are
``idx[offsets[i]:offsets[i+1]]`` (the last user runs to the end).

Each loss of a linear head ``y = W h + b`` comes twice: from the dense (B, n_items) scores
(``mse_loss``, ``ns_loss``: the reference, O(B n d) for the product and its gradients), and from
the code ``h`` and the head's parameters without forming them (``linear_mse``, ``linear_ns``: the
exact fast paths; ``AutoRec.dense_for`` picks per head and batch). The fast MSE expands the square:

    sum_ij (t_ij - y_ij)^2 = sum_i [ h_i' (W'W) h_i + 2 h_i' W'b + |b|^2 ]       (every entry)
                             - 2 sum_(i,j) in t t_ij y_ij + sum_(i,j) in t t_ij^2   (t's non-zeros)

which costs O(n d^2 + B d^2 + nnz d) instead of O(B n d): the same value and gradients up to float
rounding (tests/models/test_losses.py checks both in float64), and B / d times less arithmetic.

The MSE objective is written here once: ``linear_mse`` is what training minimises, ``mse_loss``
its dense reference, and ``models.autorec.ridge`` solves for its minimiser over a linear head.

Confidence on positives (``pos_weight`` alpha; an extension beyond the paper, from WRMF's
confidence 1 + alpha r, Hu, Koren & Volinsky 2008): each entry's squared error weighs
c_ij = 1 + alpha r_ij, r the binary row, still divided by B n. The weighted sum is the unweighted
one plus

    alpha sum_(i,j) in r (t_ij - y_ij)^2          with y_ij = w_j . h_i + b_j gathered

an O(nnz d) term over the positives (t = 1 for the predict head, R* for the NCE head, whose
positives are the same entries, R* = 0 included); alpha = 0 is the paper's loss, computed as
before. Rows hold each item at most once (the ETL's rows do). alpha may also be a (nnz,) tensor,
one weight per positive: emphasized denoising (``AutoRec.levers``) raises the dropped ones'.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from models.batch import row_ids
from models.losses import densify
from models.product import mm


def mse_loss(scores: torch.Tensor, idx: torch.Tensor, offsets: torch.Tensor,
             values: torch.Tensor | None = None, pos_weight: float | torch.Tensor = 0.0
             ) -> torch.Tensor:
    """Mean over all B * n entries of c (t - y)^2, t dense from the sparse target (r, or R*), and
    c = 1 + ``pos_weight`` at the sparse positions (a number, or one per position), 1 elsewhere
    (the dense reference)."""
    # float32, or float64 for float64 scores (the tests' reference: R* scaled is not float32-exact)
    wide = torch.promote_types(scores.dtype, torch.float32)
    target = densify(idx, offsets, values, scores.shape[1], wide)
    if torch.is_tensor(pos_weight):
        weight = 1 + densify(idx, offsets, pos_weight.to(wide), scores.shape[1], wide)
        return (weight * (scores - target) ** 2).mean()
    if not pos_weight:
        return F.mse_loss(scores, target, reduction="mean")
    weight = 1 + pos_weight * densify(idx, offsets, None, scores.shape[1], wide)
    return (weight * (scores - target) ** 2).mean()


def multinomial_loss(scores: torch.Tensor, idx: torch.Tensor, offsets: torch.Tensor
                     ) -> torch.Tensor:
    """Mult-DAE's multinomial log-likelihood (Liang et al., "Variational Autoencoders for
    Collaborative Filtering", WWW 2018): per user, -sum over its items of log softmax(scores)_i,
    summed over the batch and divided by B * n, the (user, item) entries the other heads' losses
    are means over (the NS head's per-user sum is divided by n the same way). It has no fast
    form (the softmax's normaliser needs every score), so a head trained on it is dense."""
    logp = torch.log_softmax(scores, dim=1)
    return -logp[row_ids(offsets, len(idx)), idx].sum() / scores.numel()


def ns_loss(scores: torch.Tensor, pos_idx: torch.Tensor, pos_offsets: torch.Tensor,
            neg_idx: torch.Tensor, neg_counts: torch.Tensor, neg_offsets: torch.Tensor) -> torch.Tensor:
    """Negative-sampling loss with counts, the logistic form of the paper's eq. 3:

        L = -(1/B) sum_i [ sum_{j in r_i} log s(y_ij) + (|r_i| / |s_i|) sum_j s_ij log s(-y_ij) ]

    The paper's eq. 4 writes a plain inner product (a reward unbounded with a linear head); we use
    its logistic form, as protocol.md decides. Users without negatives contribute positives only.
    """
    pos_rows = row_ids(pos_offsets, len(pos_idx))
    neg_rows = row_ids(neg_offsets, len(neg_idx))
    return ns_terms(scores[pos_rows, pos_idx], scores[neg_rows, neg_idx], pos_rows, neg_rows,
                    neg_counts, scores.shape[0])


def ns_terms(pos_scores: torch.Tensor, neg_scores: torch.Tensor, pos_rows: torch.Tensor,
             neg_rows: torch.Tensor, neg_counts: torch.Tensor, b: int) -> torch.Tensor:
    """``ns_loss`` from the scores at the positives (nnz,) and at the negatives, with each one's
    user (row in the batch of ``b``)."""
    dev, dtype = pos_scores.device, pos_scores.dtype
    pos_term = torch.zeros(b, device=dev, dtype=dtype).index_add_(
        0, pos_rows, F.logsigmoid(pos_scores))
    counts = neg_counts.to(dtype)
    neg_term = torch.zeros(b, device=dev, dtype=dtype).index_add_(
        0, neg_rows, counts * F.logsigmoid(-neg_scores))
    n_pos = torch.zeros(b, device=dev, dtype=dtype).index_add_(
        0, pos_rows, torch.ones_like(pos_rows, dtype=dtype))
    n_neg = torch.zeros(b, device=dev, dtype=dtype).index_add_(0, neg_rows, counts)
    weight = torch.where(n_neg > 0, n_pos / n_neg.clamp(min=1), torch.zeros_like(n_neg))
    return -(pos_term + weight * neg_term).mean()


def linear_at(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, rows: torch.Tensor,
              idx: torch.Tensor) -> torch.Tensor:
    """(len(idx),) scores ``(W h_rows + b)_idx`` of a linear head at the given (row, item) pairs,
    from gathered rows of W (index_select: its backward is an index_add into W's gradient)."""
    return (h.index_select(0, rows) * weight.index_select(0, idx)).sum(1) + bias.index_select(0, idx)


def linear_mse(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, idx: torch.Tensor,
               offsets: torch.Tensor, values: torch.Tensor | None = None,
               pos_weight: float | torch.Tensor = 0.0, with_l2: bool = False):
    """``mse_loss(F.linear(h, weight, bias), idx, offsets, values, pos_weight)`` exactly, without
    the (B, n) scores (the expansion in the module docstring; ``pos_weight``'s term scored at
    the positives, a number or one per positive: ``_LinearMSE``). ``h`` (B, d), ``weight``
    (n, d), ``bias`` (n,).
    ``with_l2``: returns (loss, mean(weight^2)): the head's L2 at no cost, its value the Gram's
    trace and its gradient folded into the loss's (``_LinearMSE``), where ``l2_penalty`` would
    make two passes over W and autograd a third to add the two gradients.

    Always computed in float32 or wider, autocast or not: the expansion subtracts large terms
    (h'W'Wh against the target's), which bf16 would not resolve."""
    t = torch.ones(len(idx), device=h.device, dtype=h.dtype) if values is None else values.to(h.dtype)
    wide = torch.promote_types(h.dtype, torch.float32)
    with torch.autocast(h.device.type, enabled=False):
        h, weight, bias, t = h.to(wide), weight.to(wide), bias.to(wide), t.to(wide)
        alpha = pos_weight.to(wide) if torch.is_tensor(pos_weight) else float(pos_weight)
        loss, mean_square = _LinearMSE.apply(h, weight, bias, idx, offsets, t, alpha)
        return (loss, mean_square) if with_l2 else loss


class _LinearMSE(torch.autograd.Function):
    """The expansion with its gradient written out, so a step costs two (n, d) x (d, d) products
    and one pass over W's gradient (autograd through ``W.T @ W`` takes three products, and the
    EmbeddingBag over W another dense (n, d) gradient and its sum):

        dL/dh = 2 [h G + W'b - S] / (B n)           G = W'W, S_i = sum_j t_ij W_j
        dL/dW = 2 [W (h'h) + b (sum_i h_i)' - T'h] / (B n)
        dL/db = 2 [W sum_i h_i + B b - T' 1] / (B n)   T: the (B, n) sparse target

    Its second output is mean(W^2) = trace(G) / (n d), whose gradient 2 W / (n d) joins the
    product as W (c h'h + g I): the L2 adds no pass over W. The (n, d) x (d, d) products run on
    the faster kernel (``models.product.mm``: numpy's SYRK for G where it wins), and T'h is one
    EmbeddingBag of h's rows per touched item (the positives sorted by item), not an (nnz, d)
    gather and scaled copy: 4.8x faster at the Yahoo shape's batch of 8,192.

    The confidence term alpha sum_(i,j) in t (t_ij - y_ij)^2 scores the positives in cache-sized
    chunks (``positive_scores``) and adds its derivative at each positive to the target's, so
    that T'h, S and T'1 above take one coefficient per positive, -c (t + alpha (t - y)): no
    (nnz, d) array is formed (autograd's gathers made the step 2.6x slower at alpha > 0)."""

    @staticmethod
    def forward(ctx, h, weight, bias, idx, offsets, t, alpha):
        b, n = h.shape[0], weight.shape[0]
        gram = mm(weight.T, weight)
        hg = mm(h, gram)
        wtb = weight.T @ bias
        # S = T W: one EmbeddingBag of W's rows per user, no (nnz, d) gather of h
        sums = F.embedding_bag(idx, weight, offsets, mode="sum", per_sample_weights=t)
        every = hg.flatten().dot(h.flatten()) + 2 * (h.sum(0) @ wtb) + b * bias.dot(bias)
        at_target = sums.flatten().dot(h.flatten()) + t.dot(bias.index_select(0, idx))
        loss = (every - 2 * at_target + t.dot(t)) / (b * n)
        weighted_err = None  # alpha (t - y) at the positives, where the confidence term is on
        if torch.is_tensor(alpha) or alpha:
            err = t - positive_scores(h, weight, bias, row_ids(offsets, len(idx)), idx)
            weighted_err = alpha * err
            loss = loss + weighted_err.dot(err) / (b * n)
        ctx.save_for_backward(h, weight, bias, idx, offsets, t, hg, wtb, sums, weighted_err)
        return loss, gram.diagonal().sum() / weight.numel()

    @staticmethod
    def backward(ctx, grad, grad_square):
        h, weight, bias, idx, offsets, t, hg, wtb, sums, weighted_err = ctx.saved_tensors
        b, n = h.shape[0], weight.shape[0]
        c = 2 * grad / (b * n)
        # each positive's coefficient in T'h, S and T'1: -c t, and -c alpha (t - y) with alpha
        per = t * -c if weighted_err is None else (t + weighted_err).mul_(-c)
        grad_h = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            if weighted_err is None:
                grad_h = (hg + (wtb - sums)).mul_(c)
            else:
                grad_h = (hg + wtb).mul_(c).add_(
                    F.embedding_bag(idx, weight, offsets, mode="sum", per_sample_weights=per))
        if ctx.needs_input_grad[1] or ctx.needs_input_grad[2]:
            h_sum = h.sum(0)
            if ctx.needs_input_grad[1]:
                inner = mm(h.T, h).mul_(c)
                if grad_square is not None:
                    inner.diagonal().add_(2 * grad_square / weight.numel())
                grad_w = mm(weight, inner).addr_(bias, h_sum * c)
                items, item_sums = target_transpose(idx, offsets, per, h)
                grad_w.index_add_(0, items, item_sums)
            if ctx.needs_input_grad[2]:
                grad_b = torch.addmv(bias, weight, h_sum, beta=b).mul_(c)
                grad_b.index_add_(0, idx, per)
        return grad_h, grad_w, grad_b, None, None, None, None


def positive_scores(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                    rows: torch.Tensor, idx: torch.Tensor, chunk: int = 4096) -> torch.Tensor:
    """(len(idx),) scores ``w_j . h_i + b_j`` at the (row i, item j) pairs, ``chunk`` pairs at a
    time: the gathered rows stay in cache (whole, two (nnz, d) arrays went through memory)."""
    out = torch.empty(len(idx), dtype=h.dtype, device=h.device)
    for s in range(0, len(idx), chunk):
        out[s:s + chunk] = torch.linalg.vecdot(h.index_select(0, rows[s:s + chunk]),
                                               weight.index_select(0, idx[s:s + chunk]))
    return out.add_(bias.index_select(0, idx))


def bag_with_l2(items: torch.Tensor, offsets: torch.Tensor, weights: torch.Tensor | None,
                weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(``F.embedding_bag(items, weight, offsets, mode="sum", per_sample_weights=weights)``,
    mean(weight^2)): the encoder's input layer and its plain L2 in one autograd node
    (``_BagWithL2``)."""
    return _BagWithL2.apply(items, offsets, weights, weight)


class _BagWithL2(torch.autograd.Function):
    """The encoder's EmbeddingBag and its weight's mean square, with one (n, d) gradient: the
    L2's 2 g V / numel, into which the bag's T'G is added per touched item (``target_transpose``).
    autograd made three: the bag's (zeroed, then scattered into), the L2's, and their sum."""

    @staticmethod
    def forward(ctx, items, offsets, weights, weight):
        ctx.save_for_backward(items, offsets, weights, weight)
        flat = weight.reshape(-1)
        return (F.embedding_bag(items, weight, offsets, mode="sum", per_sample_weights=weights),
                flat.dot(flat) / weight.numel())

    @staticmethod
    def backward(ctx, grad_bag, grad_square):
        items, offsets, weights, weight = ctx.saved_tensors
        grad_weight = (torch.zeros_like(weight) if grad_square is None
                       else weight * (2 * grad_square / weight.numel()))
        t = (torch.ones(len(items), dtype=weight.dtype, device=weight.device) if weights is None
             else weights)
        touched, sums = target_transpose(items, offsets, t.to(grad_bag.dtype), grad_bag)
        grad_weight.index_add_(0, touched, sums.to(weight.dtype))
        return None, None, None, grad_weight


def target_transpose(idx: torch.Tensor, offsets: torch.Tensor, t: torch.Tensor, h: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """T'h of the sparse target T (values ``t`` at ``idx``, users by ``offsets``): the items
    with a positive, and for each sum_i t_ij h_i (one EmbeddingBag of h's rows per item, over the
    positives sorted by item; the sort is stable, so the sums' rounding is the same every run)."""
    sorted_idx, order = torch.sort(idx, stable=True)
    items, counts = torch.unique_consecutive(sorted_idx, return_counts=True)
    starts = counts.cumsum(0) - counts
    rows = row_ids(offsets, len(idx)).index_select(0, order)
    return items, F.embedding_bag(rows, h, starts, mode="sum",
                                  per_sample_weights=t.index_select(0, order))


def linear_ns(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, pos_idx: torch.Tensor,
              pos_offsets: torch.Tensor, neg_idx: torch.Tensor, neg_counts: torch.Tensor,
              neg_offsets: torch.Tensor) -> torch.Tensor:
    """``ns_loss(F.linear(h, weight, bias), ...)`` exactly, scoring only the positives and the
    negatives: O((nnz + negatives) d) instead of O(B n d)."""
    pos_rows = row_ids(pos_offsets, len(pos_idx))
    neg_rows = row_ids(neg_offsets, len(neg_idx))
    return ns_terms(linear_at(h, weight, bias, pos_rows, pos_idx),
                    linear_at(h, weight, bias, neg_rows, neg_idx), pos_rows, neg_rows, neg_counts,
                    h.shape[0])
