"""Batch optimisation on a Dask distributed cluster: the same tasks as `run_local`, on
several machines.

`run_dask` sends each `Task` (apsat.pipeline.batch) to a Dask worker and gathers one row
per task, with run_local's contract: rows in task order, stored results reused unless
`force`, finished results saved to the ResultStore by the calling process, a failure as
that model's row while the others go on.

Isolation. A Dask worker runs tasks in threads of a long-lived process, so a model that
crashes or eats all memory there would take the worker (and its other models) down. Each
task therefore runs, inside the worker, through `run_local([task], jobs=1)`: a fresh
process per model with the time and memory limits watched from outside, as on one
machine. Python forbids daemonic processes to have children, and Dask starts its worker
processes daemonic by default: workers must be started with the setting
`distributed.worker.daemon` off (`DASK_DISTRIBUTED__WORKER__DAEMON=False dask worker ...`;
the local cluster `run_dask` starts without a scheduler does so). A task on a daemonic
worker fails with a row saying this.

What the workers need: the same apsat installed (results are stored under the caller's
content key, which covers the caller's apsat source; a row computed by other source is
kept in the table with a notice but not stored: apsat.pipeline.store.same_source), and
the model files, rule files and output directory at the same
absolute paths as on the calling machine (a shared filesystem; relative paths are made
absolute here before the tasks leave). Reports are written by the workers; the result
records by the caller.

Failures: a task's exception becomes its failure row (the exception's type and message, one
line). A task that raises is run once more (`retries=1`: tasks are idempotent, each writes
its report directory whole or not at all); a worker lost mid-task has its task run again
elsewhere by the scheduler (up to `distributed.scheduler.allowed-failures`, then the row
says KilledWorker). The time limit is enforced inside the worker (the model's process is
killed, the row names the phase reached); a future still without an answer `GRACE_S`
after that is cancelled on the caller's side and becomes a "time limit" row too.

Events are run_local's: "start" (name, "WORKER-ADDRESS pid N"), "phase" (name, phase),
"done" (row), "reused" (row). Start and phase events travel as Dask worker events
(`log_event`), so they may arrive late or, once a model is done, not at all.

Who may use the cluster. Whoever reaches a scheduler's port can submit pickled functions
(code the workers run) and send back pickled results (code the caller unpickles), so a
scheduler off this machine is reached over TLS with certificates (`tls://`, the
credentials from `security=`, `load_security(FILE)` or Dask's `distributed.comm.tls.*`
settings); a plain `tcp://` (or schemeless) address that is not loopback is refused
before any connection unless `insecure=True`. `check_scheduler` says which.
"""
from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import queue as queue_mod
import time
import uuid
from pathlib import Path

from apsat.errors import ApsatError
from apsat.pipeline.batch import DEFAULT_TIMEOUT_S, Task
from apsat.pipeline.store import ResultStore, same_source

POLL_S = 0.1
GRACE_S = 30.0          # beyond the time limit: process start, imports, the row's way back
DAEMON_HELP = ("the Dask worker process is daemonic and cannot start the model's process: "
               "start workers with DASK_DISTRIBUTED__WORKER__DAEMON=False")
PLAIN_SCHEMES, TLS_SCHEMES = ("tcp", "ws"), ("tls", "wss")
SECURITY_KEYS = ("ca_file", "cert", "key")


