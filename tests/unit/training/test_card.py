"""training/card.py and its checks (training/card_checks.py): each check passes on the paths as they are and fails
where one path is broken (a window off by one in the kernel, a term dropped in the compiled model, the bf16 update
rounded to nearest); the hours, the report, and the run that keeps each figure as it comes and a stopped preset
without the rest. The measurements themselves run in tests/e2e/test_bench.py, on a CPU."""
import json
import math
import os

import pytest
import torch

import flash_varlen_on_a_cpu
import model as model_lib
import training.optim
from helpers import PATCHES
from training import card, card_checks
from training.card_measure import load_preset

SPEEDRUN_PATH = os.path.join('config', card.SPEEDRUN)


@pytest.fixture(scope='module')
def speedrun():
    """The speedrun preset's model at the CPU's scale: (config, model_args)."""
    config, _, model_args = load_preset(SPEEDRUN_PATH, tiny=True)
    return config, model_args


def assert_passes_away_from_uniform(check, vocab_size):
    """A verdict that can fail: the losses away from ln(V) (the zero-initialized head's), nonzero differences."""
    assert check['passed'], check
    assert abs(check['loss'] - math.log(vocab_size)) > 0.1 and abs(check['reference_loss'] - math.log(vocab_size)) > 0.1
    assert check['loss_difference'] <= card_checks.NOISE_MULTIPLE * check['loss_noise']
    assert 0 < check['gradient_difference'] <= card_checks.NOISE_MULTIPLE * check['gradient_noise']


def test_randomize_makes_the_zero_initialized_projections_and_head_count(speedrun):
    config, model_args = speedrun
    assert model_args['zero_init_proj']
    model = card_checks.check_model(config, model_args, 'cpu')
    for name, p in model.named_parameters():
        if p.dim() >= 2:
            assert p.std().item() == pytest.approx(p.shape[-1] ** -0.5, rel=0.2), name


def test_varlen_check_passes_on_the_kernels_stand_in_and_fails_with_a_window_off_by_one(speedrun, flash_kernel,
                                                                                        monkeypatch):
    config, model_args = speedrun
    check = card_checks.check_varlen(config, model_args, 'cpu', 'cpu')
    assert_passes_away_from_uniform(check, model_args['vocab_size'])
    window_mask = flash_varlen_on_a_cpu.window_mask # one more key on the left than the window holds
    monkeypatch.setattr(flash_varlen_on_a_cpu, 'window_mask', lambda n_q, n_k, max_k, causal, left, right: window_mask(
        n_q, n_k, max_k, causal, left + 1 if left >= 0 else left, right))
    broken = card_checks.check_varlen(config, model_args, 'cpu', 'cpu')
    assert not broken['passed']
    assert broken['gradient_difference'] > card_checks.NOISE_MULTIPLE * broken['gradient_noise']


def test_varlen_check_is_skipped_with_its_reason_where_the_kernel_does_not_run(speedrun, flash_kernel, monkeypatch):
    config, model_args = speedrun
    assert card_checks.check_varlen(config, dict(model_args, n_head=4, n_embd=40), 'cpu', 'cpu') == {  # heads of 10
        'skipped': 'the model does not run the kernel here (its GPU, head size or window)'}
    monkeypatch.setattr(card_checks, 'kernel_registered_on_cpu', lambda: False)  # a bare CPU: no stand-in
    assert card_checks.check_varlen(config, model_args, 'cpu', 'cpu') == {
        'skipped': "FlashAttention's kernel is CUDA only (the tests give a CPU stand-in)"}


def test_the_kernels_cpu_stand_in_is_seen_once_registered(flash_kernel):
    assert card_checks.kernel_registered_on_cpu()  # the fixture registered it; a bare CPU is the test above's


