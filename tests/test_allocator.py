"""glibc's thresholds set once per process: evaluation's batches stop page-faulting."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

import fedapps.allocator as allocator

glibc = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc only")


def huge_pages_always() -> bool:
    """Transparent huge pages for every mapping fault memory in 2 MB at a time, so the
    returning run's page faults say little (this machine and CI: `madvise`)."""
    try:
        return "[always]" in open("/sys/kernel/mm/transparent_hugepage/enabled").read()
    except OSError:
        return False


# A fresh process evaluates the FMNIST preset's ConvNet three times over 1,024 examples (the
# evaluation loop and batch size the clients use) and counts the minor page faults of the
# last two: the first evaluation maps the memory in, the later ones should reuse it. glibc's
# defaults adapt to what a process allocated before, so a fresh process starts in either
# state (most faulted, some not); mode "returning" starts it in the faulting one for sure
# (every block of 64 kB or more mapped on its own, the heap trimmed at every free), "keep"
# then calls keep_freed_memory, which must take it out of it.
EVALUATIONS = """
import ctypes, json, resource, sys
import torch
from fedapps.allocator import M_MMAP_THRESHOLD, M_TRIM_THRESHOLD, keep_freed_memory
from fedapps.evaluation import evaluate_sums
from fedapps.models import convnet
from fedapps.tasks import get_task
mode = sys.argv[1]
if mode in ("returning", "keep"):
    mallopt = ctypes.CDLL(None).mallopt
    assert mallopt(M_MMAP_THRESHOLD, 65536) and mallopt(M_TRIM_THRESHOLD, 0)
applied = keep_freed_memory() if mode in ("keep", "applied") else None
if mode == "applied":
    print(json.dumps({"applied": applied}))
    sys.exit(0)
torch.set_num_threads(1)
torch.manual_seed(0)
model = convnet((1, 28, 28), 10, 1).eval()
x, y = torch.randn(1024, 1, 28, 28), torch.randint(0, 10, (1024,))
task = get_task("classification")
evaluate_sums(lambda xb: (model(xb),) * 2, x, y, task)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(2):
    evaluate_sums(lambda xb: (model(xb),) * 2, x, y, task)
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print(json.dumps({"applied": applied, "faults": faults}))
"""


def evaluations(mode: str, **env: str) -> dict:
    """EVALUATIONS in a fresh process (mode returning, keep, or applied: only whether
    keep_freed_memory set the thresholds), under this process's environment less any malloc
    settings, plus `env`."""
    clean = {k: v for k, v in os.environ.items()
             if k not in (*allocator.USER_SETTINGS, "GLIBC_TUNABLES")}
    done = subprocess.run([sys.executable, "-c", EVALUATIONS, mode], capture_output=True,
                          text=True, check=True, env={**clean, **env}, timeout=300)
    return json.loads(done.stdout.strip().splitlines()[-1])


@glibc
@pytest.mark.skipif(huge_pages_always(), reason="transparent huge pages: always")
def test_evaluations_after_the_first_reuse_their_memory():
    """A process that returns each batch's activations to the OS maps them in again at the
    next batch (over a hundred thousand faults here); keep_freed_memory takes the same process
    to reusing them (both measured: their gap is what the test is about)."""
    returning, kept = evaluations("returning"), evaluations("keep")
    assert kept["applied"] is True
    assert kept["faults"] < 1_000, kept
    assert returning["faults"] > 100 * max(kept["faults"], 100), (returning, kept)


@glibc
@pytest.mark.parametrize("env", [
    *({name: "1000000"} for name in allocator.USER_SETTINGS),
    {"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=65536"},
    {"GLIBC_TUNABLES": "glibc.cpu.x86_shstk=permissive:glibc.malloc.top_pad=0"}])
def test_the_users_own_malloc_settings_are_left_alone(env):
    assert evaluations("applied", **env)["applied"] is False


@glibc
@pytest.mark.parametrize("tunables", ["glibc.cpu.x86_shstk=permissive",
                                      "glibc.malloc.arena_max=2"])
def test_other_glibc_tunables_do_not_stop_it(tunables):
    assert evaluations("applied", GLIBC_TUNABLES=tunables)["applied"] is True


def test_set_once_per_process(monkeypatch):
    calls = []
    monkeypatch.setattr(allocator, "_applied", None)
    monkeypatch.setattr(allocator, "_set_thresholds", lambda: calls.append(1) or True)
    assert allocator.keep_freed_memory() and allocator.keep_freed_memory()
    assert calls == [1]


def test_not_glibc_is_a_no_op(monkeypatch):
    monkeypatch.setattr(allocator.platform, "libc_ver", lambda: ("", ""))
    assert allocator._set_thresholds() is False


def test_the_client_and_the_server_set_it(tmp_path, monkeypatch):
    """Every process that trains or evaluates: a ClientApp (warm, cold or a Ray worker) in
    client_fn, the ServerApp (central evaluation) in server_fn."""
    from flwr.common import Context, RecordDict

    import fedapps.client_app
    import fedapps.server_app

    calls = []
    for module in (fedapps.client_app, fedapps.server_app):
        monkeypatch.setattr(module, "keep_freed_memory", lambda m=module: calls.append(m))
    context = Context(run_id=1, node_id=1, state=RecordDict(),
                      node_config={"partition-id": 0, "num-partitions": 10},
                      run_config={"experiment": "quickstart", "output-dir": str(tmp_path),
                                  "run-name": "r"})
    fedapps.client_app.client_fn(context)
    fedapps.server_app.server_fn(context)
    assert calls == [fedapps.client_app, fedapps.server_app]
