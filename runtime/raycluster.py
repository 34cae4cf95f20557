"""Which Ray cluster a driver (training/train.py, experiment/run.py) joins, how many logical
CPUs a local Ray gets, and whether a run's workers fit the cluster: an impossible request is
refused at once, and a run that waits for resources says which, instead of waiting in silence."""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from prepared.errors import UsageError

READ_CPUS = 1  # a logical CPU beside the training workers' for Ray Data's read tasks
STALL_SECONDS = 60.0  # no epoch by then: say what the run waits for


# Ray's own settings this project changes, for its drivers and for the Ray heads it starts; a
# value the user exports wins. Ray Data's Parquet reader starts a pool of 32 footer-reading actors
# per dataset (a Python process each) to list a handful of shards: on a small machine their start
# cost seconds of every run. Two read the footers of thousands of shards in well under a second.
# Ray Train's controller collects the workers' reports by polling them every 2 s, and a worker's
# report waits until it is collected (a queue of one): an epoch shorter than 2 s took 2 s (1.3 s of
# work and 0.7 s of waiting, every epoch, on ml-latest-small). A poll is a small RPC per worker.
RAY_ENV = {"RAY_DATA_PARQUET_FOOTER_NUM_ACTORS": "2", "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.25"}


# A Ray on one machine (the local stack's head, a driver's own local Ray) on loopback only. Ray
# 2.60 binds its GCS, raylet and worker gRPC servers to 127.0.0.1 only when the node's IP is
# 127.0.0.1, and on Linux it resolves "127.0.0.1" to the machine's first interface (its
# multi-node default): `ray start --node-ip-address 127.0.0.1` alone left them listening on every
# interface. This variable, Ray's switch for single-machine Windows and macOS, keeps the node on
# loopback; a driver joining such a head needs it too (without it, it looks for a raylet on the
# machine's address and waits), and Ray's job drivers inherit it from the head.
LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")

# The local stack's record (python -m infra.stack): its Ray head runs in token mode, and a driver
# joining it with --ray-address needs the token settings the stack prints as exports. Without
# them Ray retries 'InvalidAuthToken' for 30 s and ends in "Failed to connect".
STACK_RECORD = Path(__file__).resolve().parents[1] / "var" / "stack" / "stack.json"
AUTH_VARS = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")

# A cluster of one node has no other node that could be drained (preempted): Ray Train's watcher
# of node drains is a Python process per run there (an actor of its own, ~1.5 s of every run on a
# 2-core machine, measured with `ray job submit` on the local stack) that can never fire.
ONE_NODE_ENV = {"RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0"}


def ray_env() -> dict[str, str]:
    """``RAY_ENV`` with the caller's own exports in place of the defaults."""
    return {k: os.environ.get(k, v) for k, v in RAY_ENV.items()}


def on_loopback(address: str | None) -> bool:
    """Whether a driver of ``address`` (None: a local Ray it starts itself) is on one machine's
    loopback, where ``LOOPBACK_ENV`` applies."""
    return address is None or address.rsplit(":", 1)[0] in LOOPBACK_HOSTS


def apply_ray_env(address: str | None = None) -> None:
    """Put ``ray_env()`` into this process's environment: read where the datasets are planned
    (the driver), and inherited by a local Ray this process starts; for a Ray on loopback
    (``on_loopback``) also ``LOOPBACK_ENV``, unless the user exported its variable."""
    os.environ.update(ray_env())
    if address and not any(k in os.environ for k in AUTH_VARS):
        os.environ.update(stack_auth(address))
    if on_loopback(address):
        for k, v in LOOPBACK_ENV.items():
            os.environ.setdefault(k, v)
        # Ray reads the variable once, when it is first imported: a driver that imported Ray
        # already (the tests' session, a module above) gets the same value now
        constants = sys.modules.get("ray._private.ray_constants")
        if constants is not None and os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0":
            constants.ENABLE_RAY_CLUSTER = False


def ray_for(address: str | None):
    """The ``ray`` module, imported only after ``apply_ray_env(address)``: Ray reads its token
    settings (RAY_AUTH_*) when first imported, so a driver that imported it before could not
    join the stack's token-mode head (InvalidAuthToken, then "Failed to connect")."""
    apply_ray_env(address)
    import ray

    return ray


def stack_auth(address: str, record: Path | None = None) -> dict[str, str]:
    """The local stack's token settings (``AUTH_VARS`` of its record) when ``address`` is its Ray
    head's GCS address on loopback, else {}: a driver run directly with ``--ray-address
    127.0.0.1:6379`` joins the stack as one submitted with ``ray job submit`` does."""
    try:
        ray = json.loads((record or STACK_RECORD).read_text()).get("ray") or {}
    except (OSError, ValueError, AttributeError):
        return {}
    host, _, port = address.rpartition(":")
    stack_host, _, stack_port = str(ray.get("address", "")).rpartition(":")
    if port != stack_port or host not in LOOPBACK_HOSTS or stack_host not in LOOPBACK_HOSTS:
        return {}
    return {k: str(v) for k, v in (ray.get("env") or {}).items() if k in AUTH_VARS}