def test_bf16_weights_check_passes_with_stochastic_rounding_and_fails_rounded_to_nearest(speedrun, monkeypatch):
    config, model_args = speedrun
    check = card_checks.check_bf16_weights(config, model_args, 'cpu', 'cpu')
    assert_passes_away_from_uniform(check, model_args['vocab_size'])
    assert 0 < check['step_difference'] <= card_checks.NOISE_MULTIPLE * check['step_noise']
    assert check['bf16_losses'][-1] < check['bf16_losses'][0] - 0.1 # the steps train: the rounding has updates to lose
    monkeypatch.setattr(training.optim, '_store_bf16_stochastic', lambda dst, x: dst.copy_(x))
    broken = card_checks.check_bf16_weights(config, model_args, 'cpu', 'cpu')
    assert not broken['passed']
    assert broken['step_difference'] > card_checks.NOISE_MULTIPLE * broken['step_noise']


@pytest.mark.slow
def test_compiled_check_fails_where_the_compiled_model_drops_a_term(monkeypatch):
    """The MLP's output dropped where dynamo traces it, as a miscompilation would: eager keeps it. A one-layer GPT-2
    (the speedrun model passes compiled in test_bench.py's card run)."""
    config, _, model_args = load_preset(os.path.join('config', 'train_gpt2_4gb.py'), tiny=True)
    forward = model_lib.MLP.forward
    monkeypatch.setattr(model_lib.MLP, 'forward',
                        lambda self, x: forward(self, x) * (0.0 if torch.compiler.is_compiling() else 1.0))
    broken = card_checks.check_compiled(config, dict(model_args, n_layer=1), 'cpu', 'cpu')
    assert not broken['passed']
    assert broken['gradient_difference'] > card_checks.NOISE_MULTIPLE * broken['gradient_noise']


def gradients(a, b, c):
    """Three matrices' gradients, each judged on its own."""
    return {'a': torch.full((2, 2), a), 'b': torch.full((2, 2), b), 'c': torch.full((2, 2), c)}


def test_compare_fails_a_loss_or_any_gradient_beyond_its_noise():
    exact = (2.0, gradients(1.0, 1.0, 1.0))
    noisy = (2.002, gradients(1.01, 1.001, 1.002))  # relative noises 1e-2, 1e-3, 2e-3: the median 2e-3
    within = card_checks.compare((2.004, gradients(1.03, 1.007, 1.007)), noisy, noisy, exact)
    assert within['passed'] and within['loss_noise'] == pytest.approx(1e-3, rel=1e-4)
    far_c = card_checks.compare((2.002, gradients(1.01, 1.001, 1.0105)), noisy, noisy, exact)
    assert not far_c['passed'] and far_c['gradient_parameter'] == 'c'
    assert far_c['gradient_noise'] == pytest.approx(2e-3, rel=1e-4)
    far_loss = card_checks.compare((2.02, noisy[1]), noisy, noisy, exact)
    assert not far_loss['passed']


def test_a_gradient_whose_precisions_agree_by_chance_takes_the_median_noise():
    """b's bf16 and fp32 agree within 1e-4 (a scalar's cancelling sum, say): its tolerance is the median's, 2e-3."""
    exact = (2.0, gradients(1.0, 1.0, 1.0))
    noisy = (2.002, gradients(1.01, 1.0001, 1.002))
    within_median = card_checks.compare((2.002, gradients(1.01, 1.0079, 1.002)), noisy, noisy, exact)
    assert within_median['passed'] and within_median['gradient_noise'] == pytest.approx(2e-3, rel=1e-3)
    assert not card_checks.compare((2.002, gradients(1.01, 1.0081, 1.002)), noisy, noisy, exact)['passed']


