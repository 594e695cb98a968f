"""A real deployment on this machine: one `flower-superlink` and N `flower-supernode`
processes talking over the loopback network, then the run submitted as `flwr run` would
(fedapps/launcher.py), then a clean shutdown.

Each SuperNode gets `--node-config "partition-id=i num-partitions=N data-root=... state-dir=..."`
exactly as it would on a Jetson or a Raspberry Pi (see deploy/README.md); only the addresses
differ. Every process started here is stopped by PID on the way out, also on Ctrl-C.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import httpx

from fedapps import rundir
from fedapps.compute_slots import environment as slots_environment
from fedapps.errors import ConfigError
from fedapps.launcher import CONNECTION, LocalSuperLink, default_filter, free_port, submit
from fedapps.processes import mark_of, start_watched, stop_trees, unwatch

IN_MEMORY_LINK_STATE = ":flwr-in-memory:"  # flower-superlink's --database for state in RAM
LOG_FOLDER = "logs"  # <run dir>/logs: superlink.log, supernode-<i>.log (warm ClientApps too)


def node_config(partition_id: int, num_partitions: int, data_root: Path | None,
                state_dir: Path | None, extra: dict[str, str] | None = None) -> str:
    """The --node-config string of one SuperNode."""
    items = {"partition-id": str(partition_id), "num-partitions": str(num_partitions),
             "num-threads": "1"}
    if data_root is not None:
        items["data-root"] = f'"{data_root}"'
    if state_dir is not None:
        items["state-dir"] = f'"{state_dir}"'
    for key, value in (extra or {}).items():
        items[key] = value if value.replace(".", "").isdigit() else f'"{value}"'
    return " ".join(f"{k}={v}" for k, v in items.items())


def warm_clientapp_command(runtime_port: int, supernode_pid: int,
                           pull_interval: float | None = None) -> list[str]:
    """The long-running ClientApp process beside a `--isolation process` SuperNode; beside a
    quick SuperNode (`pull_interval`) it waits at most that long between idle polls (never
    longer than its own default, 1 s)."""
    from fedapps.warm_clientapp import POLL_MAX_SECONDS

    cmd = [sys.executable, "-m", "fedapps.warm_clientapp", "--runtime-api-address",
           f"127.0.0.1:{runtime_port}", "--parent-pid", str(supernode_pid)]
    if pull_interval is None or pull_interval >= POLL_MAX_SECONDS:
        return cmd
    return cmd + ["--poll-max", f"{pull_interval:g}"]


def supernode_command(args: Sequence[str], pull_interval: float | None,
                      one_process: bool = False) -> list[str]:
    """`flower-supernode ARGS`, or with `pull_interval` Flower's SuperNode with a shorter idle
    pull (fedapps/quick_supernode.py), or with `one_process` Flower's SuperNode serving its
    ClientApp tasks in a thread of its own (fedapps/one_process_node.py)."""
    if one_process:
        from fedapps.one_process_node import command as one_process_command

        return one_process_command(pull_interval, list(args))
    if pull_interval is None:
        return ["flower-supernode", *args]
    from fedapps.quick_supernode import command

    return command(pull_interval, list(args))


class SuperNode:
    """One `flower-supernode` process in its own process group; with `warm` (the default) it
    runs with `--isolation process` beside one long-running ClientApp process (stopped with
    it, and exiting by itself when the SuperNode is gone), otherwise Flower starts a ClientApp
    process per message; with `one_process` (and `warm`) that ClientApp is a thread of the
    SuperNode's own process (fedapps/one_process_node.py). `pull_interval`: see
    fedapps/quick_supernode.py (None: Flower's 3 s)."""

    def __init__(self, link: LocalSuperLink, index: int, config: str,
                 extra_args: Sequence[str] = (), warm: bool = True,
                 pull_interval: float | None = None, one_process: bool = False) -> None:
        if one_process and not warm:
            raise ConfigError("one-process: a node's ClientApp runs in its SuperNode's process "
                              "only when warm (not with --cold)")
        self.link, self.index, self.config, self.warm = link, index, config, warm
        self.pull_interval, self.one_process = pull_interval, one_process
        self.extra_args = list(extra_args) or ["--insecure"]
        self.log_path = link.workdir / f"supernode-{index}.log"
        self.process: subprocess.Popen | None = None
        self.worker: subprocess.Popen | None = None

    def start(self) -> SuperNode:
        port = free_port()
        cmd = supernode_command([*self.extra_args, "--superlink", self.link.address,
                                 "--port", str(port), "--node-config", self.config,
                                 "--isolation", "process" if self.warm else "subprocess"],
                                self.pull_interval, self.one_process)
        env = self.link.env()
        env["FLWR_HOME"] = str(self.link.workdir / f"node-home-{self.index}")
        with open(self.log_path, "ab") as log_file:  # both die with the launcher, even SIGKILL
            self.process = start_watched(cmd, env=env, stdout=log_file,
                                         stderr=subprocess.STDOUT, start_new_session=True)
            if self.warm and not self.one_process:
                try:
                    self.worker = start_watched(
                        warm_clientapp_command(port, self.process.pid, self.pull_interval),
                        env=env,
                        stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True)
                except OSError:
                    self.stop()  # never leave the SuperNode behind
                    raise
        return self

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> None:
        for process in (self.process, self.worker):
            if process is not None and process.poll() is None:
                stop_group(process, sig, timeout)
            if process is not None:  # and what left its group
                stop_trees([], grace=timeout, marks=[mark_of(process.pid)])
                unwatch(process.pid)


def stop_group(process: subprocess.Popen, sig: int, timeout: float) -> None:
    """Signal a process's group (it leads one), SIGKILL it after `timeout` seconds."""
    try:
        os.killpg(process.pid, sig)
        process.wait(timeout=timeout)
    except ProcessLookupError:
        return
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=5)


