#!/usr/bin/env bash
# Build (here, with a package registry) the Python packages an offline GPU machine lacks to run
# `fedapps run|reproduce` with Ray: Flower, Ray (its Java jars, dashboard UI and libraries the
# simulation never imports removed, binaries stripped: 74 MB wheel -> 28 MB .tar.xz), OmegaConf,
# flwr-datasets and their pure-Python needs, pinned to the versions installed here, for the
# target's Python (default 3.12). The target already has torch, numpy, grpcio, protobuf, ...
#
#   bash deploy/offline-site.sh OUT_DIR [PYTHON_VERSION]     # writes OUT_DIR/site.tar.xz
#   # on the target, in the repository root, with OUT_DIR copied beside it:
#   source deploy/offline-site.sh --activate OUT_DIR/site.tar.xz
#
# The tarball is 28 MB (xz -9e; 35 MB at xz's default level): with FMNIST beside it, packed as xz
# (26 MB, deploy/lent-machine.sh pack), it fits a transfer limit of 64 MiB in one call.
# Measured with it (2026-11-23, one H100, 16 cores): docs/RESULTS.md, "on one H100".
set -euo pipefail
if [ "${1:-}" = "--activate" ]; then
  site=/tmp/fedapps-site
  if [ ! -d "$site/flwr" ]; then
    mkdir -p "$site/bin" && tar -xJf "$2" -C "$site"
    python3 - "$site" <<'PY'
import configparser, glob, os, sys
site = sys.argv[1]
for ep in glob.glob(f"{site}/*.dist-info/entry_points.txt"):  # console scripts: flwr, flower-*
    cp = configparser.ConfigParser(); cp.read(ep)
    for name, target in (cp["console_scripts"].items() if "console_scripts" in cp else []):
        mod, func = (t.strip() for t in target.split(":"))
        with open(f"{site}/bin/{name}", "w") as f:
            f.write(f"#!/usr/bin/env python3\nimport sys\nfrom {mod} import {func}\n"
                    f"sys.exit({func}())\n")
        os.chmod(f"{site}/bin/{name}", 0o755)
PY
  fi
  export PYTHONPATH="$site:$PWD" PATH="$site/bin:$PATH"
  export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1 FLWR_DISABLE_UPDATE_CHECK=1
  export FLWR_TELEMETRY_ENABLED=0 WANDB_MODE=disabled
  set +euo pipefail
  return 0 2>/dev/null || exit 0
fi
out=$(realpath "${1:?usage: offline-site.sh OUT_DIR [PYTHON_VERSION]}"); py=${2:-3.12}
pins=()
for name in flwr ray omegaconf antlr4-python3-runtime flwr-datasets datasets dill multiprocess \
    alembic cryptography fastapi grpcio-health-checking iterators prompt_toolkit pycryptodome \
    SQLAlchemy starlette tomli tomli_w uvicorn jsonschema jsonschema-specifications referencing \
    rpds-py Mako wcwidth pydantic pydantic_core typing-inspection annotated-types cffi pycparser \
    greenlet; do
  pins+=("$name==$(python3 -m pip show "$name" | awk '/^Version:/{print $2}')")
done
build=$(mktemp -d)
python3 -m pip install -q --no-deps --only-binary=:all: --python-version "$py" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform any --target "$build" "${pins[@]}"
cd "$build"
rm -rf bin ray/jars ray/dashboard/client ray/rllib ray/serve ray/data ray/tune ray/train ray/llm
strip --strip-unneeded ray/_raylet.so ray/core/src/ray/raylet/raylet ray/core/src/ray/gcs/gcs_server
find . -name __pycache__ -prune -exec rm -rf {} +
mkdir -p "$out" && tar -cf - . | xz -T0 -9e > "$out/site.tar.xz"
rm -rf "$build"
ls -la "$out/site.tar.xz"