def test_scalars_are_judged_together_so_one_bf16_scatter_passes_and_one_wrong_gradient_fails():
    """The H200's varlen check: the matrices within 1.1x their noise, one lambda at 5x its own (0.086 against
    0.0175) among others at or below theirs. Pooled, the lambdas pass; one of them wrong by half fails them."""
    exact = (2.0, {'w': torch.ones(2, 2), **{f'lambda{i}': torch.ones(1) for i in range(6)}})
    noises = [0.0175, 0.02, 0.01, 0.015, 0.012, 0.02]
    noisy = (2.0005, {'w': torch.full((2, 2), 1.01), **{f'lambda{i}': torch.full((1,), 1 + n)
                                                        for i, n in enumerate(noises)}})
    differences = [0.086, 0.01, 0.012, 0.005, 0.015, 0.01]
    scattered = {'w': torch.full((2, 2), 1.021), **{f'lambda{i}': torch.full((1,), 1 + n + d)
                                                    for i, (n, d) in enumerate(zip(noises, differences))}}
    check = card_checks.compare((2.0005, scattered), noisy, noisy, exact)
    assert check['passed'] and check['gradient_parameter'] == '6 scalars and vectors, pooled'
    assert check['gradients']['lambda0'] == pytest.approx([0.086, 0.0175], rel=1e-4)  # each kept for the report
    wrong = dict(scattered, lambda3=torch.full((1,), 1.5))
    broken = card_checks.compare((2.0005, wrong), noisy, noisy, exact)
    assert not broken['passed'] and broken['gradient_parameter'] == '6 scalars and vectors, pooled'


def test_unjudged_gradients_are_reported_and_pass():
    exact = (2.0, {'matrix': torch.ones(2, 2), 'scalar': torch.ones(1)})
    noisy = (2.002, {'matrix': torch.full((2, 2), 1.001), 'scalar': torch.full((1,), 1.001)})
    check = card_checks.compare((2.002, {'matrix': torch.full((2, 2), 1.001), 'scalar': torch.full((1,), 1.5)}),
                                noisy, noisy, exact, judged=lambda gradient: gradient.dim() >= 2)
    assert check['passed'] and check['unjudged_difference'] == pytest.approx(0.499, rel=1e-4)
    assert not card_checks.compare((2.002, {'matrix': torch.full((2, 2), 1.001), 'scalar': torch.full((1,), 1.5)}),
                                   noisy, noisy, exact)['passed']


def test_the_speedrun_preset_comes_first_and_only_card_presets_are_listed():
    names = [path.rsplit('/', 1)[-1] for path in card.preset_paths('config')]
    assert names[0] == card.SPEEDRUN
    assert 'speedrun_gpt2_8gb.py' in names and 'train_gpt2.py' not in names and 'eval_gpt2.py' not in names
    assert all(card.PRESET_PATTERN.search(name) for name in names)


def test_hours_of_training_and_of_evaluations_apart_and_summed():
    config = dict(max_iters=100, eval_interval=50, eval_iters=4, batch_size=8, eval_batch_size=2)
    hours = card.run_hours(config, dict(step_seconds=36.0, eval_micro_batch_seconds=1.5))
    # 100 steps of 36 s, and 3 evaluations (0, 50, 100) of 2 splits x 16 micro-batches of 1.5 s
    assert hours == dict(train_hours=1.0, eval_hours=3 * 2 * 16 * 1.5 / 3600, hours=1.0 + 3 * 2 * 16 * 1.5 / 3600)


NANOGPT_PATH = dict(micro_batch=[12, 1024], n_layer=12, n_embd=768, vocab_size=50304, dtype='bfloat16', eager_ratio=1.4,
                    compiled_ratio=0.98, ours_peak_bytes=2 ** 31, naive_peak_bytes=2 ** 32)


def fake_check(passed):
    return dict(passed=passed, loss=5.2, reference_loss=5.1, loss_difference=1e-4, loss_noise=2e-4,
                gradient_parameter='lm_head.weight', gradient_difference=3e-3, gradient_noise=1e-3,
                tolerance=card_checks.NOISE_MULTIPLE)


