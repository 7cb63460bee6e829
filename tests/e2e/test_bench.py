"""bench.py: both modes on tiny shapes (seconds), and its one-line errors. No timings."""
import json
import math
import re

import pytest
import torch
import torch.nn.functional as F

from helpers import patched_env, run_script
from training import card_checks


TINY_TRAIN = ['--device=cpu', '--compile=False', '--n_layer=1', '--n_head=2', '--n_embd=32', '--block_size=16',
              '--batch_size=2', '--vocab_size=256', '--num_steps=2', '--burnin_steps=1']


# N * V is 32x a chunk's logits, so the naive path's full logits dwarf the chunked path's
TINY_LOSS = ['--mode=loss', '--device=cpu', '--loss_rows=1024', '--n_embd=16', '--vocab_size=2048',
             '--chunk_size=32', '--loss_runs=1']


def test_train_mode_prints_time_per_iteration():
    result = run_script('bench.py', *TINY_TRAIN, '--real_data=False')
    assert result.returncode == 0, result.stderr
    assert '1/2 loss ' in result.stdout
    assert 'time per iteration: ' in result.stdout and 'MFU: ' in result.stdout


def test_count_ops_prints_each_part_for_our_loss_the_naive_one_and_nanogpts_loop():
    result = run_script('bench.py', *TINY_TRAIN, '--count_ops=True', '--gradient_accumulation_steps=2')
    assert result.returncode == 0, result.stderr
    rows = {line.split()[0]: [int(n.replace(',', '')) for n in line.split()[1:]] for line in
            result.stdout[result.stdout.index('part '):].splitlines()[1:-1]}
    assert list(rows) == ['forward', 'loss', 'backward', 'accumulation', 'clipping', 'optimizer', 'logging', 'total']
    assert all(len(counts) == 3 for counts in rows.values()) and rows['forward'][0] > 0
    assert rows['accumulation'] == [4, 4, 4] and sum(rows['total']) > 0
    assert 'chunked loss against the naive one: ' in result.stdout


def test_train_mode_times_each_loss_on_the_same_batches_and_prints_a_row_for_each():
    losses = ['chunked', 'naive'] + (['torch'] if hasattr(torch.nn, 'LinearCrossEntropyOptions') else [])
    result = run_script('bench.py', *TINY_TRAIN, '--real_data=False', f"--loss={','.join(losses)}")
    assert result.returncode == 0, result.stderr
    assert result.stdout.count('MFU: n/a (no known peak for this device)') == len(losses)
    assert result.stdout.count('peak memory: not measured on cpu') == len(losses)
    # the same initialization and data for every loss: the same first loss, up to rounding
    first_losses = [float(line.split()[-1]) for line in result.stdout.splitlines() if line.startswith('0/1 loss ')]
    assert len(first_losses) == len(losses) and max(first_losses) - min(first_losses) < 1e-4
    table = result.stdout[result.stdout.index('loss     micro-batch'):].splitlines()[1:]
    assert [row.split()[0] for row in table] == losses
    assert all(row.split()[1] == '2' and float(row.split()[2]) > 0 for row in table)



def test_train_mode_trains_the_model_and_optimizer_of_a_train_py_config(tmp_path):
    preset = tmp_path / 'preset.py'  # train.py's keys, bench.py's own ignored ones (out_dir) included
    preset.write_text("out_dir = 'out-preset'\neval_interval = 250\npos_emb = 'rope'\nnorm = 'rmsnorm'\n"
                      "tie_weights = False\nlogit_softcap = 15.0\noptim = 'muon'\n")
    result = run_script('bench.py', str(preset), *TINY_TRAIN, '--real_data=False', '--loss=chunked,naive')
    assert result.returncode == 0, result.stderr
    # muon_param_groups' line: the block's 4 matrices to Muon, the untied head in AdamW beside wte (no wpe: rope)
    assert result.stdout.count('num Muon matrices: 4, with 12,288 parameters; AdamW: 2 decayed tensors, 16,384') == 2
    assert 'time per iteration: ' in result.stdout


