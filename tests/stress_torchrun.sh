#!/usr/bin/env bash
# N consecutive 2-process CPU runs of train.py under torchrun in one parallelism mode; prints each exit status and
# fails unless all are 0. A stress check for process teardown, not a test: bash tests/stress_torchrun.sh zero1 50
set -uo pipefail
mode=${1:?usage: bash tests/stress_torchrun.sh ddp|zero1|fsdp RUNS}
runs=${2:-50}
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python -c "import sys; sys.path.insert(0, '$root/tests'); import helpers; helpers.write_char_dataset('$work/data')"
failed=0
for run in $(seq 1 "$runs"); do
    OMP_NUM_THREADS=1 python -m torch.distributed.run --standalone --nproc_per_node=2 "$root/train.py" \
        --device=cpu --dtype=float32 --compile=False --data_dir="$work/data" --dataset=tiny_char \
        --out_dir="$work/out" --n_layer=2 --n_head=2 --n_embd=32 --block_size=16 --batch_size=4 \
        --gradient_accumulation_steps=2 --max_iters=4 --eval_interval=2 --eval_iters=2 --parallelism="$mode" \
        > "$work/log" 2>&1
    status=$?
    echo "run $run: exit $status"
    if [ "$status" -ne 0 ]; then
        failed=$((failed + 1))
        tail -n 5 "$work/log"
    fi
done
echo "$mode: $failed of $runs runs failed"
[ "$failed" -eq 0 ]
