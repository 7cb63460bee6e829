"""train.py end to end on CPU, in subprocesses as a user runs it: the loss falls, with every lever and through
FlashAttention's kernel (on CPU kernels) as through the masked attention; checkpoints resume exactly, after a kill
too, and from nanoGPT's own format; bad input fails with one line and writes nothing; a non-finite loss or an
out-of-memory error stops the run and leaves ckpt.pt as it was."""
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

from helpers import (MODERN_ARCH_ARGS, MODERN_RECIPE_ARGS, ROOT, TEXT, TINY_ARGS, load, logged_losses, one_thread_env,
                     patched_env, run_python, run_script, train, write_char_dataset)
from training import configurator


def same_weights(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def snapshot(path):
    """{name: bytes} of the files in directory `path`, its bytes if it is a file, None if it does not exist: to show
    that nothing was written."""
    if path.is_file():
        return path.read_bytes()
    return {p.name: p.read_bytes() for p in path.iterdir()} if path.exists() else None


# -----------------------------------------------------------------------------
# training, checkpoints, resume

def test_tiny_run_learns_and_checkpoints(tiny_run):
    result, _, out_dir = tiny_run
    losses = logged_losses(result.stdout)
    assert sorted(losses) == list(range(31))
    assert sum(losses[i] for i in range(25, 31)) / 6 < sum(losses[i] for i in range(6)) / 6 - 0.5
    val = logged_losses(result.stdout, 'step')
    assert sorted(val) == [0, 15, 30] and val[30] < val[0] - 0.5
    iter_line = next(line for line in result.stdout.splitlines() if line.startswith('iter 5:'))
    # nanoGPT's fields first, then the additions; no MFU on a CPU, whose peak is not known
    assert iter_line.startswith('iter 5: loss ') and 'ms, ' in iter_line and 'tok/s, eta ' in iter_line
    assert 'mfu' not in result.stdout
    assert os.listdir(out_dir) == ['ckpt.pt']  # no temporary file left behind
    checkpoint = load(out_dir)
    assert {'model', 'optimizer', 'model_args', 'iter_num', 'best_val_loss', 'config', 'scaler',
            'rng_states'} <= set(checkpoint)
    assert checkpoint['iter_num'] == 30 and checkpoint['model_args']['vocab_size'] == 34
    assert checkpoint['config']['n_layer'] == 2 and len(checkpoint['rng_states']) == 1
    assert set(checkpoint['config']) == set(configurator.train_keys())  # train.py's keys, nothing it imported


@pytest.mark.parametrize('architecture', [[], MODERN_RECIPE_ARGS], ids=['gpt2', 'modern recipe'])
def test_resume_repeats_the_uninterrupted_run(tmp_path, data_dir, architecture):
    args = ['--dropout=0.1', '--eval_interval=4', *architecture]  # dropout: the RNG state must be restored too
    whole = train(data_dir, tmp_path / 'whole', *args, '--max_iters=8')
    first = train(data_dir, tmp_path / 'split', *args, '--max_iters=4')
    second = train(data_dir, tmp_path / 'split', *args, '--max_iters=8', '--init_from=resume')
    for result in (whole, first, second):
        assert result.returncode == 0, result.stderr
    expected = logged_losses(whole.stdout)
    assert logged_losses(second.stdout) == {i: expected[i] for i in range(4, 9)}
    assert logged_losses(second.stdout, 'step') == {i: logged_losses(whole.stdout, 'step')[i] for i in (4, 8)}
    assert same_weights(load(tmp_path / 'whole')['model'], load(tmp_path / 'split')['model'])


@pytest.mark.parametrize('levers', [
    ['--activation_checkpointing=True', '--optim=muon'],
    ['--dtype=bfloat16', '--weight_dtype=bfloat16', '--optim=adamw_bf16'],
    ['--dtype=bfloat16', '--weight_dtype=bfloat16', '--optim=adamw_8bit', '--optimizer_in_backward=True',
     '--grad_clip=0.0'],
    ['--optimizer_in_backward=True', '--grad_clip=0.0', '--activation_checkpointing=True'],
], ids=['checkpointing, muon', 'bf16 weights, bf16 moments', 'bf16 weights, 8-bit moments, in backward',
        'in backward, checkpointing'])
def test_modern_architecture_trains_with_each_lever(tmp_path, data_dir, levers):
    if '--optim=adamw_8bit' in levers and importlib.util.find_spec('torchao') is None:
        pytest.skip('adamw_8bit needs torchao: pip install -r requirements-dev.txt')
    result = train(data_dir, tmp_path / 'out', *MODERN_ARCH_ARGS, *levers, '--max_iters=12', '--eval_interval=12')
    assert result.returncode == 0, result.stderr
    losses = logged_losses(result.stdout)
    assert sorted(losses) == list(range(13)) and losses[12] < losses[0] - 0.3
    saved = torch.load(tmp_path / 'out' / 'ckpt.pt', weights_only=False)  # our own file; torchao's 8-bit state
    assert saved['model_args']['pos_emb'] == 'rope'


def test_window_warmup_trains_and_evaluates_with_the_window_of_the_iteration(tmp_path, data_dir):
    """Iterations 0 and 1 of a warmup from 2 over 100 iterations have a window of 2: their training losses and the
    evaluation at 0 are those of attn_window=2 throughout, not of the attn_window=8 the window grows to."""
    args = [*MODERN_ARCH_ARGS, '--zero_init_proj=False', '--max_iters=1', '--eval_interval=1']  # attention from 0
    no_warmup = ['--attn_window_warmup_iters=0', '--attn_window_warmup_start=64']  # both: train.py's defaults
    runs = {name: train(data_dir, tmp_path / name, *args, *extra) for name, extra in [
        ('warmup', ['--attn_window_warmup_iters=100']), ('narrow', ['--attn_window=2', *no_warmup]),
        ('wide', no_warmup)]}
    for result in runs.values():
        assert result.returncode == 0, result.stderr
    train_losses = {name: logged_losses(result.stdout) for name, result in runs.items()}
    val_losses = {name: logged_losses(result.stdout, 'step')[0] for name, result in runs.items()}
    assert train_losses['warmup'] == train_losses['narrow'] != train_losses['wide']
    assert val_losses['warmup'] == val_losses['narrow'] != val_losses['wide']


def test_flash_kernel_trains_compiled_as_the_masked_attention_does(tmp_path, data_dir):
    """train.py as on an Ampere GPU: attention through torch's varlen_attn (on the CPU kernels of
    flash_varlen_on_a_cpu.py), compiled, with activation checkpointing, the recipe and its growing window, gives the
    losses of the masked attention run eagerly, in training and evaluation. In fp32, which the CUDA kernel refuses:
    the losses agree to 1e-4, which bf16 would round away (a bf16 run through train.py: test_train_card.py)."""
    # the window by position, FlashAttention's kind (a window in blocks runs the masked attention)
    args = [*MODERN_RECIPE_ARGS, '--attn_window_block=0', '--activation_checkpointing=True', '--max_iters=8',
            '--eval_interval=4']
    masked = train(data_dir, tmp_path / 'masked', *args)
    flash = train(data_dir, tmp_path / 'flash', *args, '--compile=True',
                  env=patched_env('counted_flash_kernel', FLASH_FULL_PRECISION='1'))
    assert masked.returncode == 0 and flash.returncode == 0, flash.stderr
    assert 'flash kernel calls: 0' not in flash.stderr and 'flash kernel calls: ' in flash.stderr
    for kind in ('iter', 'step'):
        assert logged_losses(flash.stdout, kind) == pytest.approx(logged_losses(masked.stdout, kind), rel=1e-4)


def test_kill_during_training_then_resume(tmp_path, data_dir):
    out_dir = tmp_path / 'out'
    process = subprocess.Popen([sys.executable, 'train.py', *TINY_ARGS, f'--data_dir={data_dir}',
                                f'--out_dir={out_dir}', '--max_iters=100000', '--eval_interval=2'],
                               cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               env=one_thread_env())
    deadline = time.time() + 120
    while not (out_dir / 'ckpt.pt').exists() and time.time() < deadline and process.poll() is None:
        time.sleep(0.05)
    time.sleep(0.3)  # a few more steps and saves: the kill lands mid-step or mid-save
    process.send_signal(signal.SIGKILL)
    process.wait()
    iter_num = load(out_dir)['iter_num']  # a complete checkpoint, whatever the moment of the kill
    result = train(data_dir, out_dir, '--init_from=resume', f'--max_iters={iter_num + 2}', '--eval_interval=2')
    assert result.returncode == 0, result.stderr
    assert sorted(logged_losses(result.stdout)) == [iter_num, iter_num + 1, iter_num + 2]
    assert load(out_dir)['iter_num'] == iter_num + 2
    assert os.listdir(out_dir) == ['ckpt.pt']  # a temporary file of a save the kill cut short is gone


def interrupted_run(data_dir, out_dir, eval_interval, after):
    """train.py sent SIGINT, as Ctrl-C sends it, once it has logged the line starting with `after`: (exit status,
    stderr)."""
    process = subprocess.Popen([sys.executable, 'train.py', *TINY_ARGS, f'--data_dir={data_dir}',
                                f'--out_dir={out_dir}', '--max_iters=100000', f'--eval_interval={eval_interval}'],
                               cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=one_thread_env())
    for line in process.stdout:
        if line.startswith(after):
            break
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    return process.returncode, stderr


def test_ctrl_c_ends_with_one_line_naming_the_checkpoint_and_how_to_resume(tmp_path, data_dir):
    """Ctrl-C once iteration 7 is logged (after the save at 6): exit 130, one line, and ckpt.pt whole at the
    iteration the line names."""
    status, stderr = interrupted_run(data_dir, tmp_path / 'out', 6, 'iter 7:')
    saved = load(tmp_path / 'out')['iter_num']
    assert status == 130
    assert re.fullmatch(rf"error: interrupted at iter \d+: {re.escape(str(tmp_path / 'out' / 'ckpt.pt'))} holds iter "
                        rf"{saved}: go on with --init_from=resume\n", stderr), stderr
    assert saved % 6 == 0 and saved >= 6


def test_ctrl_c_before_the_first_checkpoint_says_none_was_written(tmp_path, data_dir):
    status, stderr = interrupted_run(data_dir, tmp_path / 'out', 100000, 'iter 2:')
    assert status == 130
    assert re.fullmatch(r'error: interrupted at iter \d+: no checkpoint written yet \(one is saved at each '
                        r'eval_interval=100000 iterations\)\n', stderr), stderr
    assert not (tmp_path / 'out' / 'ckpt.pt').exists()


def test_nanogpt_checkpoint_resumes(tmp_path, tiny_run):
    result, data_dir, tiny_out = tiny_run
    checkpoint = load(tiny_out)
    del checkpoint['scaler'], checkpoint['rng_states']  # what nanoGPT does not save
    checkpoint['model'] = {'_orig_mod.' + k: v for k, v in checkpoint['model'].items()}  # a compiled model's names
    checkpoint['best_val_loss'] = torch.tensor(checkpoint['best_val_loss'])
    (tmp_path / 'out').mkdir()
    torch.save(checkpoint, tmp_path / 'out' / 'ckpt.pt')
    resumed = train(data_dir, tmp_path / 'out', '--init_from=resume', '--max_iters=31', '--eval_interval=15')
    assert resumed.returncode == 0, resumed.stderr
    assert 'note: ' in resumed.stdout and 'nanoGPT' in resumed.stdout
    assert logged_losses(resumed.stdout, 'step')[30] == logged_losses(result.stdout, 'step')[30]
    assert sorted(logged_losses(resumed.stdout)) == [30, 31]


@pytest.mark.parametrize('eval_batch_size', [1, 3])
def test_eval_batch_size_changes_the_micro_batch_not_the_loss(tiny_run, tmp_path, eval_batch_size):
    """batch_size 4 x eval_iters 2 = 8 windows a split, in micro-batches of 4, or of 1 or 3 (3 + 3 + 2)."""
    _, data_dir, out = tiny_run
    shutil.copytree(out, tmp_path / 'out')
    evaluations = [train(data_dir, tmp_path / 'out', '--init_from=resume', '--eval_only=True', *extra)
                   for extra in ([], [f'--eval_batch_size={eval_batch_size}'])]
    for result in evaluations:
        assert result.returncode == 0, result.stderr
    losses = [[float(word.rstrip(',')) for line in result.stdout.splitlines() if line.startswith('step ')
               for word in line.split()[4::3]] for result in evaluations]  # step N: train loss X, val loss Y
    assert len(losses[0]) == 2 and losses[1] == pytest.approx(losses[0], abs=2e-4)  # printed to 4 decimals


def wandb_records(wandb_dir):
    """The records of the one offline run under wandb_dir, read back by wandb's own reader (one JSON line each)."""
    run_dir, = (wandb_dir / 'wandb').glob('offline-run-*')
    result = subprocess.run([sys.executable, '-m', 'wandb', 'leet', 'inspect', '--json', str(run_dir)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_wandb_logs_each_log_interval_and_evaluation(tmp_path, data_dir):
    wandb_dir = tmp_path / 'wandb_dir'
    wandb_dir.mkdir()
    result = train(data_dir, tmp_path / 'out', '--wandb_log=True', '--wandb_run_name=tiny', '--optim=muon',
                   '--max_iters=6', '--log_interval=2', '--eval_interval=3',
                   env={'WANDB_MODE': 'offline', 'WANDB_DIR': str(wandb_dir)})
    assert result.returncode == 0, result.stderr
    records = wandb_records(wandb_dir)
    run = next(record['run'] for record in records if record['type'] == 'run')
    assert (run['project'], run['display_name']) == ('owt', 'tiny')
    config = run['config']['update']
    assert (config['n_layer'], config['optim'], config['log_interval'], config['wandb_log']) == (2, 'muon', 2, True)
    assert config['memory_estimate'] is None  # estimated for CUDA runs only
    # one row an iteration, wandb's step: the log_interval's iterations and the evaluations' merged where both log
    rows = {record['history']['step']['num']: {k: v for k, v in record['history']['item'].items()
                                               if not k.startswith('_')}
            for record in records if record['type'] == 'history'}
    assert sorted(rows) == [0, 2, 3, 4, 6] and all(row['iter'] == step for step, row in rows.items())
    iteration_keys = {'iter', 'train/loss_iter', 'lr', 'lr/muon', 'tokens_per_sec', 'grad_norm'}  # no mfu or GPU
    evaluation_keys = {'iter', 'train/loss', 'val/loss', 'lr'}                                    # memory on a CPU
    assert set(rows[2]) == set(rows[4]) == iteration_keys and set(rows[3]) == evaluation_keys
    assert set(rows[0]) == set(rows[6]) == iteration_keys | evaluation_keys
    # the values printed, the scheduled learning rates (warmup to iter 2) and a norm of real gradients
    losses, evaluations = logged_losses(result.stdout), logged_losses(result.stdout, 'step')
    assert [rows[i]['train/loss_iter'] for i in (0, 2, 4, 6)] == [pytest.approx(losses[i], abs=1e-4)
                                                                  for i in (0, 2, 4, 6)]
    assert [rows[i]['val/loss'] for i in (0, 3, 6)] == [pytest.approx(evaluations[i], abs=1e-4) for i in (0, 3, 6)]
    assert (rows[0]['lr'], rows[2]['lr'], rows[2]['lr/muon']) == pytest.approx((1e-2 / 3, 1e-2, 0.02))
    assert all(0 < rows[i]['grad_norm'] < 1e3 and rows[i]['tokens_per_sec'] > 0 for i in (0, 2, 4, 6))


def test_wandb_is_not_imported_without_wandb_log(tmp_path, data_dir):
    stub = tmp_path / 'stub'
    stub.mkdir()
    marker = tmp_path / 'wandb_imported'
    (stub / 'wandb.py').write_text(f'open({str(marker)!r}, "w").close()\n')  # found before the installed wandb
    result = train(data_dir, tmp_path / 'out', '--max_iters=0', env={'PYTHONPATH': str(stub)})
    assert result.returncode == 0, result.stderr
    assert not marker.exists()


# -----------------------------------------------------------------------------
# failures: a non-finite loss, out of memory, bad input

def test_init_from_gpt2_weights(tmp_path, data_dir):
    """init_from=gpt2 through Hugging Face's GPT2LMHeadModel, offline: a 2-layer stand-in with GPT-2's vocabulary
    and context replaces the download; train.py crops the context to block_size and checkpoints it."""
    result = train(data_dir, tmp_path / 'out', '--init_from=gpt2', '--max_iters=2', '--eval_interval=2',
                   env=patched_env('offline_gpt2'))
    assert result.returncode == 0, result.stderr
    assert 'loading weights from pretrained gpt: gpt2' in result.stdout
    assert sorted(logged_losses(result.stdout)) == [0, 1, 2]
    checkpoint = load(tmp_path / 'out')
    assert checkpoint['model_args'] == dict(n_layer=2, n_head=2, n_embd=32, block_size=16, bias=True,
                                            vocab_size=50257, dropout=0.0)
    assert checkpoint['model']['transformer.wpe.weight'].shape == (16, 32)


@pytest.fixture
def good_checkpoint(tmp_path, tiny_run):
    """tmp_path/out holding a copy of the tiny run's ckpt.pt: (data dir, out dir, its bytes)."""
    _, data_dir, tiny_out = tiny_run
    shutil.copytree(tiny_out, tmp_path / 'out')
    return data_dir, tmp_path / 'out', (tmp_path / 'out' / 'ckpt.pt').read_bytes()


def test_non_finite_loss_stops_without_saving(good_checkpoint):
    data_dir, out_dir, before = good_checkpoint
    result = train(data_dir, out_dir, '--max_iters=10', '--eval_interval=4',
                   env=patched_env('forward_fault', FORWARD_FAULT='nan training 3'))
    assert result.returncode == 2
    assert 'error: the training loss is nan at iter 2' in result.stderr and 'Traceback' not in result.stderr
    assert 'keeps the last good state' in result.stderr
    # grad_clip is already 1.0, the default: the advice is what would change something
    assert 'try a lower --learning_rate (now 0.01)' in result.stderr and '--grad_clip' not in result.stderr
    assert (out_dir / 'ckpt.pt').read_bytes() == before and os.listdir(out_dir) == ['ckpt.pt']


def test_a_run_from_scratch_keeps_the_checkpoint_it_replaces_as_ckpt_prev(good_checkpoint):
    """A run started in the out_dir of another (a forgotten --init_from=resume) says so at its start, and its first
    save keeps the other run's ckpt.pt whole as ckpt.prev.pt; its later saves replace only its own."""
    data_dir, out_dir, before = good_checkpoint
    result = train(data_dir, out_dir, '--max_iters=4', '--eval_interval=2')
    assert result.returncode == 0, result.stderr
    assert (f"{out_dir / 'ckpt.pt'} holds another run (iteration 30): this run's first checkpoint keeps it as "
            f"ckpt.prev.pt; --init_from=resume would continue it") in result.stdout
    assert result.stdout.count('saving checkpoint') == 2  # at iterations 2 and 4
    assert (out_dir / 'ckpt.prev.pt').read_bytes() == before and load(out_dir)['iter_num'] == 4
    assert sorted(os.listdir(out_dir)) == ['ckpt.prev.pt', 'ckpt.pt']


def test_a_save_that_fails_stops_with_one_line_and_keeps_the_last_checkpoint(good_checkpoint):
    """A full disk at the second save of this run: one line, exit 2, the checkpoint of the first save intact."""
    data_dir, out_dir, _ = good_checkpoint
    result = train(data_dir, out_dir, '--init_from=resume', '--max_iters=34', '--eval_interval=2',
                   env=patched_env('full_disk'))
    assert result.returncode == 2
    [error] = result.stderr.strip().splitlines()
    assert error.startswith(f"error: could not write {out_dir / 'ckpt.pt'} ([Errno 28] No space left on device)")
    assert os.listdir(out_dir) == ['ckpt.pt'] and load(out_dir)['iter_num'] == 30  # the 1st save's, not the 2nd's


def test_prepared_from_another_directory_then_trained_from_it(tmp_path):
    """Every relative path is relative to the current directory: prepare/ writes data/<dataset> there, and
    train.py, run from there by its full path, reads it. The schedule's warmup as long as its decay trains too
    (nanoGPT divides by zero there)."""
    corpus = tmp_path / 'input.txt'
    corpus.write_text(TEXT)
    prepared = subprocess.run([sys.executable, str(ROOT / 'prepare' / 'shakespeare_char.py'), '--input', str(corpus)],
                              cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert prepared.returncode == 0, prepared.stderr
    args = [arg for arg in TINY_ARGS if not arg.startswith(('--dataset', '--warmup_iters', '--lr_decay_iters'))]
    config = ROOT / 'config' / 'train_shakespeare_char.py'
    trained = run_python(ROOT / 'train.py', config, *args, '--max_iters=3', '--eval_interval=3', '--warmup_iters=1',
                         '--lr_decay_iters=1', cwd=tmp_path)
    assert trained.returncode == 0, trained.stderr
    assert sorted(logged_losses(trained.stdout)) == [0, 1, 2, 3]
    assert (tmp_path / 'out-shakespeare-char' / 'ckpt.pt').exists()


@pytest.mark.parametrize('phase, advice', [('training', '--batch_size=2 --gradient_accumulation_steps=2'),
                                           ('evaluation', '--eval_batch_size=2')])
def test_out_of_memory_advises_and_keeps_checkpoint(good_checkpoint, phase, advice):
    data_dir, out_dir, before = good_checkpoint
    # the 3rd evaluation forward is in the first evaluation
    result = train(data_dir, out_dir, '--max_iters=10', '--eval_interval=100',
                   env=patched_env('forward_fault', FORWARD_FAULT=f'oom {phase} 3'))
    assert result.returncode == 2
    assert f'error: out of memory during {phase} at micro-batch 4' in result.stderr
    assert advice in result.stderr and 'Traceback' not in result.stderr
    assert (out_dir / 'ckpt.pt').read_bytes() == before


# the configurator's other errors (wrong type, missing config file, unknown device) are tested in
# test_configurator.py; here each path through train.py once
BAD_INPUTS = {  # name: (extra arguments, extra environment, what the one-line error must name)
    'missing dataset': (['--dataset=shakespeare_char'], {}, 'python prepare/shakespeare_char.py'),
    'block_size over data': (['--block_size=100000'], {}, 'block_size=100000'),
    'block_size over model': (['--init_from=resume', '--block_size=32'], {}, "resumed model's 16"),
    'meta vocab over model': (['--init_from=resume', '--dataset=big_vocab'], {}, 'vocab_size 100'),
    'truncated checkpoint': (['--init_from=resume'], {}, 'truncated'),
    'resume without checkpoint': (['--init_from=resume'], {}, 'no checkpoint at'),
    'resume of another shape': (['--init_from=resume', '--n_layer=3'], {}, 'n_layer=3, but '),
    'world size': (['--gradient_accumulation_steps=3'], {'RANK': '0', 'LOCAL_RANK': '0', 'WORLD_SIZE': '2'},
                   'gradient_accumulation_steps=3'),
    'unknown dtype': (['--dtype=float8'], {}, "dtype 'float8'"),
    'unknown parallelism': (['--parallelism=zero3'], {}, "parallelism 'zero3': use one of ddp, zero1, fsdp "
                                                         "(docs/parallel.md)"),
    'fsdp_mixed_precision outside fsdp': (['--fsdp_mixed_precision=True'], {}, "applies to parallelism='fsdp'"),
    'absent cuda': (['--device=cuda'], {}, 'CUDA is not available'),
    'unknown key': (['--learning_rat=1'], {}, '--learning_rate'),
    'wandb not installed': (['--wandb_log=True'], {}, 'pip install wandb'),
    'no heads': (['--n_head=0'], {}, 'n_head must be at least 1, got 0'),
    'no width': (['--n_embd=0'], {}, 'n_embd must be at least 1, got 0'),
    'negative layers': (['--n_layer=-1'], {}, 'n_layer must be at least 1, got -1'),
    'negative max_iters': (['--max_iters=-5'], {}, 'max_iters must be 0 or more, got -5'),
    'no loss chunk': (['--loss_chunk_mib=0'], {}, 'loss_chunk_mib=0 must be positive'),
    # no machine holds these: stopped before anything is allocated, naming the floor of the memory they need
    'batch beyond memory': (['--batch_size=10000000000'], {}, 'block inputs 38,147.0)'),
    'model beyond memory': (['--n_layer=10000000', '--n_embd=4096', '--n_head=32'], {},
                            'weights and gradients 15,000,000.0'),
    'dropout over 1': (['--dropout=2.0'], {}, 'dropout is a probability in [0, 1), got 2.0'),
    'empty out_dir': (['--out_dir='], {}, 'out_dir is empty'),
    'out_dir is a file': ([], {}, 'cannot be a directory'),
    'unwritable out_dir': (['--out_dir=/proc/nanogpt_out'], {}, "cannot write in out_dir='/proc/nanogpt_out'"),
    'not a checkpoint': (['--init_from=resume'], {}, 'is not a PyTorch checkpoint'),
    'empty val.bin': (['--dataset=empty_val'], {}, 'val.bin is empty: prepare the dataset again'),
    'odd-sized train.bin': (['--dataset=odd_train'], {}, 'train.bin has 1,001 bytes, an odd number'),
    'meta vocab_size below 1': (['--dataset=negative_vocab'], {}, 'has vocab_size -5, but a vocabulary has at least'),
    # the .bin files of another vocabulary beside a meta.pkl: stopped at the first batch, before any step or save
    'tokens beyond the vocabulary': (['--dataset=small_vocab'], {},
                                     "but the model's vocabulary has 10 tokens (0 to 9)"),
    'hellaswag on characters': (['--hellaswag=True'], {}, "hellaswag=True scores GPT-2 tokens, but the model's "
                                                          "vocab_size is 34"),
}


def not_applicable(name):
    """Why case `name` cannot fail on this machine, or None."""
    if name == 'absent cuda' and torch.cuda.is_available():
        return 'CUDA is available here'
    if name == 'wandb not installed' and importlib.util.find_spec('wandb') is not None:
        return 'wandb is installed here'
    if name == 'unwritable out_dir' and not os.path.isdir('/proc/self'):
        return 'needs Linux /proc, where nobody, root included, writes'
    return None


@pytest.fixture(scope='module')
def bad_runs(tmp_path_factory, tiny_run):
    """Each applicable BAD_INPUTS case run once: {name: (exit status, stderr, out_dir before, out_dir after)}."""
    _, tiny_data, tiny_out = tiny_run
    root = tmp_path_factory.mktemp('bad')
    write_char_dataset(root / 'data', 'big_vocab', vocab_size=100)
    (write_char_dataset(root / 'data', 'empty_val') / 'val.bin').write_bytes(b'')
    (write_char_dataset(root / 'data', 'odd_train') / 'train.bin').write_bytes(bytes(1001))
    write_char_dataset(root / 'data', 'negative_vocab', vocab_size=-5)
    write_char_dataset(root / 'data', 'small_vocab', vocab_size=10)
    names = [name for name in BAD_INPUTS if not not_applicable(name)]
    cases, before = [], {}
    for name in names:
        args, env, _ = BAD_INPUTS[name]
        out_dir = root / name.replace(' ', '_')
        own_data = ('missing dataset', 'meta vocab over model', 'empty val.bin', 'odd-sized train.bin',
                    'meta vocab_size below 1', 'tokens beyond the vocabulary')
        data_dir = root / 'data' if name in own_data else tiny_data
        resumed = ('block_size over model', 'meta vocab over model', 'truncated checkpoint', 'resume of another shape')
        if name in resumed:
            shutil.copytree(tiny_out, out_dir)
        if name == 'truncated checkpoint':
            ckpt = out_dir / 'ckpt.pt'
            ckpt.write_bytes(ckpt.read_bytes()[:ckpt.stat().st_size // 2])
        if name == 'not a checkpoint':
            out_dir.mkdir()
            (out_dir / 'ckpt.pt').write_bytes(os.urandom(4096))
        if name == 'out_dir is a file':
            out_dir.write_text('a file')
        before[name] = snapshot(out_dir)
        # --max_iters=2: short, should a check be missing
        cases.append(([*TINY_ARGS, f'--data_dir={data_dir}', f'--out_dir={out_dir}', '--max_iters=2', *args], env))
    driver = run_script('tests/train_cases.py', json.dumps(cases))  # torch imported once, not per case
    assert driver.returncode == 0, driver.stderr
    results = json.loads(driver.stdout)
    return {name: (*result, before[name], snapshot(root / name.replace(' ', '_')))
            for name, result in zip(names, results)}


@pytest.mark.parametrize('name', BAD_INPUTS)
def test_bad_input_fails_with_one_line_and_writes_nothing(bad_runs, name):
    if not_applicable(name):
        pytest.skip(not_applicable(name))
    status, stderr, before, after = bad_runs[name]
    assert status == 2, stderr
    assert stderr.startswith('error: ') and stderr.count('\n') == 1, stderr
    assert BAD_INPUTS[name][2] in stderr
    assert after == before  # no directory created, no file written or changed