def run_dask(tasks: list[Task], scheduler: str | None = None, store: ResultStore | None = None,
             force: bool = False, timeout: float = DEFAULT_TIMEOUT_S, on_event=None, client=None,
             max_memory_mib: float | None = None, jobs: int | None = None,
             security=None, insecure: bool = False) -> list[dict]:
    """Run `tasks` on a Dask cluster; one summary row per task, in task order (run_local's
    rows). The cluster: `client` (a distributed.Client, left open) if given, else the
    scheduler at `scheduler` ("tls://HOST:8786"; reached with `security`, a
    distributed.Security, else Dask's configured one; a plain tcp:// address off loopback
    only with `insecure`: see check_scheduler), else a cluster of `jobs` worker processes
    on this machine, started and stopped here (over TLS when `security` is given). Tasks
    whose key `store` has are reused (status "reused") unless `force`; rows with status ok
    or mismatch computed by this process's apsat source are saved to `store` here,
    atomically. Each model runs in its own process on a worker, limited to `timeout`
    seconds and `max_memory_mib` MiB. `on_event(kind, row_or_name, detail)` hears "start",
    "phase", "done" and "reused" (see the module docstring). KeyboardInterrupt cancels the
    futures and returns the rows finished so far (others "interrupted"; a model already
    running on a worker goes on there until it ends or hits its limits). Raises ApsatError
    when `distributed` is not installed, the scheduler address is refused (before any
    connection) or the scheduler cannot be reached."""
    if scheduler and client is None:
        security = check_scheduler(scheduler, security, insecure)
    rows: list[dict | None] = [None] * len(tasks)
    keys = [_key_or_none(t) for t in tasks]
    pending = []
    for i, task in enumerate(tasks):
        record = None if force or store is None or keys[i] is None else store.load(keys[i])
        if record is not None:
            rows[i] = {**record["row"], "status": "reused", "stored_status": record["row"]["status"]}
            _emit(on_event, "reused", rows[i], None)
        else:
            pending.append(i)
    if pending:
        with _connect(scheduler, client, jobs, security) as c:
            _run_pending(c, tasks, keys, pending, rows,
                         {"timeout": timeout, "max_memory_mib": max_memory_mib}, store, on_event)
    return [r for r in rows if r is not None]


def _key_or_none(task: Task) -> str | None:
    """The task's content key; None when its files cannot be read here (the worker's row
    then says why)."""
    try:
        return task.key()
    except OSError:
        return None


def _emit(on_event, kind, what, detail):
    if on_event is not None:
        on_event(kind, what, detail)


def _distributed():
    """The distributed package; ApsatError saying how to install it when it is missing."""
    try:
        import distributed
    except ImportError as e:
        raise ApsatError("the dask executor needs the distributed package: "
                         "pip install 'apsat[dask]'") from e
    return distributed


def check_scheduler(scheduler: str, security=None, insecure: bool = False):
    """The distributed.Security to reach `scheduler` with (None: plain, Dask's default),
    decided before any connection. tls:// (or wss://) takes `security`, else one built
    from Dask's config, and needs a CA file and a client certificate in it. tcp:// (or
    ws://, or no scheme: Dask's default scheme) is for loopback only (127.0.0.0/8, ::1,
    localhost: names are not resolved) unless `insecure`, and takes no credentials.
    ApsatError, one line, for anything else."""
    distributed = _distributed()
    from distributed.comm.addressing import parse_address, parse_host_port

    try:
        scheme, loc = parse_address(scheduler)
        host = parse_host_port(loc)[0] if scheme != "inproc" else "localhost"
    except ValueError as e:
        raise ApsatError(f"{scheduler}: not a scheduler address ({_one_line(e)})") from None
    if scheme in TLS_SCHEMES:
        security = security if security is not None else distributed.Security()
        if not (security.tls_ca_file and security.tls_client_cert):
            raise ApsatError(f"{scheduler}: {scheme}:// needs TLS credentials: --security FILE, or Dask's "
                             f"distributed.comm.tls settings (ca-file, client.cert, client.key)")
        return security
    if scheme not in PLAIN_SCHEMES + ("inproc",):
        raise ApsatError(f"{scheduler}: unsupported scheme {scheme}:// (use tls://, or tcp:// on this machine)")
    if security is not None and security.tls_client_cert:
        raise ApsatError(f"{scheduler}: TLS credentials given for a plain {scheme}:// address: write tls://{loc}")
    if not insecure and not _loopback(host):
        raise ApsatError(f"{scheduler}: refusing plain {scheme}:// to a scheduler off this machine (anyone who "
                         f"reaches its port can run code on the cluster): use tls:// with --security FILE, "
                         f"or --insecure on a network you trust")
    return None