def apply_one_node_env(nodes: int) -> None:
    """``ONE_NODE_ENV`` into this driver's environment when the cluster it joined has ``nodes``
    = 1 alive node (unless the user exported the variable). Ray Train hands the driver's values
    of its variables to the controller it starts, so this must run before ``trainer.fit()``."""
    if nodes == 1:
        for k, v in ONE_NODE_ENV.items():
            os.environ.setdefault(k, v)


def join_address(explicit: str | None) -> str | None:
    """``--ray-address``, else ``$RAY_ADDRESS``; None: start a local Ray.

    An ``http(s)://`` address is a job server's (the dashboard's): what ``ray job submit`` wants,
    and what the local stack's printed exports set, so a shell that submits jobs has it. ``ray.init``
    needs the head's GCS address (HOST:6379) instead, and would refuse in a traceback; inside a
    submitted job Ray sets RAY_ADDRESS to the GCS address itself."""
    address = explicit or os.environ.get("RAY_ADDRESS") or None
    if address and address.startswith(("http://", "https://")):
        where = "--ray-address" if explicit else "RAY_ADDRESS"
        raise UsageError(
            f"{where}={address} is a Ray job server's address (what `ray job submit` takes); a "
            "driver run directly joins the head by its GCS address: pass --ray-address HOST:6379 "
            "(the local stack's: 127.0.0.1:6379, `python -m infra.stack status` prints it), submit "
            "this command with `ray job submit -- python ...`, or unset RAY_ADDRESS to start a "
            "local Ray")
    return address


