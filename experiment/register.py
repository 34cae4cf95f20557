"""4. register: the first seed's final model in the MLflow Model Registry as PREFIX-MODEL
(default DATASET-MODEL), alias @champion; not a model whose chosen trial was unhealthy on
validation unless --allow-unhealthy (``register_if_healthy``)."""

from __future__ import annotations

from training.validate import HEALTHY


def registered_name(prefix: str, dataset: str, model: str) -> str:
    """The registry name of an experiment's final ``model``: PREFIX-MODEL (--register-as), by
    default DATASET-MODEL."""
    return f"{prefix or dataset}-{model}"


def register(uri: str, name: str, model_uri: str, run_id: str) -> str:
    """``models:/NAME@champion`` pointing at ``model_uri`` (a new version unless the alias already
    points at this run's model). Where the alias pointed at a run of another MLflow experiment,
    a NOTE line says whose champion this replaces (two experiments on one set share DATASET-MODEL
    unless one has --register-as)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    try:
        current = client.get_model_version_by_alias(name, "champion")
    except Exception:  # noqa: BLE001 (no such model or alias yet)
        current = None
    if current is not None and current.run_id == run_id:
        return f"models:/{name}@champion"
    if current is not None and current.run_id:
        before, now = (client.get_run(r).info.experiment_id for r in (current.run_id, run_id))
        if before != now:
            other = client.get_experiment(before).name
            print(f"NOTE: {name}@champion moves from version {current.version} (a run of "
                  f"experiment {other!r}) to this experiment's model; pass --register-as "
                  "PREFIX (or --no-register) to keep both", flush=True)
    import mlflow

    mlflow.set_tracking_uri(uri)
    # register_model resolves MLflow 3's logged-model URIs (models:/m-...) to their source
    version = mlflow.register_model(model_uri, name)
    client.set_registered_model_alias(name, "champion", version.version)
    return f"models:/{name}@champion"


def unhealthy(chosen: dict) -> str | None:
    """The chosen trial's health when it is not ok (None when ok or not checked)."""
    h = chosen.get("health")
    return h if h not in (None, HEALTHY) else None


def register_if_healthy(uri: str, name: str, final: dict, chosen: dict, allow: bool) -> str:
    """``register`` the final model, unless its chosen trial was unhealthy on validation: then a
    WARNING line, and its run's model URI (scored and tabled as any other, never @champion
    silently). ``allow`` (--allow-unhealthy) registers it anyway, with the same warning. The
    final run (trained on train+valid, no validation of its own) and the model version carry
    the trial's health as a tag."""
    from mlflow.tracking import MlflowClient

    h = unhealthy(chosen)
    if h is None:
        return register(uri, name, final["model_uri"], final["mlflow_run_id"])
    client = MlflowClient(uri)
    client.set_tag(final["mlflow_run_id"], "health", h)
    num = lambda k: float("nan") if chosen.get(k) is None else chosen[k]
    why = (f"its chosen trial {chosen.get('trial')} is {h} on validation (NDCG "
           f"{chosen['valid_ndcg']:.4f}, popularity's {num('valid_ndcg_popularity'):.4f}, code "
           f"effective rank {num('code_effective_rank'):.2f})")
    if not allow:
        print(f"WARNING: {name}: not registered as models:/{name}@champion: {why}; scored "
              "from its run instead. Pass --allow-unhealthy to register it anyway", flush=True)
        return final["model_uri"]
    model_uri = register(uri, name, final["model_uri"], final["mlflow_run_id"])
    version = client.get_model_version_by_alias(name, "champion")
    client.set_model_version_tag(name, version.version, "health", h)
    print(f"WARNING: {name}: registered as {model_uri} although {why} (--allow-unhealthy)",
          flush=True)
    return model_uri
