#!/usr/bin/env bash
# CI, second part: the cluster path on a real one-node Slurm cluster with accounting.
# Installs and starts Slurm (.ci/slurm/cluster.sh), runs config/ci-slurm.yaml (3 algorithms x 1 seed
# on digits, 2 ranks per job) with `snakemake --profile slurm` in a scratch copy of the repository,
# checks that every run went through sbatch and srun (sacct: a step with NTasks = ranks) and is in
# the report (.ci/slurm/check_sweep.py), and stops every daemon, also on failure or timeout.
# Needs root (daemons, /etc/slurm) and .venv from envs/install.sh.
# The first controller is killed with SIGKILL once a run has started, and the same command run again:
# the sweep must end with every run trained once.
#   .ci/slurm_sweep.sh
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
CLUSTER="$ROOT/.ci/slurm/cluster.sh"
SWEEP_LIMIT_S=${SWEEP_LIMIT_S:-300}  # the snakemake sweep alone; .ci/run bounds the whole script
[ "$(id -u)" -eq 0 ] || { echo "error: the Slurm sweep starts daemons and needs root (CI runs as root)" >&2; exit 1; }
[ -x "$ROOT/.venv/bin/snakemake" ] || { echo "error: no .venv/bin/snakemake; run ./envs/install.sh first" >&2; exit 1; }

WORK="$(mktemp -d /tmp/dpb-slurm-sweep.XXXXXX)"
sweep_pid=""
stop_sweep() {  # TERM the snakemake sweep (if running), give it 10 s to cancel its jobs, then KILL
  [ -n "$sweep_pid" ] && kill -0 "$sweep_pid" 2>/dev/null || return 0
  kill -TERM "$sweep_pid" 2>/dev/null || true
  for _ in $(seq 20); do kill -0 "$sweep_pid" 2>/dev/null || return 0; sleep 0.5; done
  pkill -KILL -P "$sweep_pid" 2>/dev/null || true  # the snakemake under this script's timeout
  kill -KILL "$sweep_pid" 2>/dev/null || true
}
cleanup() {
  local code=$?
  trap - EXIT INT TERM
  stop_sweep
  if command -v scancel >/dev/null 2>&1 && [ -s /run/slurmctld.pid ]; then
    scancel --user=root 2>/dev/null || true  # jobs of an interrupted sweep
  fi
  cd "$ROOT"
  rm -rf "$WORK"
  bash "$CLUSTER" stop || true
  exit "$code"
}
trap cleanup EXIT
# When timeout or Ctrl-C ends the sweep: exit at once (the sweep runs in the background and the
# script waits with `wait`, which a signal interrupts), and the EXIT trap cleans up.
trap 'exit 143' INT TERM

t0=$(date +%s)
bash "$CLUSTER" install
bash "$CLUSTER" start
since=$(date +%Y-%m-%dT%H:%M:%S)

# A scratch copy: the sweep's results/ and .snakemake/ stay out of the checkout.
tar -C "$ROOT" --exclude=./.venv --exclude=./results --exclude=./.snakemake --exclude=./.git \
    --exclude='*/__pycache__' -cf - . | tar -C "$WORK" -xf -
cd "$WORK"
export PATH="$ROOT/.venv/bin:$PATH"  # jobs inherit it (sbatch --export=ALL)
t1=$(date +%s)
# As a user types it, plus quick status polling for a cluster that answers at once.
sweep() {
  timeout "$SWEEP_LIMIT_S" snakemake --profile slurm --configfile config/ci-slurm.yaml \
      --slurm-init-seconds-before-status-checks 5 --seconds-between-status-checks 5 > "$1" 2>&1 &
  sweep_pid=$!
}
# First the controller is killed outright while a run's job is under way (a login session that ends,
# an out-of-memory kill): its Slurm jobs go on without it. Then the same command again must finish
# the matrix without training any run twice (check_sweep.py reads each run's log).
sweep sweep-killed.log
for _ in $(seq 600); do  # up to 5 min for a run to start
  compgen -G "results/runs/*/*/log.txt" > /dev/null && break
  kill -0 "$sweep_pid" 2>/dev/null || break
  sleep 0.5
done
controller=$(pgrep -P "$sweep_pid" -f snakemake || true)
[ -n "$controller" ] || { tail -n 40 sweep-killed.log; echo "error: no run started under the first controller" >&2; exit 1; }
kill -KILL $controller
wait "$sweep_pid" 2>/dev/null || true
echo "slurm sweep: the controller killed while $(squeue -h | wc -l) job(s) were queued or running; the same command again"
sweep sweep.log
wait "$sweep_pid" \
  || { code=$?; tail -n 60 sweep.log; tail -n 20 .snakemake/slurm_logs/*/*/*.log results/logs/*/*.log 2>/dev/null || true
       echo "error: the Slurm sweep failed (exit $code)" >&2; exit 1; }
sweep_pid=""
t2=$(date +%s)
"$ROOT/.venv/bin/python" "$ROOT/.ci/slurm/check_sweep.py" --workdir "$WORK" \
    --configfile config/ci-slurm.yaml --since "$since"
echo "slurm sweep: $((t2 - t1)) s through sbatch (snakemake), $(( $(date +%s) - t0 )) s in all with install and start"