def test_the_report_gives_each_check_beside_its_noise_the_hours_and_why_a_preset_has_no_figures():
    result = dict(device='NVIDIA H100', torch='2.11', seconds=300.0, scaled_down=False, checks={
        'compiled against eager': fake_check(True), 'bf16 weights against fp32': fake_check(False),
        'varlen kernel against masked': dict(skipped='no kernel')},
        nanogpt_path=NANOGPT_PATH,
        presets=[dict(preset='train_gpt2_4gb.py', estimated_peak_bytes=2 * 2 ** 30, estimated_total_bytes=3 * 2 ** 30,
                      max_allocated_bytes=2 ** 31, max_reserved_bytes=2 ** 31 + 2 ** 29, compile_seconds=42.0,
                      step_seconds=0.5, eval_micro_batch_seconds=0.05, tokens_per_s=100000.0, mfu=0.4,
                      train_hours=1.5, eval_hours=0.25, hours=1.75, train_loop=dict(ok=True, seconds=30.0)),
                 dict(preset='finetune_gpt2large_8gb.py', estimated_peak_bytes=2 ** 32, estimated_total_bytes=2 ** 33,
                      stopped='stopped after 600 s (card_preset_seconds) while compiling'),
                 dict(preset='finetune_gpt2xl_8gb.py', skipped='over the 1800 s budget (card_seconds)')],
        speedrun=dict(tokens=917504000, train_hours=0.64, eval_hours=0.05, hours=0.69))
    lines = card.markdown(result).splitlines()
    assert lines[0] == '# NVIDIA H100'
    assert ('| compiled against eager | pass | 5.2000 (5.1000) | 1.0e-04 (noise 2.0e-04) | 3.0e-03 (noise 1.0e-03), '
            'lm_head.weight | 4x noise |') in lines
    assert any(line.startswith('| bf16 weights against fp32 | FAIL | ') for line in lines)
    assert '| varlen kernel against masked | skipped: no kernel | | | | |' in lines
    assert any(line.startswith("nanoGPT's path, config/train_gpt2.py: micro-batch 12 x 1024, 12 layers") and
               'eager 1.40x, compiled 0.98x; peak allocated GiB: ours 2.00, naive 4.00.' in line for line in lines)
    assert ('| train_gpt2_4gb.py | 2.00 (3.00) | 2.00 | 2.50 | 42.0 | 0.500 | 0.0500 | 100,000 | 40.0% | 1.50 + 0.25 '
            '| train.py: ok (30 s) |') in lines
    assert ('| finetune_gpt2large_8gb.py | 4.00 (8.00) | n/a | n/a | n/a | n/a | n/a | n/a | n/a | n/a + n/a '
            '| stopped after 600 s (card_preset_seconds) while compiling |') in lines
    assert any(line.startswith('| finetune_gpt2xl_8gb.py | n/a | ') and
               line.endswith('| skipped: over the 1800 s budget (card_seconds) |') for line in lines)
    assert lines[-1] == ('speedrun_gpt2_12gb.py: 917,504,000 tokens in 0.69 h at the measured rate: 0.64 h of training '
                         'steps and 0.05 h of loss evaluations (HellaSwag\'s not included).')


