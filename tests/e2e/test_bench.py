"""bench.py: each mode on tiny shapes (seconds; the card's two runs a few minutes), and its one-line errors. No
timings, but that a card run with a complete report is much faster than the run that made it."""
import json
import math
import re
import time

import pytest
import torch
import torch.nn.functional as F

from helpers import ROOT, patched_env, run_script
from training import card_checks
from training.card_measure import SPEEDRUN


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
    """docs/loss.md's command on torch 2.11 (the GPU suite's there): chunked and naive timed, torch's named as
    skipped."""
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


@pytest.mark.parametrize('model', [('--n_layer=1', '--block_size=16'),  # past block_size
                                   ('--model_file=gpt2026.py', '--n_layer=11', '--doc_token=255', '--max_iters=1600')],
                         ids=['model.py', 'gpt2026.py'])
def test_sample_mode_times_generate_with_and_without_the_cache_and_they_agree(model):
    result = run_script('bench.py', '--mode=sample', '--device=cpu', *model, '--n_head=2', '--n_embd=32',
                        '--vocab_size=256', '--max_new_tokens=30')
    assert result.returncode == 0, result.stderr
    rows = [line.rsplit(None, 3) for line in result.stdout.splitlines() if line.endswith(' tokens/s')]
    assert [row[0] for row in rows] == ['nanoGPT generate', 'KV cache']
    assert all(row[1].endswith('s') and float(row[2]) > 0 for row in rows)
    said = ('model.py, block_size 16, 1 layers' if model[0] == '--n_layer=1' else 'gpt2026.py, 11 layers')
    assert f'generate: 30 new tokens after a 1-token prompt, {said}, n_embd 32' in result.stdout
    # said before the long run starts: how long it will take, and the key that shortens it
    assert re.search(r'\nnanoGPT generate will take about \d+s here; --max_new_tokens sets the length .*\n'
                     r'nanoGPT generate\.\.\.\n', result.stdout)
    assert result.stdout.splitlines()[-1].endswith('x, same tokens: True')


@pytest.fixture(scope='module')
def card_runs(tmp_path_factory):
    """The card on a CPU twice with one report, the varlen kernel's CPU stand-in given to it
    (patches/card_varlen_stand_in.py): first the speedrun preset (with the checks, nanoGPT's path and the profile),
    then the speedrun preset and train_gpt2_4gb.py. (The report's path, [(each completed run, its seconds, card.json
    and card.md after it)])."""
    report = tmp_path_factory.mktemp('card') / 'card'
    runs = []
    for presets in (SPEEDRUN, f'{SPEEDRUN},train_gpt2_4gb'):
        start = time.perf_counter()
        result = run_script('bench.py', '--mode=card', '--device=cpu', '--card_steps=2', f'--card_report={report}',
                            f'--card_presets={presets}', env=patched_env('card_varlen_stand_in'), timeout=900)
        runs.append((result, time.perf_counter() - start, json.loads(report.with_suffix('.json').read_text()),
                     report.with_suffix('.md').read_text()))
    return report, runs


