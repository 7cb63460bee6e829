"""The parallelism key through torchrun on CPU (gloo, 2 processes): each mode's losses and weights match one process at
the same global batch; every mode writes nanoGPT's ckpt.pt with full tensors, which resumes under another mode and
another world size with the uninterrupted run's losses; a rank that stops answering, or a killed torchrun, ends the
run with one line instead of a hang.
Muon under ddp and zero1 too, and refused under fsdp."""
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

from helpers import (MODERN_ARCH_ARGS, PARALLEL_ARGS as ARGS, ROOT, TINY_ARGS, assert_same_losses, load,
                     logged_losses, one_thread_env, run_script, torchrun, write_char_dataset)


MODES = ('ddp', 'zero1', 'fsdp')


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


@pytest.mark.parametrize('mode', MODES)
def test_two_processes_match_one(runs, mode):
    (single, _), (stdout, _) = runs[0]['single'], runs[0][mode]
    assert_same_losses(stdout, single, 'iter', range(5))  # the master logs, once per iteration
    assert_same_losses(stdout, single, 'step', (0, 2, 4))
    # the config and the model summary once, not once a rank
    assert stdout.count('Overriding: max_iters = 4') == 1 and stdout.count('num decayed parameter tensors') == 1


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


def modern_recipe(mode):
    """The modern options, with the record's Muon where the mode allows it (fsdp splits the matrices Muon needs)."""
    return [*MODERN_ARCH_ARGS, '--lr_schedule=wsd', *(['--optim=muon', '--muon_momentum_warmup_iters=2',
                                                       '--muon_split_qkv=True', '--muon_momentum_form=sum',
                                                       '--scalar_learning_rate=0.02'] if mode != 'fsdp' else [])]


@pytest.fixture(scope='module')
def modern_single(runs):
    """One process's 6 iterations of modern_recipe, with Muon (ddp's and zero1's) and without (fsdp's): {mode: stdout},
    each run once for the modes that share it."""
    results = {}
    for mode in ('zero1', 'fsdp'):
        result = run_script('train.py', *ARGS, *modern_recipe(mode), f'--data_dir={runs[1]}', '--max_iters=6',
                            f'--out_dir={runs[1].parent / f"modern-single-{mode}"}')
        assert result.returncode == 0, result.stderr[-3000:]
        results[mode] = result.stdout
    return {'ddp': results['zero1'], **results}


@pytest.mark.parametrize('mode', MODES)
def test_modern_architecture_on_two_processes_matches_one(runs, modern_single, tmp_path, mode):
    """modern_recipe on two processes against one; zero1's checkpoint, gathered from both ranks' shares of Muon's
    state, resumes in one process with the uninterrupted run's losses."""
    args = [*ARGS, *modern_recipe(mode), f'--data_dir={runs[1]}', f'--out_dir={tmp_path / mode}']
    double = torchrun(*args, '--max_iters=4', f'--parallelism={mode}')
    assert double.returncode == 0, double.stderr[-3000:]
    assert_same_losses(double.stdout, modern_single[mode], 'iter', range(5))
    assert_same_losses(double.stdout, modern_single[mode], 'step', (0, 2, 4))
    assert load(tmp_path / mode)['model_args']['pos_emb'] == 'rope'
    if mode == 'zero1':
        resumed = run_script('train.py', *args, '--max_iters=6', '--init_from=resume')
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        assert_same_losses(resumed.stdout, modern_single[mode], 'iter', range(4, 7))


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


def wait_for(condition, seconds, what):
    deadline = time.time() + seconds
    while not condition():
        assert time.time() < deadline, f'waited {seconds}s for {what}'
        time.sleep(0.1)


def workers(launcher):
    """{rank: pid} of the processes torchrun started (its children, with RANK in their environment)."""
    children = open(f'/proc/{launcher.pid}/task/{launcher.pid}/children').read().split()
    ranks = {}
    for pid in map(int, children):
        environ = dict(item.split('=', 1) for item in open(f'/proc/{pid}/environ').read().split('\0') if '=' in item)
        ranks[int(environ['RANK'])] = pid
    return ranks


def alive(pid):
    try:
        with open(f'/proc/{pid}/status') as f:
            return 'zombie' not in f.read()
    except FileNotFoundError:
        return False


def start_long_run(tmp_path, data_dir, *args):
    """torchrun with 2 processes training for a long time, output to files; returns once iter 3 is logged, with
    (launcher, stdout path, stderr path, {rank: pid})."""
    out, err = tmp_path / 'stdout.txt', tmp_path / 'stderr.txt'
    launcher = subprocess.Popen([sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2',
                                 'train.py', *ARGS, f'--data_dir={data_dir}', f'--out_dir={tmp_path / "out"}',
                                 '--max_iters=1000000', '--eval_interval=1000000', *args], cwd=ROOT,
                                stdout=open(out, 'w'), stderr=open(err, 'w'),
                                env=one_thread_env())
    wait_for(lambda: 'iter 3:' in out.read_text() or launcher.poll() is not None, 120, 'training to start')
    assert launcher.poll() is None, err.read_text()[-3000:]
    return launcher, out, err, workers(launcher)


