"""Does averaging the family's trained models beat each alone? Chosen on valid, read once on test.

    .venv/bin/python benchmarks/ensemble_check.py --data DIR \
        --member NAME=TRIAL_MODEL_PT:FINAL_MODEL_PT[,FINAL_SEED1_PT,...] ... \
        [--out benchmarks/results/ensemble_check]

An extension beyond the paper (issue 57): an ensemble scores an item by the sum of its members'
scores, each standardised per user (mean 0, sd 1 over the catalogue: the members' scales differ,
AutoRec's sigmoid logits and NCE-AutoRec's predict head alike). The protocol of the experiments:

1. every non-empty subset of the members is scored on **valid** from the members' search trials
   (trained on train only), LightGCN's Recall@20 over every validation user;
2. the subset with the best validation Recall@20 is the choice; only it is scored on **test**,
   from the members' final models (trained on train + valid), once per final seed (a member with
   fewer seeds reuses its last), beside each chosen member alone;
3. nothing else reads test.

A member is ``NAME=TRIAL:FINALS``: its trial's ``model.pt`` and its finals' (comma-separated, seed
0 first). Both passes score in blocks of users in this process, items already seen left out.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import pyarrow.compute as pc  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
import torch  # noqa: E402

from benchmarks import report  # noqa: E402
from benchmarks.probe import user_metrics  # noqa: E402
from models.batch import flat, row_ids, user_slice  # noqa: E402
from models.ensemble import standardised as standardise  # noqa: E402
from models.registry import load_model_file  # noqa: E402
from prepared import schema as S  # noqa: E402
from training.feed import union_sorted  # noqa: E402

K = 20
BLOCK = 1024


def standardised(net, items: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """``net``'s scores of a block of users, each row standardised (mean 0, sd 1): the
    ensemble model's own (``models.ensemble``)."""
    return standardise(net.score(items, offsets))


def truths(col) -> list[set]:
    """Each row's items of an Arrow list column, as a set."""
    values, offsets = flat(col)
    ends = np.append(offsets[1:], len(values))
    return [set(values[a:b].tolist()) for a, b in zip(offsets, ends)]


def recall_of_subsets(nets: list, seen: tuple[np.ndarray, np.ndarray], truth: list,
                      subsets: list, k: int = K) -> dict:
    """Per-user LightGCN metrics@k of each subset of ``nets`` (indices), scoring the input rows
    ``seen`` = (items, offsets), also left out of the lists, against ``truth``."""
    items_all = torch.from_numpy(seen[0].astype(np.int64))
    offsets_all = torch.from_numpy(seen[1].astype(np.int64))
    tops = {s: [] for s in subsets}
    for b in range(0, len(offsets_all), BLOCK):
        items, offsets = user_slice(items_all, offsets_all, b, min(b + BLOCK, len(offsets_all)))
        rows = row_ids(offsets, len(items))
        with torch.no_grad():
            scores = [standardised(n, items, offsets) for n in nets]
        for s in subsets:
            total = sum(scores[i] for i in s)
            total[rows, items] = -torch.inf
            tops[s].append(torch.topk(total, k, dim=1).indices.numpy())
    out = {}
    for s in subsets:
        m = user_metrics(np.concatenate(tops[s]), truth, k)
        out[s] = {"recall": m[f"Recall@{k}"], "ndcg": m[f"NDCG@{k} (truncated)"]}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="the prepared dataset the models were trained on")
    p.add_argument("--member", action="append", required=True,
                   help="NAME=TRIAL_MODEL_PT:FINAL_PT[,FINAL_SEED1_PT,...] (repeat per member)")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "ensemble_check"),
                   help="result path without suffix (default: benchmarks/results/ensemble_check)")
    args = p.parse_args(argv)
    torch.set_num_threads(2)
    members = []
    for spec in args.member:
        name, _, rest = spec.partition("=")
        trial, _, finals = rest.partition(":")
        if not (name and trial and finals):
            p.error(f"--member {spec!r}: expected NAME=TRIAL_MODEL_PT:FINAL_PT[,FINAL_PT...]")
        members.append((name, trial, finals.split(",")))
    rows = pq.read_table(Path(args.data) / "rows")
    rows = rows.filter(pc.invert(rows.column(S.COLD))).sort_by(S.USER_INDEX)
    started, stamp = time.time(), report.stamp("ensemble_check.py", argv)  # the code it starts on

    # 1. every subset on valid, from the trials
    v = rows.filter(pc.greater(pc.list_value_length(rows.column(S.VALID_ITEMS)), 0))
    subsets = [s for r in range(1, len(members) + 1)
               for s in itertools.combinations(range(len(members)), r)]
    trials = [load_model_file(t).eval() for _, t, _ in members]
    valid = recall_of_subsets(trials, flat(v.column(S.TRAIN_ITEMS)), truths(v.column(S.VALID_ITEMS)),
                              subsets)
    del trials
    name_of = lambda s: " + ".join(members[i][0] for i in s)  # noqa: E731
    valid_table = [{"members": name_of(s), "valid_recall20": float(valid[s]["recall"].mean()),
                    "valid_ndcg20": float(valid[s]["ndcg"].mean())} for s in subsets]
    choice = max(subsets, key=lambda s: valid[s]["recall"].mean())
    print(f"valid: {json.dumps(valid_table, indent=1)}\nchosen on valid: {name_of(choice)}",
          flush=True)

    # 2. the choice on test, from the finals, per seed; each chosen member alone beside it
    t = rows.filter(pc.greater(pc.list_value_length(rows.column(S.TEST_ITEMS)), 0))
    seen = union_sorted(*flat(t.column(S.TRAIN_ITEMS)), *flat(t.column(S.VALID_ITEMS)), t.num_rows)
    truth = truths(t.column(S.TEST_ITEMS))
    seeds = max(len(members[i][2]) for i in choice)
    test_rows = []
    for seed in range(seeds):
        picked = [members[i][2][min(seed, len(members[i][2]) - 1)] for i in choice]
        nets = [load_model_file(f).eval() for f in picked]
        alone = [(j,) for j in range(len(nets))]
        res = recall_of_subsets(nets, seen, truth, alone + [tuple(range(len(nets)))])
        for s, r in res.items():
            test_rows.append({"seed": seed, "members": " + ".join(members[choice[j]][0] for j in s),
                              "test_recall20": float(r["recall"].mean()),
                              "test_ndcg20": float(r["ndcg"].mean()),
                              "recall_per_user": r["recall"]})
        print(f"test, seed {seed}: " + ", ".join(
            f"{r['members']} {r['test_recall20']:.4f}" for r in test_rows[-len(res):]), flush=True)
    write(Path(args.out), stamp, members, valid_table, name_of(choice), test_rows,
          time.time() - started)
    return 0


