#!/usr/bin/env bash
# Issue 18's measurement on a borrowed many-core machine that has no package registry
# (docs/PERFORMANCE.md, "On a 16-core machine"): the simulated round against the one-process,
# held-pull, quick-pull and warm deployed rounds of the FMNIST preset (20 SuperNodes, 5 training
# and 5 evaluating a round, one thread per client), in that order (the last one measured there
# before), in one call whose parts each run under their own time limit, so a part that stalls
# cannot take the others' time and what finished is kept.
#
#   bash deploy/lent-machine.sh pack DIR   # here: DIR/site.tar.xz (deploy/offline-site.sh, 28 MB)
#                                          # and DIR/fmnist/*.xz (Fashion-MNIST, 26 MB)
#   bash deploy/lent-machine.sh run DIR    # there, in the repository root, with DIR copied into it
#
# `run` writes to $OUT (default /tmp/lent-out) at most 8 files: sim.log, sim.json, deploy.log,
# deploy.json (simulations.deploy_benchmark's reports), message_timing.png, top.log (top every
# 30 s: what a slow part was doing) and raylogs.txt (the tails of Ray's logs after the simulation).
# Environment: ROUNDS (3), SIM_S (200) and DEP_S (290), the seconds the simulation and the three
# deployments may take (each deployment's report is written as it ends); LOCAL=1 uses this
# machine's packages and $FEDAPPS_DATA_ROOT instead of DIR (a dry run of `run` here: ROUNDS=1
# takes about 5 minutes on 2 cores).
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
case "${1:-}" in
pack)
  set -e
  dir=$(realpath "${2:?usage: lent-machine.sh pack DIR}")
  raw=${FEDAPPS_DATA_ROOT:-$here/../shared/data}/FashionMNIST/raw
  ls "$raw"/train-images-idx3-ubyte.gz > /dev/null 2>&1 || {
    echo "lent-machine.sh: no Fashion-MNIST .gz files in $raw (set FEDAPPS_DATA_ROOT)" >&2; exit 2; }
  bash "$here/deploy/offline-site.sh" "$dir"
  mkdir -p "$dir/fmnist"
  for f in "$raw"/*-ubyte.gz; do
    gunzip -c "$f" | xz -9e -T0 > "$dir/fmnist/$(basename "$f" .gz).xz"
  done
  du -sh "$dir"
  ;;
run)
  dir=${2:?usage: lent-machine.sh run DIR}
  if [ -z "${LOCAL:-}" ] && ! { [ -f "$dir/site.tar.xz" ] && ls "$dir"/fmnist/*.xz > /dev/null 2>&1; }
  then
    echo "lent-machine.sh: $dir lacks site.tar.xz or fmnist/*.xz (make them with: pack DIR)" >&2
    exit 2
  fi
  cd "$here"
  t0=$SECONDS
  OUT=${OUT:-/tmp/lent-out}; mkdir -p "$OUT"
  ROUNDS=${ROUNDS:-3}; SIM_S=${SIM_S:-200}; DEP_S=${DEP_S:-290}
  if [ -z "${LOCAL:-}" ]; then
    # shellcheck disable=SC1091
    source deploy/offline-site.sh --activate "$dir/site.tar.xz"
    mkdir -p /tmp/lent-data/FashionMNIST/raw
    for f in "$dir"/fmnist/*.xz; do
      xz -dc "$f" > "/tmp/lent-data/FashionMNIST/raw/$(basename "$f" .xz)"
    done
    export FEDAPPS_DATA_ROOT=/tmp/lent-data FEDAPPS_CACHE=/tmp/lent-cache
  fi
  export PYTHONUNBUFFERED=1
  echo "set up in $((SECONDS - t0)) s; $(nproc) cores; $(lscpu | grep 'Model name' | tr -s ' ')"
  free -g | head -2; df -h /dev/shm | tail -1
  python3 -c "import flwr, ray, torch; print('flwr', flwr.__version__, 'ray', ray.__version__,
                                              'torch', torch.__version__)"
  leftovers() {  # a part stopped by its limit leaves its SuperLink, SuperNodes or Ray behind
    [ -n "${LOCAL:-}" ] && return  # here other runs' Flower and Ray processes may be running
    pkill -9 -f "flower-superlink|flower-supernode|flwr-clientapp|flwr-serverapp|raylet|gcs_server|ray::|warm_clientapp|one_process_node|quick_super|default_worker.py" 2>/dev/null
    sleep 2
  }
  (while true; do
     { echo "== $((SECONDS - t0)) s"; top -b -n1 -w 200 | head -25; } >> "$OUT/top.log"
     sleep 30
   done) &
  top_pid=$!
  sets=(--set "rounds=$ROUNDS" --set eval.fraction=0.25 --set device=cpu)
  timeout -k 5 "$SIM_S" python3 -m simulations.deploy_benchmark --out /tmp/lent-sim \
    --modes simulation --progress "${sets[@]}" > "$OUT/sim.log" 2>&1
  echo "simulation: exit $? at $((SECONDS - t0)) s"
  cp /tmp/lent-sim/deploy_benchmark.json "$OUT/sim.json" 2>/dev/null
  for f in /tmp/ray/session_latest/logs/*.err /tmp/ray/session_latest/logs/raylet.out; do
    [ -s "$f" ] && { echo "=== $f"; tail -15 "$f"; }
  done > "$OUT/raylogs.txt" 2>/dev/null
  leftovers
  timeout -k 5 "$DEP_S" python3 -m simulations.deploy_benchmark --out /tmp/lent-deploy \
    --modes deploy_one,deploy_held,deploy_quick,deploy_warm --progress "${sets[@]}" > "$OUT/deploy.log" 2>&1
  echo "deployments: exit $? at $((SECONDS - t0)) s"
  cp /tmp/lent-deploy/deploy_benchmark.json "$OUT/deploy.json" 2>/dev/null
  cp /tmp/lent-deploy/message_timing.png "$OUT/" 2>/dev/null
  kill "$top_pid"; leftovers
  grep -h "\[deploy_benchmark\]" "$OUT/sim.log" "$OUT/deploy.log"
  echo "total $((SECONDS - t0)) s"
  ;;
*)
  echo "usage: lent-machine.sh pack DIR | run DIR" >&2; exit 2
  ;;
esac