needs_proc = pytest.mark.skipif(not os.path.isdir('/proc/self'), reason='finds the workers through Linux /proc')


def test_an_error_of_every_rank_is_printed_once(tmp_path, data_dir):
    result = torchrun(*ARGS, f'--data_dir={data_dir}', f'--out_dir={tmp_path / "out"}', '--learning_rat=1')
    assert result.returncode != 0 and not (tmp_path / 'out').exists()
    errors = [line for line in result.stderr.splitlines() if line.startswith('error: ')]
    assert len(errors) == 1 and errors[0].startswith('error: unknown config key --learning_rat: did you mean')


@needs_proc
def test_a_stopped_rank_ends_the_run_with_one_line_not_a_hang(tmp_path, data_dir):
    launcher, _, err, ranks = start_long_run(tmp_path, data_dir, '--timeout=5')
    os.kill(ranks[1], signal.SIGSTOP)  # a wedged GPU or a lost node looks the same to rank 0
    try:
        wait_for(lambda: not alive(ranks[0]), 60, 'rank 0 to give up')
    finally:
        os.kill(ranks[1], signal.SIGCONT)  # torchrun's SIGTERM reaches it once it runs
        launcher.wait(timeout=60)
    assert launcher.returncode != 0
    errors = [line for line in err.read_text().splitlines() if line.startswith('error: ')]
    rank0 = [line for line in errors if line.startswith('error: rank 0: ')]
    assert len(rank0) == 1 and all(line.startswith('error: rank ') for line in errors), err.read_text()[-3000:]
    assert ' at train.py line ' in rank0[0] and '--timeout' in rank0[0]
    assert 'got no answer from another process within timeout=5s' in rank0[0]  # rank 1 may say so too, once resumed


@needs_proc
def test_workers_stop_when_torchrun_is_killed(tmp_path, data_dir):
    launcher, _, err, ranks = start_long_run(tmp_path, data_dir)
    launcher.kill()  # SIGKILL: torchrun cannot pass it on to its workers
    launcher.wait()
    wait_for(lambda: not any(alive(pid) for pid in ranks.values()), 30, 'the workers to stop')
    stopped = [line for line in err.read_text().splitlines() if 'the torchrun launcher' in line]
    assert sorted(stopped) == [f'error: rank {rank}: the torchrun launcher (pid {launcher.pid}) is gone: stopping'
                               for rank in (0, 1)]


def test_ctrl_c_ends_every_rank_at_once_with_rank_0s_line_alone(tmp_path, data_dir):
    """Ctrl-C in a terminal reaches the launcher and the workers (one process group): one line, rank 0's, naming
    what ckpt.pt holds, and the run gone well within the 10 s that a rank's own failure waits for torchrun."""
    out, err = tmp_path / 'stdout.txt', tmp_path / 'stderr.txt'
    launcher = subprocess.Popen([sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2',
                                 'train.py', *ARGS, f'--data_dir={data_dir}', f'--out_dir={tmp_path / "out"}',
                                 '--max_iters=1000000', '--eval_interval=2'], cwd=ROOT, stdout=open(out, 'w'),
                                stderr=open(err, 'w'), env=one_thread_env(), start_new_session=True)
    wait_for(lambda: 'iter 3:' in out.read_text() or launcher.poll() is not None, 120, 'training to start')
    assert launcher.poll() is None, err.read_text()[-3000:]
    os.killpg(launcher.pid, signal.SIGINT)
    start = time.monotonic()
    launcher.wait(timeout=60)
    assert time.monotonic() - start < 8
    saved = load(tmp_path / 'out')['iter_num']
    errors = [line for line in err.read_text().splitlines() if line.startswith('error: ')]
    assert errors == [f"error: interrupted at iter {errors[0].split()[4][:-1]}: {tmp_path / 'out' / 'ckpt.pt'} holds "
                      f"iter {saved}: go on with --init_from=resume"], err.read_text()[-3000:]


def test_fsdp_is_refused_with_one_line(data_dir, tmp_path):
    result = torchrun(*TINY_ARGS, f'--data_dir={data_dir}', f'--out_dir={tmp_path / "out"}', '--optim=muon',
                      '--gradient_accumulation_steps=2', '--parallelism=fsdp')
    assert result.returncode != 0 and not (tmp_path / 'out').exists()
    errors = [line for line in result.stderr.splitlines() if line.startswith('error: ')]
    assert errors == ["error: optim='muon' orthogonalizes each whole weight matrix, which parallelism='fsdp' splits "
                      "over the processes: use --parallelism=zero1 (Muon's state is sharded there too) or ddp, or "
                      "another --optim with fsdp"]
