"""training/card_train.py: a preset's train.py runs for the card. The cap from the card a preset names, the runs'
arguments, the preset's model (a pretrained one's shape from scratch), and the figures read from the two runs' phase
logs: step, evaluation, checkpoint and compile times, peak memory, how far they got and whether they fit. The runs
themselves: test_card.py's slow tests and tests/e2e/test_bench.py."""
import math

import numpy as np
import pytest
import torch

from model import GPT, GPTConfig
from training import card_train, record2026, rules
from training.card_measure import TINY, load_preset
from training.card_train import Run
from training.device import memory_fraction

GIB = 2 ** 30


def test_the_cap_is_the_card_less_its_headroom_and_the_cuda_context_and_its_share_of_a_larger_gpu():
    cap = card_train.cap_bytes({'gpu_headroom_gb': 0.5}, 12)
    assert cap == 11 * GIB  # 12 GiB less 0.5 for other programs and 0.5 for the context outside the allocator
    assert memory_fraction(cap, 140 * GIB) == pytest.approx(11 / 140)
    tight = card_train.cap_bytes({'gpu_headroom_gb': 0.1}, 8)  # finetune_gpt2xl_8gb's own headroom
    assert tight == pytest.approx(7.4 * GIB, abs=1)
    assert card_train.card_gib('config/finetune_shakespeare_24gb.py') == 24


def test_a_pretrained_preset_runs_from_scratch_in_its_models_shape():
    """No weights to download: GPT-2 XL's shape and vocabulary, which the memory and time are the same for."""
    config, overrides, model_args = load_preset('config/finetune_gpt2xl_12gb.py', tiny=False)
    assert overrides['init_from'] == 'scratch' and config['init_from'] == 'scratch'
    assert {key: overrides[key] for key in ('n_layer', 'n_head', 'n_embd', 'bias')} == dict(
        n_layer=48, n_head=25, n_embd=1600, bias=True)
    assert model_args['vocab_size'] == 50257 and model_args['n_layer'] == 48
    _, _, tiny_args = load_preset('config/finetune_gpt2xl_12gb.py', tiny=True)
    assert (tiny_args['n_layer'], tiny_args['vocab_size'], tiny_args['bias']) == (TINY['n_layer'], TINY['vocab_size'],
                                                                                  True)


def test_the_2026_record_preset_is_scaled_down_at_its_11_layers_which_train_py_takes():
    """gpt2026.py's model has the record's depth alone: TINY's 2 layers would make train.py refuse the preset, and
    the card on a CPU skip it."""
    config, overrides, _ = load_preset('config/speedrun2026_gpt2_12gb.py', tiny=True)
    assert 'n_layer' not in overrides and config['n_layer'] == 11 and config['n_embd'] == TINY['n_embd']
    rules.check_config(config, 1, 'cpu')


def test_the_runs_evaluate_a_whole_evaluation_micro_batch_at_the_last_of_their_steps(tmp_path):
    config, overrides, _ = load_preset('config/train_openwebtext_12gb.py', tiny=False)
    args = card_train.train_args('config/train_openwebtext_12gb.py', overrides, str(tmp_path), config, 3, 'cuda',
                                 11 * GIB, True)
    assert {'--max_iters=3', '--eval_interval=3', '--eval_iters=2', '--memory_cap_gb=11.0', '--compile=True',
            '--always_save_checkpoint=True', '--dataset=synthetic', f'--data_dir={tmp_path}'} <= set(args)
    assert config['eval_batch_size'] == 2 * config['batch_size']  # 2 x 8 windows: one micro-batch of 16 rows


def test_synthetic_data_holds_the_runs_windows_in_the_models_vocabulary(tmp_path):
    config, _, model_args = load_preset('config/train_shakespeare_char_12gb.py', tiny=True)
    card_train.write_synthetic_data(str(tmp_path / 'synthetic'), config, model_args, 3)
    tokens = np.fromfile(tmp_path / 'synthetic' / 'train.bin', dtype=np.uint16)
    assert len(tokens) > 5 * config['batch_size'] * config['block_size'] and tokens.max() < TINY['vocab_size']
    assert (tmp_path / 'synthetic' / 'meta.pkl').is_file()  # TINY's vocabulary is not GPT-2's


def log(*phases):
    """A phase log from (phase, iteration, seconds[, max allocated GiB]) tuples."""
    return [dict(phase=phase, iter=it, seconds=seconds,
                 **({'max_allocated_bytes': rest[0] * GIB, 'max_reserved_bytes': (rest[0] + 1) * GIB} if rest else {}))
            for phase, it, seconds, *rest in phases]


FIRST = log(('build', None, 0.0), ('evaluation', 0, 1.0), ('step', 0, 31.0), ('step', 1, 61.0, 5),
            ('step', 2, 63.0, 6), ('evaluation', 3, 65.0, 6), ('checkpoint', 3, 65.5, 6), ('step', 3, 66.5, 6),
            ('done', 4, 68.5, 6))
RESUMED = log(('resume', None, 0.0), ('evaluation', 3, 10.0, 3), ('checkpoint', 3, 15.0, 4), ('step', 3, 16.0, 4),
              ('done', 4, 21.0, 7))


