#!/usr/bin/env bash
# python_launches.sh [--build DIR] [--python PY] [--rounds N] [--limit N] [--epochs N]: torch_lm's transformer on
# grouped batches, two processes, launched four ways in alternation: DDP under torchrun, stealbatch under torchrun,
# stealbatch under mpirun (one device a process each), and stealbatch in one process (cpu:2). Prints each run's
# result line and, per way, the median tokens/s over the rounds.
set -euo pipefail
build=build python=${TORCH_PYTHON:-python3} rounds=3 limit=512 epochs=2
while [ $# -gt 0 ]; do
  case $1 in
    --build) build=$2; shift 2 ;;
    --python) python=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --limit) limit=$2; shift 2 ;;
    --epochs) epochs=$2; shift 2 ;;
    *) echo "python_launches.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
here=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "$build" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$build/examples/torch_lm" --limit "$limit" --epochs "$epochs" --order grouped --export "$work/run.json" > /dev/null
export PYTHONPATH="$build/python${PYTHONPATH:+:$PYTHONPATH}"
ex=$here/examples/python
# Debian torch 1.13's torchrun cannot parse its default --redirects on Python 3.11; 1/1 works on every torch.
torchrun=("$python" -m torch.distributed.run --standalone --nproc_per_node 2 --redirects 1 --tee 1)
result() { grep -o 'result: [0-9]* tokens/s.*' | head -1; }
declare -A runs
for ((round = 1; round <= rounds; round++)); do
  for way in ddp-torchrun stealbatch-torchrun stealbatch-mpirun stealbatch-one-process; do
    case $way in
      ddp-torchrun) line=$("${torchrun[@]}" "$ex/train_ddp.py" --work "$work/run.json" 2>&1 | result) ;;
      stealbatch-torchrun) line=$("${torchrun[@]}" "$ex/train_stealbatch.py" --work "$work/run.json" --devices cpu:1 2>&1 | result) ;;
      stealbatch-mpirun) line=$(mpirun --allow-run-as-root -np 2 -x PYTHONPATH "$python" "$ex/train_stealbatch.py" --work "$work/run.json" --devices cpu:1 2>&1 | result) ;;
      stealbatch-one-process) line=$("$python" "$ex/train_stealbatch.py" --work "$work/run.json" --devices cpu:2 2>&1 | result) ;;
    esac
    echo "round $round $way: $line"
    runs[$way]+="$(echo "$line" | awk '{print $2}') "
  done
done
for way in ddp-torchrun stealbatch-torchrun stealbatch-mpirun stealbatch-one-process; do
  echo "$way: median $(echo ${runs[$way]} | tr ' ' '\n' | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}') tokens/s"
done