def test_train_mode_skips_torchs_loss_where_torch_lacks_it_and_refuses_it_alone():
    """docs/loss.md's command on torch 2.11 (the GPU suite's there): chunked and naive timed, torch's named as skipped."""
    env = patched_env('torch_2_11')
    result = run_script('bench.py', *TINY_TRAIN, '--real_data=False', '--loss=chunked,naive,torch', env=env)
    assert result.returncode == 0, result.stderr
    assert 'loss torch skipped: it needs F.linear_cross_entropy with LinearCrossEntropyOptions' in result.stdout
    table = result.stdout[result.stdout.index('loss     micro-batch'):].splitlines()[1:]
    assert [row.split()[0] for row in table] == ['chunked', 'naive']
    alone = run_script('bench.py', *TINY_TRAIN, '--real_data=False', '--loss=torch', env=env)
    assert alone.returncode == 2 and 'use --loss=chunked,naive, or a newer torch' in alone.stderr, alone.stderr
    assert len(alone.stderr.strip().splitlines()) == 1


def test_train_mode_refuses_what_train_py_refuses_and_softcap_with_torch_loss():
    for args, message in ((['--optimizer_in_backward=True'], 'use --grad_clip=0.0'),
                          (['--pos_emb=alibi'], 'pos_emb'),
                          (['--logit_softcap=15', '--loss=torch'], 'loss=torch has no logit soft-capping')):
        result = run_script('bench.py', *TINY_TRAIN, '--real_data=False', *args)
        assert result.returncode == 2 and message in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1


def test_train_mode_refuses_an_unknown_loss_and_find_batch_size_off_cuda():
    for arg, message in (('--loss=chunked,fused', "unknown loss 'fused'"), ('--find_batch_size=True', 'needs CUDA')):
        result = run_script('bench.py', *TINY_TRAIN, '--real_data=False', arg)
        assert result.returncode == 2 and message in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
        assert all(line.startswith('Overriding: ') for line in result.stdout.splitlines())  # refused before any run


def test_real_data_without_the_dataset_fails_with_one_line(tmp_path):
    result = run_script('bench.py', *TINY_TRAIN, f'--data_dir={tmp_path}', '--dataset=nothing_here')
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and 'Traceback' not in result.stderr
    assert str(tmp_path / 'nothing_here' / 'train.bin') in lines[0]
    assert 'python prepare/nothing_here.py' in lines[0] and '--real_data=False' in lines[0]


def peak_mib(stdout, method):
    """The peak MiB column (the next to last) of the loss table's row whose method name starts with `method`."""
    rows = [line.split() for line in stdout.splitlines() if line.startswith('  1024  ')]
    return float(next(row for row in rows if row[1].startswith(method))[-2])


def test_loss_mode_has_a_row_per_method_and_the_chunked_peak_is_below_naive():
    result = run_script('bench.py', *TINY_LOSS)
    assert result.returncode == 0, result.stderr
    naive, ours = peak_mib(result.stdout, 'naive'), peak_mib(result.stdout, 'chunked_cross_entropy')
    assert 'chunked_cross_entropy, 32 rows' in result.stdout
    assert peak_mib(result.stdout, 'floor:') > 0 # the time floor any exact method has
    # naive keeps (N, V) fp32 logits, 8 MiB here, alive; the chunked path 1/32 of them plus the gradients
    assert naive >= 8 and ours < naive / 4
    if hasattr(F, 'linear_cross_entropy'):
        assert peak_mib(result.stdout, 'torch') > 0


def test_loss_mode_profile_splits_each_method_into_matmuls_and_the_rest():
    result = run_script('bench.py', *TINY_LOSS, '--profile=True')
    assert result.returncode == 0, result.stderr
    split = [line for line in result.stdout.splitlines() if 'profiled: matmuls ' in line]
    assert len(split) == (4 if hasattr(F, 'linear_cross_entropy') else 3)
    assert all(line.startswith('  1024  ') and ', the rest ' in line for line in split)


def test_loss_mode_compiled_adds_a_compiled_row_per_method_and_skips_the_cuda_libraries():
    result = run_script('bench.py', *TINY_LOSS, '--compile=True')
    assert result.returncode == 0, result.stderr
    assert 'liger-kernel, cut-cross-entropy: skipped: CUDA only' in result.stdout
    rows = [line for line in result.stdout.splitlines() if line.startswith('  1024  ')]
    compiled = [row for row in rows if ', compiled ' in row]
    assert len(compiled) == len(rows) - 4 + (0 if hasattr(F, 'linear_cross_entropy') else 1)  # all but the floor
    assert any(row.split()[1] == 'chunked_cross_entropy,' for row in compiled)
    for row in compiled:  # vs eager, compile time; no peak: compiled code on the CPU allocates unseen by the tracer
        fields = row.split()
        assert fields[-4].endswith('x') and fields[-3].endswith('s') and fields[-2:] == ['n/a', 'n/a']


