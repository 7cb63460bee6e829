"""The parallelism key through torchrun on CPU (gloo, 2 processes): each mode's losses and weights match one process at
the same global batch; every mode writes nanoGPT's ckpt.pt with full tensors, which resumes under another mode and
another world size with the uninterrupted run's losses."""
import os
import shutil
import subprocess
import sys

import pytest
import torch

from helpers import ROOT, TINY_ARGS, logged_losses, run_script, write_char_dataset

MODES = ('ddp', 'zero1', 'fsdp')
# one micro-batch per process per iteration at world size 2, two in one process: the same global batch
ARGS = [*TINY_ARGS, '--gradient_accumulation_steps=2', '--eval_interval=2']


def torchrun(*args, processes=2):
    return subprocess.run([sys.executable, '-m', 'torch.distributed.run', '--standalone',
                           f'--nproc_per_node={processes}', 'train.py', *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env={**os.environ, 'OMP_NUM_THREADS': '1'})


def load(out_dir):
    return torch.load(out_dir / 'ckpt.pt', weights_only=True)


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
    """{'single': 6 iterations in one process, mode: 4 iterations on 2 processes under that mode}: (stdout, out dir)
    each, checkpointed every 2 iterations, and the data dir."""
    root = tmp_path_factory.mktemp('parallel')
    data_dir = write_char_dataset(root / 'data').parent
    results = {'single': run_script('train.py', *ARGS, f'--data_dir={data_dir}', f'--out_dir={root / "single"}',
                                    '--max_iters=6')}
    for mode in MODES:
        results[mode] = torchrun(*ARGS, f'--data_dir={data_dir}', f'--out_dir={root / mode}', '--max_iters=4',
                                 f'--parallelism={mode}')
    for name, result in results.items():
        assert result.returncode == 0, f'{name}: {result.stderr[-3000:]}'
    return {name: (result.stdout, root / name) for name, result in results.items()}, data_dir


def assert_same_losses(stdout, reference, kind, iterations):
    losses, expected = logged_losses(stdout, kind), logged_losses(reference, kind)
    assert sorted(losses) == list(iterations)
    assert [losses[i] for i in iterations] == pytest.approx([expected[i] for i in iterations], abs=1e-4)


@pytest.mark.parametrize('mode', MODES)
def test_two_processes_match_one(runs, mode):
    (single, _), (stdout, out_dir) = runs[0]['single'], runs[0][mode]
    assert_same_losses(stdout, single, 'iter', range(5))  # the master logs, once per iteration
    assert_same_losses(stdout, single, 'step', (0, 2, 4))


@pytest.mark.parametrize('mode', MODES)
def test_checkpoint_is_nanogpt_layout_with_full_tensors(runs, mode):
    """The same keys, shapes and plain AdamW state indexing as one process's, saved at the same iteration."""
    _, single_dir = runs[0]['single']
    reference = torch.load(single_dir / 'ckpt.pt', weights_only=True)  # iteration 6: layout only
    checkpoint = load(runs[0][mode][1])
    assert checkpoint['iter_num'] == 4 and len(checkpoint['rng_states']) == 2
    assert {k: v.shape for k, v in checkpoint['model'].items()} == {k: v.shape for k, v in reference['model'].items()}
    state, expected = checkpoint['optimizer']['state'], reference['optimizer']['state']
    assert sorted(state) == sorted(expected)
    assert all({k: v.shape for k, v in state[i].items()} == {k: v.shape for k, v in expected[i].items()}
               for i in state)
    assert [len(g['params']) for g in checkpoint['optimizer']['param_groups']] == \
        [len(g['params']) for g in reference['optimizer']['param_groups']]


@pytest.mark.parametrize('saved, resumed, processes', [('fsdp', 'ddp', 1), ('zero1', 'fsdp', 2), ('ddp', 'zero1', 2)])
def test_resume_under_another_mode_and_world_size(runs, tmp_path, saved, resumed, processes):
    (single, _), (_, saved_dir), data_dir = runs[0]['single'], runs[0][saved], runs[1]
    out_dir = tmp_path / 'out'
    shutil.copytree(saved_dir, out_dir)
    args = [*ARGS, f'--data_dir={data_dir}', f'--out_dir={out_dir}', '--init_from=resume', '--max_iters=6',
            f'--parallelism={resumed}']
    result = run_script('train.py', *args) if processes == 1 else torchrun(*args, processes=processes)
    assert result.returncode == 0, result.stderr[-3000:]
    assert_same_losses(result.stdout, single, 'iter', range(4, 7))
    assert_same_losses(result.stdout, single, 'step', (4, 6))
    # the master's note when the saved RNG states are of another world size (every saved run here had 2 processes)
    assert result.stdout.count('note: ') == (processes != 2)


def test_fsdp_mixed_precision_trains_like_one_process_in_bf16(runs, tmp_path):
    """Weights gathered in bf16 put the residual stream in bf16 too, where one process keeps it fp32: close, not
    equal. The shards, and so the checkpoint, stay fp32."""
    args = [*ARGS, f'--data_dir={runs[1]}', '--max_iters=4', '--dtype=bfloat16']
    single = run_script('train.py', *args, f'--out_dir={tmp_path / "single"}')
    mixed = torchrun(*args, f'--out_dir={tmp_path / "fsdp"}', '--parallelism=fsdp', '--fsdp_mixed_precision=True')
    assert single.returncode == 0 and mixed.returncode == 0, mixed.stderr[-3000:]
    losses, expected = logged_losses(mixed.stdout), logged_losses(single.stdout)
    assert sorted(losses) == list(range(5)) and losses[4] < losses[0]
    assert [losses[i] for i in range(5)] == pytest.approx([expected[i] for i in range(5)], abs=0.05)
    assert {v.dtype for v in load(tmp_path / 'fsdp')['model'].values()} == {torch.float32}


def test_fsdp_mixed_precision_outside_fsdp_is_refused(runs, tmp_path):
    result = run_script('train.py', *ARGS, f'--data_dir={runs[1]}', f'--out_dir={tmp_path / "out"}',
                        '--fsdp_mixed_precision=True')
    assert result.returncode == 2 and not (tmp_path / 'out').exists()
    assert result.stderr.strip().splitlines() == [
        "error: fsdp_mixed_precision=True applies to parallelism='fsdp', not 'ddp': use --parallelism=fsdp or "
        "--fsdp_mixed_precision=False"]