def run_federation(
    experiment: str,
    overrides: Sequence[str],
    num_nodes: int,
    run_dir: Path,
    data_root: Path | None = None,
    state_root: Path | None = None,
    node_extra: dict[int, dict[str, str]] | None = None,
    superlink_args: Sequence[str] = (),
    supernode_args: Sequence[str] = (),
    connection: dict[str, object] | None = None,
    show: Callable[[str], bool] = default_filter,
    during: Callable[[list[SuperNode]], None] | None = None,
    secure: Path | None = None,
    mode: str = rundir.NEW,
    warm: bool = True,
    pull_interval: float | None = None,
    link_hold: float | None = None,
    one_process: bool = False,
    compute_slots: int | None = None,
) -> str:
    """Start a SuperLink and `num_nodes` SuperNodes, run the app, stop everything.

    `secure`: a folder of deploy/make_certs.py output (made there if empty): TLS on every
    connection and SuperNode authentication, each node registered with its public key.
    `during`, if given, runs in a thread while the run is in flight (fault-injection tests use
    it to kill and restart nodes). The run directory is claimed as in `fedapps run` (`mode`:
    what to do with a run already there, fedapps/rundir.py). `warm`: one long-running ClientApp
    process per node (fedapps/warm_clientapp.py) instead of Flower's process per message;
    `one_process`: that ClientApp a thread of each SuperNode's process instead
    (fedapps/one_process_node.py). `pull_interval`: the SuperNodes' idle pull in seconds
    (fedapps/quick_supernode.py; None: Flower's own 3 s); with `warm`, also the ClientApps'
    longest wait between polls.
    `link_hold`: the SuperLink holds an empty pull up to this many seconds until what it asks
    for arrives: a message for the node, a reply for the ServerApp, the object pulled
    (fedapps/quick_superlink.py; None: Flower's SuperLink as it is).
    `compute_slots`: with `warm`, at most this many of the nodes' ClientApps compute at once,
    the others waiting for a slot, as a simulation runs as many clients as it has cores
    (fedapps/compute_slots.py; None: all at once).
    Returns the SuperLink's final run status."""
    with rundir.claim(run_dir, mode) as run_id:
        run_config = {"experiment": experiment, "overrides": shlex.join(overrides),
                      "output-dir": str(run_dir.parent), "run-name": run_dir.name,
                      "run-id": run_id}
        return _federate(run_config, num_nodes, data_root, state_root, node_extra,
                         superlink_args, supernode_args, connection, show, during, secure, warm,
                         pull_interval, link_hold, one_process, compute_slots)


