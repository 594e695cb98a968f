"""What a ClientApp process imports: the client path stays free of the heavy libraries that
only some loaders, the server or the tooling need (each one is tens of MB resident on an edge
device, docs/PERFORMANCE.md "A lean node")."""

import json
import subprocess
import sys

HEAVY = ("pandas", "pyarrow", "PIL", "torchvision", "sklearn", "matplotlib", "wandb", "ray",
         "datasets", "flwr_datasets", "h5py", "ultralytics", "scipy")


def test_the_client_app_imports_none_of_the_heavy_libraries():
    code = ("import json, sys; import fedapps.client_app, fedapps.warm_clientapp; "
            f"print(json.dumps(sorted(m for m in {list(HEAVY)!r} if m in sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_the_startup_probe_builds_and_fits_a_client_in_a_fresh_interpreter():
    from fedapps.data import federated_data
    from fedapps.validation import resolve_config
    from simulations.deploy_benchmark import startup_probe

    report = startup_probe("quickstart", ["rounds=1"])
    # the fit ran on partition 0's whole train split, in the probe's own interpreter
    train = federated_data(resolve_config("quickstart", ["rounds=1"])).client(0).y_train
    assert report["fit_examples"] == len(train) > 0
    assert report["torch_rss_mb"] > 50 and report["fit_peak_rss_mb"] >= report["peak_rss_mb"]
    # torch.optim's SGD imports the torch.compile front end (about 70 MB) on its first use;
    # the client's EagerSGD (clients/optim.py) trains without it
    assert report["torch_dynamo_imported"] is False
    # a warm ClientApp's Flower runtime, measured on top (docs/PERFORMANCE.md, "A lean node")
    # (the probe imported it: gRPC comes with Flower's Runtime API client, FastAPI with its
    # error catalogue; the figure is VmRSS after minus before, whole MB)
    assert isinstance(report["warm_runtime_rss_mb"], int) and report["warm_runtime_rss_mb"] >= 0
    assert {"grpc", "fastapi"} <= set(report["warm_runtime_brings"])