def _loopback(host: str) -> bool:
    """Whether `host` names this machine: localhost or a loopback IP address."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def load_security(path):
    """A distributed.Security from a security file: YAML (or JSON) with `ca_file` (the
    certificate authority's certificate), `cert` (this machine's client certificate) and
    optionally `key` (its private key, when not in `cert`'s file); paths relative to the
    file's folder. ApsatError, one line, when the file is missing, malformed, or names a
    missing file."""
    distributed = _distributed()
    import yaml

    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as e:
        raise ApsatError(f"{path}: cannot read the security file ({e.strerror or e})") from None
    except yaml.YAMLError as e:
        raise ApsatError(f"{path}: not a YAML or JSON security file ({_one_line(e)})") from None
    if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
        raise ApsatError(f"{path}: a security file maps ca_file, cert and key to file paths")
    unknown = sorted(set(map(str, data)) - set(SECURITY_KEYS))
    if unknown or not (data.get("ca_file") and data.get("cert")):
        what = f"unknown key(s) {', '.join(unknown)}" if unknown else "ca_file and cert are required"
        raise ApsatError(f"{path}: {what} (a security file maps ca_file, cert and key to file paths)")
    files = {k: (path.parent / Path(v).expanduser()) for k, v in data.items()}
    missing = [f"{k} {p}" for k, p in files.items() if not p.is_file()]
    if missing:
        raise ApsatError(f"{path}: no such file: {', '.join(missing)}")
    return distributed.Security(require_encryption=True, tls_ca_file=str(files["ca_file"]),
                                tls_client_cert=str(files["cert"]),
                                tls_client_key=str(files["key"]) if "key" in files else None)


@contextlib.contextmanager
def _connect(scheduler: str | None, client, jobs: int | None, security=None):
    """A distributed.Client for the run: the caller's, one to `scheduler` (with
    `security`, checked by check_scheduler), or one to a local cluster of non-daemonic
    worker processes (closed afterwards)."""
    if client is not None:
        yield client
        return
    Client = _distributed().Client
    if scheduler:
        try:
            c = Client(scheduler, security=security)
        # whatever distributed raises when it cannot connect (OSError, a TLS TypeError, an
        # AssertionError from a client loop that did not start) is one line for the user
        except Exception as e:      # noqa: BLE001
            raise ApsatError(f"cannot reach the Dask scheduler at {scheduler}: {_one_line(e)}") from e
        with c:
            yield c
        return
    with local_cluster(jobs, security) as cluster, Client(cluster, security=security) as c:
        yield c


@contextlib.contextmanager
def local_cluster(n_workers: int | None = None, security=None):
    """A distributed.LocalCluster on loopback for batch tasks: `n_workers` (None: Dask's
    choice) single-thread worker processes, started non-daemonic so that each can start a
    process per model; no dashboard (the scheduler's HTTP endpoint on a free port); over
    tls:// with `security` (a distributed.Security) when given. Yields the cluster; closes
    it on exit."""
    import dask
    from distributed import LocalCluster

    tls = {"protocol": "tls://", "security": security} if security is not None else {}
    # the setting is read whenever a nanny (re)starts a worker: keep it for the cluster's life
    with dask.config.set({"distributed.worker.daemon": False}), \
            LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True, host="127.0.0.1",
                         dashboard_address=None, scheduler_kwargs={"dashboard_address": "127.0.0.1:0"},
                         **tls) as c:
        yield c


def _one_line(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}".strip()
    return text.splitlines()[0] if text else type(e).__name__


def _for_workers(task: Task) -> Task:
    """The task with its model, rule and output paths absolute (the workers' working
    directory is not the caller's)."""
    rules = [str(Path(r).resolve()) if Path(r).is_file() else r for r in task.rules]
    return dataclasses.replace(task, path=str(Path(task.path).resolve()), rules=rules,
                               out=str(Path(task.out).resolve()))


@dataclasses.dataclass
class _Watch:
    """What the caller knows of a submitted task: its future, when its model's process
    started (the latest start event; None while queued) and the phase reached."""
    future: object
    started: float | None = None
    phase: str = "queued"
    where: str = ""


def _run_pending(client, tasks, keys, pending, rows, limits, store, on_event):
    """Submit the pending tasks, follow their events and settle each future into its row."""
    topic = f"apsat-batch-{uuid.uuid4().hex}"
    events: queue_mod.Queue = queue_mod.Queue()
    client.subscribe_topic(topic, events.put)
    watches = {}
    try:
        for i in pending:
            key = f"apsat-{tasks[i].name}-{(keys[i] or 'unread')[:12]}-{uuid.uuid4().hex[:8]}"
            future = client.submit(_run_on_worker, _for_workers(tasks[i]), i, topic, limits,
                                   key=key, retries=1, pure=False)
            watches[i] = _Watch(future)
        while watches:
            _drain(events, watches, tasks, on_event)
            for i, watch in list(watches.items()):
                row = _settled(client, watch, tasks[i], limits["timeout"])
                if row is None:
                    continue
                del watches[i]
                rows[i] = {**row, "path": tasks[i].path}
                if store is not None and keys[i] is not None and row.get("status") in ("ok", "mismatch") \
                        and same_source(rows[i]):
                    task = {**dataclasses.asdict(tasks[i]), "rules": [str(r) for r in tasks[i].rules]}
                    store.save(keys[i], {"row": rows[i], "task": task})
                _emit(on_event, "done", rows[i], None)
            if watches:
                time.sleep(POLL_S)
    except KeyboardInterrupt:
        for i, watch in watches.items():
            watch.future.cancel()
            rows[i] = {**_base_row(tasks[i]), "status": "interrupted", "error": "stopped by Ctrl-C"}
    finally:
        with contextlib.suppress(Exception):
            client.unsubscribe_topic(topic)


def _drain(events, watches, tasks, on_event):
    """Apply the worker events received so far: a start restarts a task's clock."""
    while True:
        try:
            _, msg = events.get_nowait()
        except queue_mod.Empty:
            return
        watch = watches.get(msg.get("i"))
        if watch is None:                  # a late event of a model already done
            continue
        if msg["kind"] == "start":
            watch.started, watch.phase, watch.where = time.monotonic(), "starting", msg["where"]
            _emit(on_event, "start", tasks[msg["i"]].name, msg["where"])
        else:
            watch.phase = msg["phase"]
            _emit(on_event, "phase", tasks[msg["i"]].name, msg["phase"])


def _base_row(task: Task) -> dict:
    return {"model": task.name, "path": task.path, "target": task.target}


def _settled(client, watch: _Watch, task: Task, timeout: float) -> dict | None:
    """The task's row once its future is settled or over time, else None."""
    future = watch.future
    seconds = 0.0 if watch.started is None else time.monotonic() - watch.started
    failed = {**_base_row(task), "status": "failed", "seconds": seconds, "last_phase": watch.phase}
    status = future.status
    if status == "finished":
        try:
            return future.result()
        except Exception as e:            # the result could not be fetched from the worker
            return {**failed, "error": _one_line(e)}
    if status == "error":
        return {**failed, "error": _one_line(future.exception())}
    if status in ("cancelled", "lost"):
        return {**failed, "error": f"the Dask future was {status}"}
    if watch.started is None or seconds <= timeout + GRACE_S:
        return None
    if not _still_running(client, future.key):     # requeued after a lost worker: wait again
        watch.started = None
        return None
    future.cancel()
    return {**failed, "error": f"time limit {timeout:g} s hit in phase {watch.phase} "
                               f"(no answer from the worker {watch.where})"}


def _still_running(client, key) -> bool:
    """Whether a worker is processing the task now (asks the scheduler)."""
    try:
        return any(key in keys for keys in client.processing().values())
    except Exception:
        return True


def _run_on_worker(task: Task, index: int, topic: str, limits: dict) -> dict:
    """Inside a Dask worker: run the task in a fresh process with its limits (run_local,
    jobs=1), telling its start and phases as worker events on `topic`; its row. Raises
    RuntimeError on a daemonic worker, which cannot start the model's process."""
    import multiprocessing as mp

    from distributed import get_worker

    from apsat.pipeline.batch import run_local

    if mp.current_process().daemon:
        raise RuntimeError(DAEMON_HELP)
    worker = get_worker()

    def tell(kind, what, detail):
        if kind == "start":
            worker.log_event(topic, {"i": index, "kind": "start", "where": f"{worker.address} pid {detail}"})
        elif kind == "phase":
            worker.log_event(topic, {"i": index, "kind": "phase", "phase": str(detail)})

    rows = run_local([task], jobs=1, store=None, on_event=tell, **limits)
    if not rows:            # run_local keeps no row only when interrupted before starting
        return {**_base_row(task), "status": "failed", "error": "the worker stopped the run"}
    return rows[0]