def test_run_keeps_each_figure_as_it_comes_and_a_stopped_preset_stops_only_itself(monkeypatch, tmp_path):
    """The children replaced: the checks, nanoGPT's path, a preset stopped at its limit, then one measured and its
    train.py loop. The report is written after each, and each preset's row printed as it ends."""
    def measured(job, seconds, progress):
        if job['kind'] == 'checks':
            return dict(device='a CPU', total_memory=None, checks={'compiled against eager': fake_check(True)})
        if job['kind'] == 'nanogpt_path':
            return NANOGPT_PATH
        if job['name'] == card.SPEEDRUN:
            return dict(stopped=f'stopped after {seconds} s (card_preset_seconds) while compiling')
        return dict(compile_seconds=1.0, step_seconds=0.1, eval_micro_batch_seconds=0.01, tokens_per_s=10.0, mfu=None)
    monkeypatch.setattr(card, 'measured', measured)
    monkeypatch.setattr(card, 'train_loop', lambda *args: dict(ok=True, seconds=2.0))
    kept, printed = [], []

    def keep(result):
        card.write_report(result, tmp_path / 'card')
        kept.append(json.loads((tmp_path / 'card.json').read_text()))
    result = card.run('cpu', 'cpu', [card.SPEEDRUN, 'train_gpt2_4gb.py'], preset_seconds=7, progress=printed.append,
                      keep=keep)
    assert kept[0]['device'] == 'a CPU' and list(kept[0]['checks']) == ['compiled against eager']
    assert kept[0]['nanogpt_path'] is None and kept[1]['nanogpt_path'] == NANOGPT_PATH
    assert [[row['preset'] for row in k['presets']] for k in kept[1:]] == [
        [], [card.SPEEDRUN], [card.SPEEDRUN, 'train_gpt2_4gb.py'], [card.SPEEDRUN, 'train_gpt2_4gb.py']]
    stopped, measured_row = result['presets']
    assert stopped['stopped'] == 'stopped after 7 s (card_preset_seconds) while compiling'
    assert 'train_loop' not in stopped and 'speedrun' not in result
    assert measured_row['train_loop'] == dict(ok=True, seconds=2.0) and measured_row['hours'] > 0
    rows = [line for line in printed if line.startswith('| ')]
    assert rows[0].startswith(f'| {card.SPEEDRUN} | ') and rows[1].startswith('| train_gpt2_4gb.py | ')
    assert (tmp_path / 'card.md').read_text() == card.markdown(result)
    plain = tmp_path / 'plain'  # the reports readable as any file the user writes: the umask's permissions
    plain.write_text('')
    assert {(tmp_path / f'card.{ext}').stat().st_mode for ext in ('md', 'json')} == {plain.stat().st_mode}
    assert sorted(path.name for path in tmp_path.iterdir()) == ['card.json', 'card.md', 'plain']  # no temporary left


def test_checks_stopped_at_their_limit_keep_the_ones_done_and_say_so(monkeypatch):
    stopped = dict(device='a CPU', total_memory=None, checks={'compiled against eager': fake_check(True)},
                   stopped='stopped after 7 s (card_preset_seconds) while varlen kernel against masked')
    monkeypatch.setattr(card, 'measured', lambda job, *args: stopped if job['kind'] == 'checks' else {})
    result = card.run('cpu', 'cpu', ['none.py'], preset_seconds=7, progress=lambda line: None)
    assert list(result['checks']) == ['compiled against eager']
    line = 'checks: stopped after 7 s (card_preset_seconds) while varlen kernel against masked'
    assert line in card.markdown(result).splitlines()


@pytest.mark.slow
def test_a_preset_hung_in_compilation_is_stopped_at_its_limit_with_its_phase(monkeypatch):
    """A child process whose torch.compile never returns (tests/patches/hung_compile.py) is ended at the preset's
    limit: the row says so, with the phase it was in, and the estimate made before it."""
    monkeypatch.setenv('PYTHONPATH', str(PATCHES))
    monkeypatch.setenv('TESTS_PATCHES', 'hung_compile')
    printed = []
    row = card.run_preset(SPEEDRUN_PATH, 'cpu', 'cpu', True, None, 1, 20, printed.append)
    assert row['stopped'] == 'stopped after 20 s (card_preset_seconds) while compiling'
    assert row['estimated_peak_bytes'] > 0 and 'step_seconds' not in row and 'train_loop' not in row
    assert f'{card.SPEEDRUN}: compiling' in printed


@pytest.mark.slow
def test_train_loop_says_which_run_failed_and_its_error_line():
    config, overrides, model_args = load_preset(SPEEDRUN_PATH, tiny=True)
    phases = []
    loop = card.train_loop(SPEEDRUN_PATH, config, dict(overrides, n_head=3), model_args, True, 120, phases.append)
    assert not loop['ok'] and loop['seconds'] > 0 and phases == [f'{card.SPEEDRUN}: train.py loop']
    assert loop['error'].startswith('train.py loop: ') and 'n_head' in loop['error'], loop
