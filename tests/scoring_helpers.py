"""Models whose scores are exact in float32, for tests that compare scoring paths bit for bit."""

import numpy as np
import torch


def exact_codes_and_head(model, seed=0):
    """Make ``model``'s scores exact in float32 (as test_stream_topk's operands): its codes the
    sums of its users' rows of small integers (at most 25 items a user), its predict head
    multiples of 2**-bits, so every kernel's lists and values are the same bit for bit."""
    width, n = model.width, model.n_items
    bits = int(np.log2(2**24 / (width * 8 * 25 + 1)))
    g = torch.Generator().manual_seed(seed)
    table = torch.randint(-8, 9, (n, width), generator=g).float()
    model.code = lambda items, offsets, *_: torch.nn.functional.embedding_bag(
        items, table, offsets, mode="sum")
    head = model.heads[model.recommend_head]
    with torch.no_grad():
        head.weight.copy_(torch.randint(-2**bits, 2**bits + 1, head.weight.shape, generator=g)
                          * 2.0 ** -bits)
        head.bias.copy_(torch.randint(-2**bits, 2**bits + 1, head.bias.shape, generator=g)
                        * 2.0 ** -bits)