def test_card_mode_on_a_cpu_checks_runs_train_py_on_a_preset_and_profiles_scaled_down(card_runs):
    """The card command's own code at a CPU's scale: the checks pass on randomized weights (losses away from ln(V),
    nonzero gradient differences), but for FlexAttention's, CUDA only; train.py on the speedrun preset through every
    phase, its figures from its phase log and its hours; nanoGPT's path; the profile's top operators; the lines as
    they run, card.md and card.json."""
    report, [(result, _, data, markdown), _] = card_runs
    assert result.returncode == 0, result.stderr
    assert data['scaled_down'] and list(data['checks']) == [name for name, _ in card_checks.CHECKS]
    for name, check in data['checks'].items():
        if name.startswith('flex'):  # CUDA only: their CPU stand-in's tests are unit/training/test_card_checks.py
            assert {key: value for key, value in check.items() if key != 'fingerprint'} == {
                'skipped': 'FlexAttention trains on CUDA only (the tests run it on a CPU stand-in)'}
            continue
        assert check['passed'], (name, check)
        assert abs(check['loss'] - math.log(96)) > 0.1 and check['gradient_difference'] > 0  # TINY's vocabulary
        assert check['parameters'] == 16  # every parameter's gradient compared: the tiny record model's
    path = data['nanogpt_path']
    assert path['vocab_size'] == 50304 and path['eager_ratio'] > 0 and path['compiled_ratio'] > 0
    assert path['ours_peak_bytes'] is None and path['naive_peak_bytes'] is None  # CUDA only
    [row] = data['presets']
    assert row['preset'] == SPEEDRUN and row['card_gib'] == 12 and row['cap_bytes'] is None and row['fits'] is None
    assert row['phase_reached'] == 'done' and row['estimated_peak_bytes'] > 0 and row['estimate_fits']
    assert row['step_seconds'] > 0 and row['eval_micro_batch_seconds'] > 0 and row['resume_seconds'] > 0
    assert 'compile_seconds' not in row  # eager on a CPU: no compilation to measure
    assert row['train_hours'] == pytest.approx(1390 * row['step_seconds'] / 3600)
    assert row['tokens'] == 1390 * 2 * 64 * 2 and row['hours'] == row['train_hours'] + row['eval_hours']
    for label in (SPEEDRUN, 'train_gpt2.py'):
        profiled = data['profile'][label]
        assert profiled['compiled'] and profiled['seconds'] > 0 and sum(profiled['shares'].values()) == \
            pytest.approx(1.0)
        assert len(profiled['top']) == 12 and profiled['top'][0]['seconds'] >= profiled['top'][-1]['seconds']
    assert any(top['name'].startswith('aten::_scaled_dot_product') and top['category'] == 'attention'
               for top in data['profile'][SPEEDRUN]['top'])
    lines = result.stdout.splitlines()
    assert [line for line in lines if line in (f'{SPEEDRUN}: train.py', f'{SPEEDRUN}: train.py resume')] == [
        f'{SPEEDRUN}: train.py', f'{SPEEDRUN}: train.py resume']
    assert f'{SPEEDRUN}: saving checkpoint to ' in result.stdout and f'{SPEEDRUN}: Resuming training from ' in \
        result.stdout
    row_line = next(i for i, line in enumerate(lines) if line.startswith(f'| {SPEEDRUN} | 12 GB | '))
    assert row_line < lines.index('# cpu (presets scaled down)')  # printed as measured, before the report
    assert markdown.startswith('# cpu (presets scaled down)\n')
    assert all(f'\n| {name} | pass | ' in markdown
               for name in ('compiled against eager', 'varlen kernel against masked', 'bf16 weights against fp32'))
    assert "nanoGPT's path, config/train_gpt2.py: micro-batch 2 x 64" in markdown
    assert lines[row_line] + '\n' in markdown and '| done | ran every phase, no cap (a CPU) |' in lines[row_line]
    assert '| train_gpt2_4gb.py |  | n/a | n/a | n/a / n/a |  | not yet measured |' in markdown
    assert f'{SPEEDRUN} (scaled down: not the real budget): 355,840 tokens in ' in markdown
    assert f"Profile of config/{SPEEDRUN}'s step (2 micro-batches of 2 x 64, bfloat16, muon, compiled): " in markdown
    assert f'wrote {report}.md and {report}.json (' in result.stdout


def test_a_second_card_run_with_the_same_report_measures_only_what_it_lacks_in_a_fraction_of_the_time(card_runs):
    _, [(_, first_seconds, _, _), (second, second_seconds, data, _)] = card_runs
    assert second.returncode == 0, second.stderr
    assert [run['measured'] for run in data['runs']][1] == ['train_gpt2_4gb.py']
    assert [row['preset'] for row in data['presets']] == [SPEEDRUN, 'train_gpt2_4gb.py']
    assert data['presets'][1]['phase_reached'] == 'done' and data['presets'][1]['card_gib'] == 4
    assert f'card: cpu (presets scaled down), torch {torch.__version__}: train_gpt2_4gb.py to measure' in \
        second.stdout
    assert second_seconds <= first_seconds / 3, (first_seconds, second_seconds)


@pytest.mark.parametrize('args, message', [
    (['--card_presets=train_gpt2_5gb'], 'error: card_presets: train_gpt2_5gb.py is no card preset: use some of '),
    (['--card_steps=0'], 'error: card_steps=0 must be at least 1: the timed steps of each preset'),
])
def test_card_mode_refuses_an_unknown_preset_and_no_timed_steps_in_one_line(tmp_path, args, message):
    result = run_script('bench.py', '--mode=card', '--device=cpu', f'--card_report={tmp_path / "card"}', *args)
    assert result.returncode == 2 and result.stderr.startswith(message) and result.stderr.count('\n') == 1
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize('args', [[], ['--count_ops=True']], ids=['timed', 'operators counted'])
def test_train_mode_refuses_the_2026_record_in_one_line_naming_what_times_it(args):
    """Its train mode compares model.py's losses; gpt2026.py's has its own loss and needs the record's schedule, which
    train.py runs: the card times it there."""
    result = run_script('bench.py', str(ROOT / 'config' / 'speedrun2026_gpt2_12gb.py'), '--device=cpu',
                        '--real_data=False', *args)
    assert result.returncode == 2 and result.stderr.count('\n') == 1
    assert result.stderr.startswith("error: bench.py's train mode times model.py's GPT with each --loss; model_file="
                                    "'gpt2026.py' is timed in train.py itself: python bench.py --mode=card ")