def worker_cpus(num_workers: int, cpus_per_worker: float, cluster_cpus: float) -> float:
    """``--cpus-per-worker``, or (0) the cluster's CPUs shared out, one kept for reading."""
    return cpus_per_worker or max(1.0, float(int((cluster_cpus - READ_CPUS) // num_workers)))


def local_cpus(num_workers: int, cpus_per_worker: float) -> int:
    """Logical CPUs for a local ``ray.init``: the machine's cores, and at least one more than the
    workers take. Without the extra one, a worker holding every CPU (one worker of 2 CPUs on a
    2-core machine) leaves Ray Data's read tasks unschedulable and the run waits forever, idle."""
    cores = os.cpu_count() or 1
    cpw = worker_cpus(num_workers, cpus_per_worker, cores)
    return max(cores, math.ceil(num_workers * cpw) + READ_CPUS)


def check_fits(num_workers: int, cpw: float, *, use_gpu: bool = False, reading: bool = True,
               resources: dict | None = None) -> None:
    """Refuse, before anything is scheduled, a request the whole cluster could never hold: Ray
    would queue it forever without a word. ``reading``: the workers read through Ray Data, which
    needs a CPU of its own beside theirs. ``resources``: the cluster's (``ray.cluster_resources()``)."""
    if resources is None:
        import ray

        resources = ray.cluster_resources()
    cpus, gpus = resources.get("CPU", 0), resources.get("GPU", 0)
    if use_gpu and gpus < num_workers:
        raise UsageError(f"--num-workers {num_workers} --use-gpu needs {num_workers} GPUs; the "
                         f"cluster has {gpus:g}: lower --num-workers or add GPU nodes")
    need = num_workers * cpw + (READ_CPUS if reading else 0)
    if need > cpus:
        raise UsageError(f"--num-workers {num_workers} --cpus-per-worker {cpw:g} needs "
                         f"{num_workers * cpw:g} CPUs for its workers"
                         + (f" plus {READ_CPUS} for reading" if reading else "")
                         + f"; the cluster has {cpus:g}; lower --num-workers or "
                         "--cpus-per-worker, or add nodes")


def pending_demands() -> str | None:
    """What the cluster's scheduler cannot place now (the "Pending Demands" of ``ray status``),
    as text: empty when nothing waits, None where Ray does not say."""
    try:
        import ray
        from ray.autoscaler.v2.sdk import get_cluster_status

        demands = get_cluster_status(ray.get_runtime_context().gcs_address).resource_demands
        return "; ".join(f"{b.count} x {_shape(b.bundle)}"
                         for d in [*demands.ray_task_actor_demand, *demands.placement_group_demand]
                         for b in d.bundles_by_count)
    except Exception:  # noqa: BLE001 (an older or newer Ray, a cluster without the autoscaler)
        return None


def _shape(bundle: dict) -> str:
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in sorted(bundle.items())
                           if not k.startswith(("bundle_group", "node:"))) + "}"


def stall_message(what: str, num_workers: int, cpw: float, use_gpu: bool, waited: float,
                  reading: bool = True, task: bool = False) -> str:
    """One line: what ``what`` asked for, what the cluster has and has free, how to change it."""
    import ray

    total, free = ray.cluster_resources(), ray.available_resources()
    pending = pending_demands()
    asked = (f"{cpw:g} CPU(s) in one task" if task else
             f"{num_workers} worker(s) x {cpw:g} CPU" + (" + 1 GPU" if use_gpu else "")
             + (f" plus {READ_CPUS} CPU for reading" if reading else ""))
    gpus = (f", {free.get('GPU', 0):g} of {total.get('GPU', 0):g} GPUs free" if use_gpu else "")
    state = "not started" if task else "no epoch finished"
    since = "it was submitted" if task else "it started"
    head = (f"{what}: {state} {waited:.0f}s after {since}; it asks for {asked}; the "
            f"cluster has {free.get('CPU', 0):g} of {total.get('CPU', 0):g} CPUs free{gpus}")
    if pending == "":  # Ray says nothing waits: the workers are placed, the epoch is just long
        return (head + "; nothing waits to be scheduled, so its workers are running: a first "
                "epoch this large can take longer (this line repeats until one ends)")
    return (head + (f"; waiting to be scheduled: {pending}" if pending else "")
            + ". If it stays this way, other runs hold what it needs, or the request does not "
            "fit: lower --num-workers or --cpus-per-worker, or add nodes")


@contextlib.contextmanager
def watch_start(message: Callable[[float], str], progressed: Callable[[], bool],
                after: float = STALL_SECONDS, every: float = 5 * STALL_SECONDS,
                say: Callable[[str], None] = print) -> Iterator[None]:
    """Around a blocking run (``trainer.fit()``): if ``progressed()`` is still false ``after``
    seconds in (and every ``every`` seconds after that), print ``message(seconds waited)``. The
    first progress ends the watch: from then on the run has what it needs."""
    done, t0 = threading.Event(), time.monotonic()

    def watch() -> None:
        wait = after
        while not done.wait(wait):
            try:
                if progressed():
                    return
                say(message(time.monotonic() - t0))
            except Exception:  # noqa: BLE001 (a heartbeat never breaks the run it watches)
                return
            wait = every

    thread = threading.Thread(target=watch, name="ray-start-watch", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()


def task_started(ref) -> bool:
    """Whether the task of ``ref`` has been placed (running or ended), from Ray's state API;
    False where that cannot tell (then the watch goes on saying what the cluster has free)."""
    try:
        import ray

        if ray.wait([ref], timeout=0)[0]:
            return True
        from ray.util.state import get_task

        found = get_task(ref.task_id().hex(), timeout=5)
        tasks = found if isinstance(found, list) else [found]
        return any(t is not None and t.state not in ("PENDING_ARGS_AVAIL", "PENDING_NODE_ASSIGNMENT",
                                                      "PENDING_OBJ_STORE_MEM_AVAIL",
                                                      "PENDING_ARGS_FETCH", "NIL")
                   for t in tasks)
    except Exception:  # noqa: BLE001 (no state API: a cluster without the dashboard)
        return False


def checkpoints(run_dir: str) -> set[str]:
    """The checkpoint folders Ray Train has written in a run's directory (one per epoch)."""
    from pyarrow import fs as pafs

    from prepared.uri import filesystem

    fs, path = filesystem(run_dir)
    try:
        # folders only: Ray Train also writes checkpoint_manager_snapshot.json beside them
        return {i.base_name for i in fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
                if i.base_name.startswith("checkpoint_") and i.type == pafs.FileType.Directory}
    except OSError:
        return set()


def drop_checkpoints(run_dir: str) -> int:
    """Delete the checkpoint folders of a finished run (``checkpoints``); returns how many.
    Only for a run whose model file and record are written: nothing resumes from them then."""
    from prepared.uri import filesystem

    fs, path = filesystem(run_dir)
    names = sorted(checkpoints(run_dir))
    for name in names:
        fs.delete_dir(f"{path}/{name}")
    return len(names)


def watch_run(run_dir: str, what: str, num_workers: int, cpw: float,
              use_gpu: bool) -> contextlib.AbstractContextManager:
    """``watch_start`` for a Ray Train run writing to ``run_dir``: its progress is a new
    checkpoint (a resumed run has old ones)."""
    before = checkpoints(run_dir)
    return watch_start(lambda waited: stall_message(what, num_workers, cpw, use_gpu, waited),
                       lambda: bool(checkpoints(run_dir) - before),
                       say=lambda line: print(line, flush=True))