def _federate(run_config: dict[str, str], num_nodes: int, data_root: Path | None,
              state_root: Path | None, node_extra: dict[int, dict[str, str]] | None,
              superlink_args: Sequence[str], supernode_args: Sequence[str],
              connection: dict[str, object] | None, show: Callable[[str], bool],
              during: Callable[[list[SuperNode]], None] | None, secure: Path | None,
              warm: bool, pull_interval: float | None, link_hold: float | None,
              one_process: bool, compute_slots: int | None) -> str:
    """run_federation's work once the run directory is claimed."""
    import threading

    workdir = Path(tempfile.mkdtemp(prefix="fedapps-deploy-"))
    if secure is not None:
        superlink_args, connection = tls_superlink(secure, num_nodes)
    nodes: list[SuperNode] = []
    status = "stopped before it ended"  # an exception or Ctrl-C: the logs are kept all the same
    try:
        # in-memory link state: with the SQLite file, 20 nodes answering at once on a starved
        # machine held its write lock past SQLite's 5 s busy timeout and the SuperLink failed the
        # run with `database is locked` (docs/PERFORMANCE.md); a lock held 12 s ends a run there
        with LocalSuperLink(workdir, simulation=False, extra_args=superlink_args,
                            connection=connection, database=IN_MEMORY_LINK_STATE,
                            hold=link_hold) as link:
            if warm and compute_slots:
                link.extra_env.update(slots_environment(workdir / "compute-slots",
                                                        compute_slots))
            try:
                for i in range(num_nodes):
                    if secure is not None:
                        register(link, secure / f"node-{i}.pub")
                        supernode_args = tls_supernode(secure, i)
                    state_dir = state_root / f"node-{i}" if state_root else None
                    cfg = node_config(i, num_nodes, data_root, state_dir, (node_extra or {}).get(i))
                    nodes.append(SuperNode(link, i, cfg, supernode_args, warm,
                                           pull_interval, one_process).start())
                worker = threading.Thread(target=during, args=(nodes,), daemon=True) if during \
                    else None
                if worker:
                    worker.start()
                _, status = submit(link, run_config, 0, show=show, deployment=True)
                if worker:
                    worker.join(timeout=5)
            finally:
                for node in nodes:
                    node.stop()
                time.sleep(0.2)
    finally:
        keep_logs(workdir, Path(run_config["output-dir"]) / run_config["run-name"] / LOG_FOLDER,
                  status)
    return status


def keep_logs(workdir: Path, log_dir: Path, status: str) -> None:
    """Copy the SuperLink's and SuperNodes' logs into the run directory (`logs/`: this
    attempt's only, so a resume replaces it), then delete the working folder, which holds each
    node's copy of the installed FAB (48 MB for 20 nodes) and was left behind by every run
    before; after a run that did not complete it stays, and where it is goes to stderr."""
    try:
        shutil.rmtree(log_dir, ignore_errors=True)
        log_dir.mkdir(parents=True, exist_ok=True)
        for path in workdir.glob("*.log"):
            shutil.copyfile(path, log_dir / path.name)
    except OSError as err:  # never hides the run's own outcome or exception
        print(f"fedapps: could not copy the logs to {log_dir} ({err}); they stay in {workdir}",
              file=sys.stderr)
        return
    if status == "finished:completed":
        shutil.rmtree(workdir, ignore_errors=True)
    else:
        print(f"fedapps: run status {status}; logs in {log_dir}, working folder {workdir}",
              file=sys.stderr)