def paired(test_rows: list, ensemble: str) -> dict:
    """The ensemble's Recall@20 minus its best member's alone (by mean test Recall@20), per user,
    per final seed: mean and a normal 95% CI over the users (tens of thousands). Per seed, not
    pooled: the same users recur in every seed, so pooling them as independent would understate
    the interval."""
    best = max({r["members"] for r in test_rows} - {ensemble},
               key=lambda m: np.mean([r["test_recall20"] for r in test_rows if r["members"] == m]))
    per_seed = []
    for e in (r for r in test_rows if r["members"] == ensemble):
        b = next(r for r in test_rows if r["members"] == best and r["seed"] == e["seed"])
        diff = e["recall_per_user"] - b["recall_per_user"]
        per_seed.append({"seed": e["seed"], "mean": float(diff.mean()),
                         "ci95": float(1.96 * diff.std(ddof=1) / np.sqrt(len(diff)))})
    return {"against": best, "per_seed": per_seed}


def write(out: Path, stamp: dict, members, valid_table, chosen, test_rows, seconds) -> None:
    rows = [{k: v for k, v in r.items() if k != "recall_per_user"} for r in test_rows]
    means = {}
    for r in rows:
        means.setdefault(r["members"], []).append(r["test_recall20"])
    record = {**stamp, "seconds": round(seconds),
              "members": members, "valid": valid_table, "chosen_on_valid": chosen, "test": rows,
              "test_mean_recall20": {m: float(np.mean(v)) for m, v in means.items()},
              "paired_vs_best_member": paired(test_rows, chosen) if "+" in chosen else None}
    lines = [f"# ensemble_check: {chosen} (chosen on valid)", "",
             f"Command: `{record['command']}`  ", f"Machine: {record['machine']}; "
             f"{record['date']}; {record['seconds']} s.", "",
             "| members (valid, from the trials) | valid Recall@20 | valid NDCG@20 |", "|---|---|---|"]
    lines += [f"| {r['members']} | {r['valid_recall20']:.4f} | {r['valid_ndcg20']:.4f} |"
              for r in valid_table]
    lines += ["", "| members (test, from the finals) | seed | test Recall@20 | test NDCG@20 |",
              "|---|---|---|---|"]
    lines += [f"| {r['members']} | {r['seed']} | {r['test_recall20']:.4f} | {r['test_ndcg20']:.4f} |"
              for r in rows]
    if record["paired_vs_best_member"]:
        d = record["paired_vs_best_member"]
        lines += ["", f"Ensemble minus {d['against']} alone, Recall@20 paired over the users, per "
                      "final seed: " + "; ".join(f"seed {p['seed']} {p['mean']:+.4f} ± {p['ci95']:.4f}"
                                                 for p in d["per_seed"]) + "."]
    report.publish(out, record, lines)


if __name__ == "__main__":
    raise SystemExit(main())