def test_sample_mode_times_generate_with_and_without_the_cache_and_they_agree():
    result = run_script('bench.py', '--mode=sample', '--device=cpu', '--n_layer=1', '--n_head=2', '--n_embd=32',
                        '--block_size=16', '--vocab_size=256', '--max_new_tokens=30')  # past block_size
    assert result.returncode == 0, result.stderr
    rows = [line.rsplit(None, 3) for line in result.stdout.splitlines() if line.endswith(' tokens/s')]
    assert [row[0] for row in rows] == ['nanoGPT generate', 'KV cache']
    assert all(row[1].endswith('s') and float(row[2]) > 0 for row in rows)
    assert 'generate: 30 new tokens after a 1-token prompt, block_size 16, 1 layers' in result.stdout
    # said before the long run starts: how long it will take, and the key that shortens it
    assert re.search(r'\nnanoGPT generate will take about \d+s here; --max_new_tokens sets the length .*\n'
                     r'nanoGPT generate\.\.\.\n', result.stdout)
    assert result.stdout.splitlines()[-1].endswith('x, same tokens: True')


def test_card_mode_on_a_cpu_checks_measures_and_runs_train_py_scaled_down_and_writes_its_report(tmp_path):
    """The card command's own code at a CPU's scale, the varlen kernel's CPU stand-in given to it
    (patches/card_varlen_stand_in.py): the three checks pass on randomized weights (losses away from ln(V), nonzero
    gradient differences), nanoGPT's path, the speedrun preset's compile, step and evaluation times and its hours,
    train.py's loop with its resume; the phases as they run, the row as soon as it is measured, card.md and
    card.json."""
    report = tmp_path / 'card'
    result = run_script('bench.py', '--mode=card', '--device=cpu', '--card_steps=2', f'--card_report={report}',
                        '--card_presets=speedrun_gpt2_12gb.py', env=patched_env('card_varlen_stand_in'), timeout=900)
    assert result.returncode == 0, result.stderr
    data = json.loads((tmp_path / 'card.json').read_text())
    assert data['scaled_down'] and list(data['checks']) == [name for name, _ in card_checks.CHECKS]
    for name, check in data['checks'].items():
        if name.startswith('flex'):  # CUDA only: their CPU stand-in's tests are unit/training/test_card_checks.py
            assert check == {'skipped': 'FlexAttention trains on CUDA only (the tests run it on a CPU stand-in)'}
            continue
        assert check['passed'], (name, check)
        assert abs(check['loss'] - math.log(96)) > 0.1 and check['gradient_difference'] > 0  # TINY's vocabulary
        assert check['parameters'] == 16  # every parameter's gradient compared: the tiny record model's
    path = data['nanogpt_path']
    assert path['vocab_size'] == 50304 and path['eager_ratio'] > 0 and path['compiled_ratio'] > 0
    assert path['ours_peak_bytes'] is None and path['naive_peak_bytes'] is None  # CUDA only
    [row] = data['presets']
    assert row['preset'] == 'speedrun_gpt2_12gb.py' and row['fits'] and row['estimated_peak_bytes'] > 0
    assert row['compile_seconds'] > 0 and row['step_seconds'] > 0 and row['eval_micro_batch_seconds'] > 0
    assert row['train_hours'] == pytest.approx(1390 * row['step_seconds'] / 3600)
    assert row['eval_hours'] > 0 and row['hours'] == row['train_hours'] + row['eval_hours']
    assert row['train_loop']['ok'], row['train_loop']
    assert data['speedrun']['tokens'] == 1390 * 2 * 64 * 2 and data['speedrun']['hours'] == row['hours']
    lines = result.stdout.splitlines()
    phases = [f'speedrun_gpt2_12gb.py: {phase}' for phase in ('building', 'compiling', 'timing', 'evaluating',
                                                              'train.py loop', 'train.py resume')]
    assert [line for line in lines if line in phases] == phases
    row_line = next(i for i, line in enumerate(lines) if line.startswith('| speedrun_gpt2_12gb.py | '))
    assert row_line < lines.index('# cpu (presets scaled down)')  # printed as measured, before the report
    markdown = (tmp_path / 'card.md').read_text()
    assert markdown.startswith('# cpu (presets scaled down)\n')
    assert markdown.count('| pass | ') == 3 and "nanoGPT's path, config/train_gpt2.py: micro-batch 2 x 64" in markdown
    assert lines[row_line] + '\n' in markdown and lines[row_line].endswith(' s) |')
    assert 'speedrun_gpt2_12gb.py (scaled down: not the real budget): 355,840 tokens in ' in markdown
    assert f'wrote {report}.md and {report}.json' in result.stdout