def check_tls_folder(secure: Path, num_nodes: int) -> None:
    """A --tls folder is empty (certificates are made there) or holds the CA, the server's
    certificate and a key pair for each of the `num_nodes` nodes; else a one-line ConfigError
    before any process starts (it used to fail in `flwr supernode register`, with a
    traceback)."""
    if secure.exists() and not secure.is_dir():
        raise ConfigError(f"--tls {secure}: not a folder")
    if not secure.is_dir() or not any(secure.iterdir()):
        return
    needed = ["ca.pem", "server.pem", "server.key"]
    needed += [f"node-{i}{ext}" for i in range(num_nodes) for ext in ("", ".pub")]
    missing = [name for name in needed if not (secure / name).is_file()]
    if missing:
        nodes = sum((secure / f"node-{i}.pub").is_file() for i in range(num_nodes))
        raise ConfigError(
            f"--tls {secure}: missing {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}"
            f" (node keys for {nodes} of {num_nodes} clients); give an empty folder to make "
            f"them, or run python deploy/make_certs.py {secure} --nodes {num_nodes}")


def tls_superlink(secure: Path, num_nodes: int) -> tuple[list[str], dict[str, object]]:
    """SuperLink arguments and `flwr` connection options for TLS + node authentication."""
    check_tls_folder(secure, num_nodes)
    if not (secure / "server.pem").is_file():
        import importlib.util

        spec = importlib.util.spec_from_file_location(
            "make_certs", Path(__file__).resolve().parent.parent / "deploy" / "make_certs.py")
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        module.make_all(secure, ["127.0.0.1", "localhost"], num_nodes)
    args = ["--ssl-certfile", str(secure / "server.pem"), "--ssl-keyfile",
            str(secure / "server.key"), "--ssl-ca-certfile", str(secure / "ca.pem"),
            "--enable-supernode-auth"]
    return args, {"root-certificates": str(secure / "ca.pem")}


def tls_supernode(secure: Path, index: int) -> list[str]:
    return ["--root-certificates", str(secure / "ca.pem"),
            "--auth-supernode-private-key", str(secure / f"node-{index}")]


def register(link: LocalSuperLink, public_key: Path) -> None:
    """`flwr supernode register`: only registered public keys may join the federation."""
    proc = subprocess.run(["flwr", "supernode", "register", str(public_key), CONNECTION],
                          env=link.env(), capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        raise RuntimeError(f"registering {public_key.name} failed: {proc.stdout[-500:]}"
                           f"{proc.stderr[-500:]}")


def check_node_settings(superlink: str, partition_id: int, num_partitions: int,
                        data_root: str | None, dataset: str | None, tls: bool = False) -> None:
    """One-line ConfigErrors for what a SuperNode would otherwise fail on later."""
    from fedapps.data import DATASETS, check_available  # torch: only when a node is checked
    from fedapps.data.datasets import BadSourceFile

    host, sep, port = superlink.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"--superlink={superlink!r}: expected host:port")
    if num_partitions < 1:
        raise ConfigError(f"--num-partitions={num_partitions}: must be >= 1")
    if not 0 <= partition_id < num_partitions:
        raise ConfigError(f"--partition-id={partition_id}: must be in 0..{num_partitions - 1} "
                          f"(--num-partitions={num_partitions})")
    if dataset is not None:
        if dataset not in DATASETS:
            raise ConfigError(f"--dataset={dataset!r}: allowed: {', '.join(sorted(DATASETS))}")
        root = Path(data_root or "data").resolve()
        try:
            check_available(dataset, root, download=False)
        except BadSourceFile:
            raise
        except ConfigError:
            raise ConfigError(f"--data-root={str(root)!r}: dataset {dataset} not found there "
                              "(copy its folder, e.g. FashionMNIST/raw, to the device)") from None
    scheme = "https" if tls else "http"
    try:
        httpx.get(f"{scheme}://{superlink}/health", timeout=3.0, verify=False)
    except httpx.HTTPError as err:
        raise ConfigError(f"--superlink={superlink}: cannot reach a SuperLink there "
                          f"({type(err).__name__})") from None
