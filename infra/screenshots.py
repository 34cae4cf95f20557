"""Screenshots of the MLflow UI after ``make demo``: the runs list by test NDCG, the runs as charts
of test NDCG, and one run's page (description, dataset, metrics), in a headless Chromium.

    pip install playwright                 # once; Chromium: apt-get install chromium, or
                                           # python -m playwright install chromium
    python -m infra.screenshots            # the stack's MLflow, the demo's experiment -> docs/images

The columns the runs list shows are the UI's per-browser state (local storage), not part of a
link: the script sets what a user picks under "Columns" (test NDCG, its CI, Recall@50, the
popularity share, the health tag) and types ``test_ndcg`` into the chart view's search box, as
the experiment's description tells a user to. Nothing here writes to MLflow.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

from infra import stack
from runtime.cli import strict_parser

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "images"
# what the runs list shows beside the run names, in the UI's own column keys
COLUMNS = ["params.`model`", "metrics.`test_ndcg`", "metrics.`test_ndcg_ci95`",
           "metrics.`test_recall_at_50`", "metrics.`test_recall_at_50_ci95`",
           "metrics.`test_popularity_share_top10pct`", "metrics.`best_valid_ndcg`",
           "tags.`health`"]
SORT = "orderByKey=metrics.%60test_ndcg%60&orderByAsc=false"


def chromium() -> str | None:
    """A Chromium on this machine (Playwright's own is used when this is None)."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    return None


def ui_state(columns: list[str]) -> dict:
    """The experiment page's stored state: sorted by test NDCG, ``columns`` shown."""
    return {"orderByKey": "metrics.`test_ndcg`", "orderByAsc": False, "selectedColumns": columns,
            "startTime": "ALL", "lifecycleFilter": "Active"}


def shoot(url: str, experiment: str, out: Path, width: int = 1500) -> list[Path]:
    from mlflow.tracking import MlflowClient
    from playwright.sync_api import sync_playwright

    client = MlflowClient(url)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        raise SystemExit(f"no MLflow experiment {experiment!r} at {url}: run `make demo` first "
                         "(or name the experiment with --experiment)")
    runs = client.search_runs([exp.experiment_id], order_by=["metrics.test_ndcg DESC"])
    if not runs or "test_ndcg" not in runs[0].data.metrics:
        raise SystemExit(f"the experiment {experiment!r} has no evaluated run: run `make demo`")
    key = f'MLflowLocalStorage-1.1-ExperimentPage-["{exp.experiment_id}"]-ReactComponentState'
    setup = (f"localStorage.setItem({json.dumps(key)}, {json.dumps(json.dumps(ui_state(COLUMNS)))});"
             "localStorage.setItem('mlflow.assistant.panelOpen_v1', 'false');"
             "localStorage.setItem('mlflow.assistant.fab.autoOpenedOnFirstLoad_v1', 'true');")
    base = f"{url}/#/experiments/{exp.experiment_id}"
    out.mkdir(parents=True, exist_ok=True)
    shots = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium(), args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": width, "height": 620})
        page.add_init_script(setup)

        page.goto(f"{base}/runs?{SORT}")
        page.get_by_text(runs[-1].info.run_name, exact=True).first.wait_for(timeout=60_000)
        page.wait_for_timeout(1500)  # the metric columns fill in after the names
        shots.append(out / "mlflow-runs.png")
        page.screenshot(path=shots[-1])

        page.set_viewport_size({"width": width, "height": 760})
        page.goto(f"{base}/runs?{SORT}&compareRunsMode=CHART")
        search = page.get_by_placeholder("Search metric charts")
        search.wait_for(timeout=60_000)
        search.fill("test_ndcg")
        page.wait_for_timeout(2500)
        shots.append(out / "mlflow-compare.png")
        page.screenshot(path=shots[-1])

        page.set_viewport_size({"width": width, "height": 1000})
        best = runs[0]
        page.goto(f"{base}/runs/{best.info.run_id}")
        page.get_by_text("test_ndcg").first.wait_for(timeout=60_000)
        page.get_by_placeholder("Search metrics").fill("test_")
        page.wait_for_timeout(1500)
        shots.append(out / "mlflow-run.png")
        page.screenshot(path=shots[-1])
        browser.close()
    return shots


def main(argv: list[str] | None = None) -> int:
    p = strict_parser(prog="python -m infra.screenshots", description=__doc__.split("\n\n")[0])
    p.add_argument("--mlflow-uri", default=None,
                   help="the MLflow server (default: the local stack's, `make demo` started it)")
    p.add_argument("--experiment", default="ml-latest-small", help="the demo's experiment")
    p.add_argument("--out", default=str(OUT), help="where the PNGs go (default docs/images)")
    args = p.parse_args(argv)
    try:
        import playwright  # noqa: F401
    except ImportError:
        raise SystemExit("screenshots need Playwright: pip install playwright (and a Chromium: "
                         "apt-get install chromium, or python -m playwright install chromium)") from None
    url = args.mlflow_uri or os.environ.get("MLFLOW_TRACKING_URI")
    if not url:
        svc = stack.read_record(stack.STATE).get("mlflow")
        if svc is None or not stack.healthy(svc):
            raise SystemExit("no MLflow server given and no local stack running: `make demo` "
                             "(it leaves the stack up), or --mlflow-uri URL")
        url = svc.url
    for path in shoot(url.rstrip("/"), args.experiment, Path(args.out)):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