def test_the_figures_come_from_the_phase_logs_compilation_beyond_the_steady_step_and_evaluation():
    """Steps of 30 s (compiling), then 2 s; evaluations of 30 s, then 0.5 s; the resumed run's first of each 5 s."""
    config, _, model_args = load_preset('config/speedrun_gpt2_12gb.py', tiny=False)
    runs = [Run(0, '', None, FIRST), Run(0, '', None, RESUMED)]
    figures = card_train.figures(config, model_args, runs, 989e12, compiled=True)
    assert figures['step_seconds'] == 2.0 and figures['eval_seconds'] == 0.5
    assert figures['checkpoint_seconds'] == 1.0 and figures['resume_seconds'] == 10.0
    assert figures['compile_seconds'] == (30 - 2) + (30 - 0.5)
    assert figures['resume_compile_seconds'] == (5 - 2) + (5 - 0.5)
    tokens = 1 * 8192 * 64
    assert figures['tokens_per_s'] == tokens / 2.0 and figures['tokens'] == 1390 * tokens
    with torch.device('meta'):
        model = GPT(GPTConfig(**model_args))
    assert figures['mfu'] == model.estimate_mfu(64, 2.0, 989e12, 128)  # the window of the first steps
    assert figures['eval_micro_batch_seconds'] == 0.5 / 2  # one micro-batch of eval_batch_size rows a split
    assert figures['train_hours'] == pytest.approx(1390 * 2.0 / 3600)
    assert card_train.figures(config, model_args, runs, None, compiled=False)['mfu'] is None
    assert 'compile_seconds' not in card_train.figures(config, model_args, runs, None, compiled=False)


def test_the_figures_of_the_2026_record_follow_its_growing_batch():
    """gpt2026.py's run: its micro-steps grow with the record's batch (x1, x2, x3 over the run), so its tokens and
    training hours are the sum over its iterations, at the timed steps' (the first stage's) rate; its MFU its run's."""
    config, _, model_args = load_preset('config/speedrun2026_gpt2_12gb.py', tiny=False)
    runs = [Run(0, '', None, FIRST), Run(0, '', None, RESUMED)]
    figures = card_train.figures(config, model_args, runs, 989e12, compiled=True)
    timed = config['gradient_accumulation_steps']  # the first stage's micro-steps
    micro_steps = sum(record2026.batch_size_at(it) // record2026.BATCH_SIZES[0] * timed
                      for it in range(config['max_iters']))
    row_tokens = config['batch_size'] * config['block_size']
    assert figures['tokens'] == row_tokens * micro_steps > config['max_iters'] * row_tokens * timed
    assert figures['tokens_per_s'] == row_tokens * timed / 2.0
    assert figures['train_hours'] == pytest.approx(micro_steps / timed * 2.0 / 3600)
    assert 0 < figures['mfu'] < 1


@pytest.mark.parametrize('runs, phase', [
    ([Run(2, 'error: n_head', None, [])], 'starting'),
    ([Run(None, '', None, FIRST[:3])], 'step'),
    ([Run(0, '', None, FIRST), Run(2, '', None, [])], 'resume'),
    ([Run(0, '', None, FIRST), Run(2, '', None, RESUMED[:1])], 'resume'),
    ([Run(0, '', None, FIRST), Run(2, '', None, RESUMED[:3])], 'checkpoint after resume'),
    ([Run(0, '', None, FIRST), Run(0, '', None, RESUMED)], 'done'),
])
def test_the_phase_reached_is_the_last_one_begun_a_resumed_runs_named_so(runs, phase):
    assert card_train.phase_reached(runs) == phase


def test_an_out_of_memory_error_is_a_fail_a_stop_or_another_error_is_not_nor_a_cap_that_did_not_hold():
    oom = 'error: out of memory during evaluation at micro-batch 16.'
    limit = (600, 'card_preset_seconds')
    failed = card_train.outcome([Run(2, 'next step: --eval_batch_size=8', oom, FIRST[:6])], limit, 11 * GIB)
    assert failed == dict(phase_reached='evaluation', fits=False, error=oom, max_allocated_bytes=6 * GIB,
                          max_reserved_bytes=7 * GIB)
    stopped = card_train.outcome([Run(None, '', None, FIRST[:3])], limit, 11 * GIB)
    assert stopped['fits'] is None and stopped['stopped'] == 'stopped after 600 s (card_preset_seconds) while step'
    crashed = card_train.outcome([Run(1, 'RuntimeError: CUDA error', None, FIRST[:4])], limit, 11 * GIB)
    assert crashed['fits'] is None and crashed['error'] == 'RuntimeError: CUDA error'
    both = [Run(0, '', None, FIRST), Run(0, '', None, RESUMED)]
    assert card_train.outcome(both, limit, 11 * GIB)['fits'] is True
    assert card_train.outcome(both, limit, 11 * GIB)['max_allocated_bytes'] == 7 * GIB  # the largest of both runs
    assert card_train.outcome(both, limit, None)['fits'] is None  # a CPU: no cap to fit
    beyond = card_train.outcome(both, limit, 7 * GIB)  # 8 GiB reserved: an allocator that ignored its cap
    assert beyond['fits'] is None and beyond['error'] == ('the allocator reserved 8.00 GiB, beyond the cap of 7.00 '
                                                          'GiB: the cap did not hold')


def test_hours_of_training_and_of_evaluations_apart_and_summed():
    config = dict(max_iters=100, eval_interval=50, eval_iters=4, batch_size=8, eval_batch_size=2)
    hours = card_train.run_hours(config, dict(step_seconds=36.0, eval_micro_batch_seconds=1.5), config['max_iters'])
    # 100 steps of 36 s, and 3 evaluations (0, 50, 100) of 2 splits x 16 micro-batches of 1.5 s
    assert hours == dict(train_hours=1.0, eval_hours=3 * 2 * 16 * 1.5 / 3600, hours=1.0 + 3 * 2 * 16 * 1.5 / 3600)
    assert math.isclose(hours['eval_hours'], 0.04)
