"""Figures people look at instead of reading tables: the popularity of what each model recommends
(the paper's density plot) and the cold-start comparison (the paper's bivariate plot)."""

from __future__ import annotations

import io
import itertools

import numpy as np

from runtime.tracking import pyplot


def log_density(popularity: np.ndarray, weights: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """Weighted Gaussian kernel density of log10(popularity) on ``grid`` (log10 units), bandwidth
    by Silverman's rule; one kernel per item, weighted by how often it was recommended."""
    x = np.log10(np.maximum(np.asarray(popularity, np.float64), 1.0))
    w = np.asarray(weights, np.float64)
    x, w = x[w > 0], w[w > 0] / w.sum()
    mean = (w * x).sum()
    std = np.sqrt((w * (x - mean) ** 2).sum())
    n_eff = 1.0 / (w ** 2).sum()
    bw = max(1.06 * std * n_eff ** -0.2, 0.02)
    z = (grid[:, None] - x[None, :]) / bw
    return (np.exp(-0.5 * z ** 2) * w).sum(axis=1) / (bw * np.sqrt(2 * np.pi))


def line_styles(plt):
    """(colour, line style) pairs without end: the colour cycle once solid, then dashed, then
    dash-dotted, so that more models than colours (13 in the experiment) still get a line each
    (a plain zip with the 10-colour cycle silently dropped the rest)."""
    colors = [c["color"] for c in plt.rcParams["axes.prop_cycle"]]
    for i in itertools.count():
        yield colors[i % len(colors)], ("-", "--", "-.")[i // len(colors) % 3]


def popularity_density(models: dict[str, tuple[np.ndarray, np.ndarray]],
                       summaries: dict[str, dict], title: str):
    """Density of the popularity of recommended items (log scale), one line per model, the
    median dotted.

    ``models[label] = (popularity (n_items,), times recommended (n_items,))``: the density is over
    recommendations (an item recommended 100 times weighs 100)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    top = max(float(p.max()) for p, _ in models.values())
    grid = np.linspace(0, np.log10(max(top, 10.0)) + 0.2, 300)
    for (label, (pop, counts)), (color, style) in zip(models.items(), line_styles(plt)):
        s = summaries[label]
        ax.plot(10 ** grid, log_density(pop, counts, grid), color=color, ls=style,
                label=f"{label}: median {s['median_popularity']:.0f}, top-10% share "
                      f"{s['share_top10pct']:.2f}, coverage {s['coverage']:.2f}")
        ax.axvline(s["median_popularity"], color=color, ls=":", lw=1)
    ax.set(xscale="log", xlabel="popularity of a recommended item (train+valid positives)",
           ylabel="density (per log10 unit)", title=title)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def cold_start_scatter(reference: str, ndcg: dict[str, np.ndarray], title: str,
                       tallies: dict[str, tuple[int, int, int]] | None = None):
    """Per-user NDCG of the cold-start users: each other model (y) against ``reference`` (x), one
    panel each; points above the diagonal are users the other model serves better.

    ``ndcg[label]``: the users' values, aligned with ``ndcg[reference]``; or, given ``tallies``
    ({label: (better, worse, tied) users}, counted where the values are, e.g. in Spark), the
    panel's points as an (x, y) pair, e.g. the distinct ones of a fine grid: the driver then
    holds no per-user array."""
    plt = pyplot()
    others = [k for k in ndcg if k != reference]
    cols = min(len(others), 4)  # many models wrap into rows rather than one very wide strip
    rows = -(-len(others) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(max(6.0, 4.8 * cols), 5.2 * rows),
                             squeeze=False)
    for ax in axes.flat[len(others):]:
        ax.set_visible(False)
    for ax, label in zip(axes.flat, others):
        if tallies is None:
            x, y = ndcg[reference], ndcg[label]
            better, worse, tied = (y > x).sum(), (y < x).sum(), (y == x).sum()
        else:
            (x, y), (better, worse, tied) = ndcg[label], tallies[label]
        ax.scatter(x, y, s=8, alpha=0.5)
        ax.plot([0, 1], [0, 1], color="grey", lw=1)
        ax.set(xlim=(-0.02, 1.02), ylim=(-0.02, 1.02), xlabel=f"{reference} NDCG",
               ylabel=f"{label} NDCG", aspect="equal")
        ax.set_title(f"{label} better for {better} users, worse for {worse}, tied {tied}",
                     fontsize=9)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def setting_effect(series: dict[str, dict], setting: str, title: str, log_x: bool = False):
    """Best validation NDCG at each value of one setting (the others searched over), a line (or
    bars, for a categorical setting) per model: the paper's per-mode, N and beta figures.
    ``series[model] = {value: ndcg}``."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    numeric = all(isinstance(v, int | float) for s in series.values() for v in s)
    if numeric:
        for model, s in series.items():
            xs = sorted(s)
            ax.plot(xs, [s[x] for x in xs], marker="o", label=model)
        if log_x:
            ax.set_xscale("log")
    else:
        cats = list(dict.fromkeys(v for s in series.values() for v in s))
        width = 0.8 / max(len(series), 1)
        for i, (model, s) in enumerate(series.items()):
            xs = [j + i * width for j, c in enumerate(cats) if c in s]
            ax.bar(xs, [s[c] for c in cats if c in s], width=width, label=model)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(cats))], cats)
    ax.set(xlabel=setting, ylabel="best validation NDCG")
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig


def convergence(curves: dict[str, tuple[list[float], list[float]]], title: str):
    """Validation NDCG against training wall time, one line per label (the paper's convergence
    figure: one per optimisation mode). ``curves[label] = (seconds, ndcg)`` per epoch."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, (t, y) in curves.items():
        ax.plot(t, y, marker=".", label=label)
    ax.set(xlabel="training wall time (s)", ylabel="validation NDCG")
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig


def png_bytes(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    pyplot().close(fig)
    return buf.getvalue()
