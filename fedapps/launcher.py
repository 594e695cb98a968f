"""Run an experiment as a real Flower simulation on a SuperLink this process owns.

Starts `flower-superlink --simulation` on free loopback ports with its own FLWR_HOME, submits
the app over the SuperLink's Control API from this process (what `flwr run --stream` does,
without the 2-3 s of a `flwr` process importing Flower's CLI), relays the progress lines of the
run's log stream, then asks the SuperLink for the run's final status (the stream ends the same
way for a failed run) and checks the results file. Every process it started is stopped on the
way out, also on Ctrl-C.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

import httpx

from fedapps import rundir
from fedapps.processes import descendants, mark_of, start_watched, stop_trees, unwatch

APP_DIR = Path(__file__).resolve().parent.parent
CONNECTION = "fedapps"


def flower_env(home: Path) -> dict[str, str]:
    """Environment for offline, quiet Flower processes (ARCHITECTURE.md pitfalls)."""
    env = os.environ.copy()
    env.update({
        "FLWR_HOME": str(home),
        "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
        "FLWR_DISABLE_UPDATE_CHECK": "1",
        "FLWR_TELEMETRY_ENABLED": "0",
        "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0",
        # Single-machine simulation: keep Ray's services on 127.0.0.1 (this switch makes Ray
        # use the loopback address instead of the machine's network interface).
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "PYTHONUNBUFFERED": "1",
    })
    return env


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def log_lines(chunks: Iterable[str]) -> Iterator[str]:
    """Whole lines, each ending in a newline, of a log streamed in chunks that may end inside a
    line (the Control API sends what the run logged since the last chunk)."""
    pending = ""
    for chunk in chunks:
        *lines, pending = (pending + chunk).split("\n")
        yield from (line + "\n" for line in lines)
    if pending:
        yield pending + "\n"


class RunNotStarted(RuntimeError):
    """The SuperLink did not start the run (its answer to StartRun)."""


class LocalSuperLink:
    """A `flower-superlink --simulation` process with its own FLWR_HOME and port."""

    def __init__(self, workdir: Path, startup_timeout: float = 60.0, simulation: bool = True,
                 extra_args: Sequence[str] = (),
                 connection: dict[str, object] | None = None,
                 extra_env: dict[str, str] | None = None,
                 database: str | None = None, hold: float | None = None) -> None:
        self.simulation = simulation
        # hold: a pull that finds nothing (a node's message, the ServerApp's reply, an object)
        # waits up to this long for it (fedapps/quick_superlink.py); None: Flower's SuperLink
        self.hold = hold
        # link state: a SQLite file by default; `:flwr-in-memory:` (Flower's own default) keeps
        # it in the SuperLink's memory, which no writer can lock (deploy.py uses it)
        self.database = database
        self.extra_env = extra_env or {}
        # how `flwr` reaches this SuperLink: insecure by default, or root-certificates for TLS
        self.connection = connection or {"insecure": True}
        self.extra_args = list(extra_args)
        self.workdir = workdir
        self.home = workdir / "flwr-home"
        self.log_path = workdir / "superlink.log"
        self.port = free_port()
        self.startup_timeout = startup_timeout
        self.process: subprocess.Popen | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        return {**flower_env(self.home), **self.extra_env}

    def __enter__(self) -> LocalSuperLink:
        self.home.mkdir(parents=True, exist_ok=True)
        options = "".join(f"{k} = {json.dumps(v)}\n" for k, v in self.connection.items())
        (self.home / "config.toml").write_text(
            f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\n'
            f'address = "{self.address}"\n{options}')
        args = [*(["--simulation"] if self.simulation else []),
                "--isolation", "subprocess", "--disable-runtime-dependency-installation",
                "--host", "127.0.0.1", "--port", str(self.port),
                "--database", self.database or str(self.home / "state.db"),
                *(self.extra_args or ["--insecure"])]
        if self.hold is None:
            cmd = ["flower-superlink", *args]
        else:
            from fedapps.quick_superlink import command

            cmd = command(self.hold, args)
        with open(self.log_path, "ab") as log_file:
            # dies with this process, even on SIGKILL; marked, so Ray's orphans are found too
            self.process = start_watched(cmd, env=self.env(), stdout=log_file,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"flower-superlink exited with code {self.process.returncode};"
                                   f" see {self.log_path}")
            if self.healthy():
                return self
            time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"flower-superlink did not start within {self.startup_timeout:.0f}s;"
                           f" see {self.log_path}")

    def healthy(self) -> bool:
        scheme = "http" if self.connection.get("insecure") else "https"
        ca = self.connection.get("root-certificates")
        verify = ssl.create_default_context(cafile=str(ca)) if ca else True
        try:
            return httpx.get(f"{scheme}://{self.address}/health", timeout=1.0,
                             verify=verify).is_success
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        """Stop the SuperLink and everything it spawned: its process group, and descendants
        that left the group (Ray's services start sessions of their own)."""
        if self.process is None or self.process.poll() is not None:
            return
        pid = self.process.pid
        family = descendants(pid)
        for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
            try:
                os.killpg(pid, sig)
            except ProcessLookupError:
                break
            try:
                self.process.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
        stop_trees(family, grace=5.0, marks=[mark_of(pid)])  # what left the group, orphans too
        unwatch(pid)

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def control_client(self):
        """A client of the SuperLink's Control API (Flower's, as `flwr run` and `flwr ls` use
        it), over TLS where the connection has a root certificate; the caller closes it."""
        from flwr.supercore.control.control_http_client import ControlHttpClient

        ca = self.connection.get("root-certificates")
        return ControlHttpClient.from_server_address(
            self.address, insecure=bool(self.connection.get("insecure")),
            root_certificates=Path(str(ca)).read_bytes() if ca else None,
            interceptors=())

    def run_log(self, app_dir: Path, run_config: dict[str, str],
                federation: dict[str, int | float] | None) -> Iterator[str]:
        """Start the app in `app_dir` and yield its log line by line until the run ends, as
        `flwr run APP --stream` prints it: first "Successfully started run <id>". `federation`:
        the simulation's settings (Flower's SimulationConfig fields), None in a deployment.
        Raises RunNotStarted when the app cannot be bundled or the SuperLink refuses it."""
        from flwr.cli.build import build_fab_from_disk
        from flwr.common.serde import fab_to_proto, user_config_to_proto
        from flwr.proto.control_pb2 import StartRunRequest, StreamLogsRequest
        from flwr.supercore.fab import Fab
        from flwr.supercore.utils import simulation_config_from_json

        client = self.control_client()
        try:
            try:
                fab_bytes = build_fab_from_disk(app_dir)  # the app as `flwr run` bundles it
                fab = Fab(hashlib.sha256(fab_bytes).hexdigest(), fab_bytes, {})
                started = client.StartRun(StartRunRequest(
                    fab=fab_to_proto(fab), override_config=user_config_to_proto(run_config),
                    override_federation_config=(simulation_config_from_json(federation)
                                                if federation else None)))
            except Exception as err:  # noqa: BLE001 - a bad app or the SuperLink's refusal
                raise RunNotStarted(f"{type(err).__name__}: {err}") from err
            if not started.HasField("run_id"):
                raise RunNotStarted("the SuperLink gave no run id")
            yield f"Successfully started run {started.run_id}\n"
            stream = client.StreamLogs(StreamLogsRequest(run_id=started.run_id,
                                                         after_timestamp=0.0))
            yield from log_lines(chunk.log_output for chunk in stream)
        finally:
            client.close()

    def run_status(self, run_id: str) -> str:
        """'finished:completed', 'finished:failed', ... as the SuperLink reports it: asked over
        its Control API from this process (the `flwr ls` process it replaces took 2.6 s of a
        short run, importing Flower's CLI), through `flwr ls` where that fails."""
        try:
            return self._control_api_status(int(run_id))
        except Exception:  # noqa: BLE001 - any failure of the direct call: the CLI's answer
            return self._flwr_ls_status(run_id)

    def _control_api_status(self, run_id: int) -> str:
        from flwr.proto.control_pb2 import ListRunsRequest

        client = self.control_client()
        try:
            status = client.ListRuns(ListRunsRequest(run_id=run_id)).run_dict[run_id].status
        finally:
            client.close()
        # the string `flwr ls` prints: status, and the sub-status after a colon where set
        return f"{status.status}:{status.sub_status}" if status.sub_status else status.status

    def _flwr_ls_status(self, run_id: str) -> str:
        try:
            out = subprocess.run(["flwr", "ls", CONNECTION, "--run-id", run_id, "--format",
                                  "json"], env=self.env(), capture_output=True, text=True,
                                 timeout=60)
        except subprocess.TimeoutExpired:  # seen on a machine loaded far past its cores
            return "unknown (`flwr ls` did not answer within 60 s)"
        try:
            runs = json.loads(out.stdout)["runs"]
            return str(runs[0]["status"])
        except (json.JSONDecodeError, KeyError, IndexError):
            return f"unknown ({out.stdout.strip() or out.stderr.strip()})"


ANSI = re.compile(r"\x1b\[[0-9;]*m")  # Flower's log colours
ERROR_LINE = re.compile(r"^[\w.]*(Error|Exception|BadZipFile): .")  # a traceback's last line
# Flower's simulation re-raises the cause under this message: the line before it says more
FLOWER_WRAPPER = "RuntimeError: An error was encountered. Ending simulation."


def default_filter(line: str) -> bool:
    """Lines worth showing a user: our progress lines, warnings and errors."""
    if "default simulated SuperNodes" in line or "Manually terminating" in line:
        return False  # flwr notices that are expected and say nothing about the run
    return any(tag in line for tag in ("[fedapps]", "WARNING", "ERROR", "Error", "Traceback"))


def submit(
    link: LocalSuperLink,
    run_config: dict[str, str],
    num_supernodes: int,
    cpus_per_client: int = 1,
    gpus_per_client: float = 0.0,
    show: Callable[[str], bool] = default_filter,
    app_dir: Path = APP_DIR,
    deployment: bool = False,
    total_cpus: int | None = None,
    prefix: str = "",
) -> tuple[str | None, str]:
    """Submit the app, stream its log until it ends; returns (run id, final status).

    In a deployment the SuperNodes are real processes: no simulation settings are sent.
    `total_cpus` caps the CPUs the simulation's Ray backend may use (default: all of them), so
    several simulations can share a machine; `prefix` tags the lines shown (concurrent runs).
    """
    federation = None if deployment else {
        "num_supernodes": num_supernodes, "client_resources_num_cpus": cpus_per_client,
        "client_resources_num_gpus": gpus_per_client,
        **({"init_args_num_cpus": total_cpus} if total_cpus else {})}
    run_id = None
    error = ""  # the last exception line in the log: why a failed run failed
    colour = sys.stdout.isatty()  # no escape codes in redirected logs
    try:
        for line in link.run_log(app_dir, run_config, federation):
            plain = ANSI.sub("", line)
            if run_id is None and "Successfully started run" in plain:
                run_id = plain.strip().split()[-1]
            if ERROR_LINE.match(plain.strip()) and plain.strip() != FLOWER_WRAPPER:
                error = plain.strip()
            if show(plain):
                sys.stdout.write(prefix + (line if colour else plain))
                sys.stdout.flush()
    except RunNotStarted as refused:
        return None, f"not started ({refused})"
    except (httpx.HTTPError, ValueError) as lost:  # the stream broke off (or a bad frame): the
        if run_id is None:  # SuperLink's status below says how the run ended
            return None, f"not started ({type(lost).__name__}: {lost})"
    if run_id is None:
        return None, "not started (no run id)"
    status = link.run_status(run_id)
    if status != "finished:completed" and "run-name" in run_config:
        from fedapps.results import mark_failed  # matplotlib: only when a run failed

        mark_failed(Path(run_config["output-dir"]) / run_config["run-name"],
                    f"{error or 'no error line in the log'} (run status {status}; "
                    f"SuperLink log: {link.log_path})")
    return run_id, status


def gpus_per_client(device: str) -> float:
    """Ray's GPU share per simulated client: four clients train at a time on one GPU."""
    if device == "cpu":
        return 0.0
    import torch

    return 0.25 if torch.cuda.is_available() else 0.0


def run_experiment(
    experiment: str,
    overrides: Sequence[str],
    num_supernodes: int,
    run_dir: Path,
    gpus_per_client: float = 0.0,
    show: Callable[[str], bool] = default_filter,
    keep_workdir: bool = False,
    total_cpus: int | None = None,
    prefix: str = "",
    mode: str = rundir.NEW,
    ray_address: str | None = None,
) -> str:
    """Run one experiment in a fresh SuperLink; returns the SuperLink's final status.

    The run directory is claimed for the whole run (`mode`: what to do with a run already
    there, fedapps/rundir.py); a claim that fails raises before anything starts.
    `ray_address`: run the simulation's clients on an existing Ray cluster (its head's
    host:port) instead of a Ray started for this run. Flower's Ray backend calls `ray.init()`,
    which connects to RAY_ADDRESS when set; the cluster's own CPUs then bound the clients,
    so no CPU cap is sent (Ray refuses one when connecting to a cluster)."""
    with rundir.claim(run_dir, mode) as run_id:
        run_config = {"experiment": experiment, "overrides": shlex.join(overrides),
                      "output-dir": str(run_dir.parent), "run-name": run_dir.name,
                      "run-id": run_id,
                      "client-state-dir": str(rundir.client_state_root(run_dir))}
        workdir = Path(tempfile.mkdtemp(prefix="fedapps-"))
        cluster = {"RAY_ADDRESS": ray_address} if ray_address else None
        with LocalSuperLink(workdir, extra_env=cluster) as link:
            _, status = submit(link, run_config, num_supernodes,
                               gpus_per_client=gpus_per_client, show=show,
                               total_cpus=None if ray_address else total_cpus, prefix=prefix)
    if status != "finished:completed":
        print(f"fedapps: run status {status}; SuperLink log: {link.log_path}", file=sys.stderr)
    elif not keep_workdir:
        shutil.rmtree(workdir, ignore_errors=True)
    return status
