"""Run an experiment as a real Flower simulation on a SuperLink this process owns.

Starts `flower-superlink --simulation` on free loopback ports with its own FLWR_HOME, submits
the app with `flwr run --stream`, relays the progress lines, then asks the SuperLink for the
run's final status (since `flwr run` exits 0 even when the run failed) and checks the results
file. Every process it started is stopped on the way out, also on Ctrl-C.
"""

from __future__ import annotations

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
from collections.abc import Callable, Sequence
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


def toml_string(value: str) -> str:
    return json.dumps(value)  # a JSON string literal is a valid TOML basic string


class LocalSuperLink:
    """A `flower-superlink --simulation` process with its own FLWR_HOME and port."""

    def __init__(self, workdir: Path, startup_timeout: float = 60.0, simulation: bool = True,
                 extra_args: Sequence[str] = (),
                 connection: dict[str, object] | None = None,
                 extra_env: dict[str, str] | None = None,
                 database: str | None = None) -> None:
        self.simulation = simulation
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
        cmd = ["flower-superlink", *(["--simulation"] if self.simulation else []),
               "--isolation", "subprocess", "--disable-runtime-dependency-installation",
               "--host", "127.0.0.1", "--port", str(self.port),
               "--database", self.database or str(self.home / "state.db"),
               *(self.extra_args or ["--insecure"])]
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
        from flwr.supercore.control.control_http_client import ControlHttpClient

        ca = self.connection.get("root-certificates")
        client = ControlHttpClient.from_server_address(
            self.address, insecure=bool(self.connection.get("insecure")),
            root_certificates=Path(str(ca)).read_bytes() if ca else None,
            interceptors=())
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
    config_file = link.home / "run-config.toml"
    config_file.write_text("".join(f"{k} = {toml_string(v)}\n" for k, v in run_config.items()))
    cmd = ["flwr", "run", str(app_dir), CONNECTION, "--stream", "--run-config", str(config_file)]
    if not deployment:
        cmd += ["--federation-config",
                f"num-supernodes={num_supernodes} client-resources-num-cpus={cpus_per_client:g}"
                f" client-resources-num-gpus={gpus_per_client:g}"
                + (f" init-args-num-cpus={total_cpus}" if total_cpus else "")]
    run_id = None
    tail: list[str] = []
    error = ""  # the last exception line in the log: why a failed run failed
    colour = sys.stdout.isatty()  # no escape codes in redirected logs
    proc = start_watched(cmd, env=link.env(), stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, bufsize=1)
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            plain = ANSI.sub("", line)
            if run_id is None and "Successfully started run" in plain:
                run_id = plain.strip().split()[-1]
            if ERROR_LINE.match(plain.strip()) and plain.strip() != FLOWER_WRAPPER:
                error = plain.strip()
            tail = [*tail[-20:], line]
            if show(plain):
                sys.stdout.write(prefix + (line if colour else plain))
                sys.stdout.flush()
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
        unwatch(proc.pid)
    if run_id is None:
        sys.stderr.write("".join(tail))
        return None, f"not started (flwr run exited {proc.returncode})"
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
