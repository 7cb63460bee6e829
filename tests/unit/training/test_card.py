"""training/card.py and its checks (training/card_checks.py): each check passes on the paths as they are and fails
where one path is broken (a window off by one in the kernel, a term dropped in the compiled model, the bf16 update
rounded to nearest); the card's order, its fingerprints, and its runs with the children replaced: each part kept as it
ends, a second run measuring only what the first did not, never-measured parts first, then stopped, then stale ones,
a preset this machine lacks a library for skipped with that line. The slow tests run train.py itself: an out-of-memory
error at the evaluation is a FAIL row and the card goes on. The whole card runs in tests/e2e/test_bench.py, on a CPU."""
import json
import math
import os

import pytest
import torch

import flash_varlen_on_a_cpu
import model as model_lib
import training.optimizers
from helpers import PATCHES
from training import card, card_checks, card_train, rules
from training.card_measure import SPEEDRUN, load_preset
from training.card_report import STALE
from training.errors import ConfigError

SPEEDRUN_PATH = os.path.join('config', SPEEDRUN)
GIB = 2 ** 30


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
    monkeypatch.setattr(training.optimizers, '_store_bf16_stochastic', lambda dst, x: dst.copy_(x))
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


def test_the_speedrun_preset_comes_first_then_those_from_scratch_then_the_finetunes_12gb_and_smallest_first():
    """A short first pass reaches every preset that trains from scratch (the 12 GB ones first) before a finetune,
    whose pretrained GPT-2 (up to xl) takes the longest."""
    names = [os.path.basename(path) for path in card_train.preset_paths('config')]
    assert names[0] == SPEEDRUN and 'train_gpt2.py' not in names and 'eval_gpt2.py' not in names
    assert all(card_train.PRESET_PATTERN.search(name) for name in names)
    finetunes = [name for name in names if name.startswith('finetune_')]
    assert names[-len(finetunes):] == finetunes
    scratch = names[:-len(finetunes)]
    twelve = [name for name in scratch if name.endswith('_12gb.py')]
    assert scratch[:len(twelve)] == twelve
    assert twelve.index('train_shakespeare_char_12gb.py') < twelve.index('train_openwebtext_12gb.py')
    assert scratch.index('train_gpt2_6gb.py') < scratch.index('train_gpt2_4gb.py') < \
        scratch.index('speedrun_gpt2_8gb.py')  # 6 GB: no levers
    assert finetunes.index('finetune_shakespeare_12gb.py') < finetunes.index('finetune_gpt2xl_12gb.py') < \
        finetunes.index('finetune_gpt2large_8gb.py') < finetunes.index('finetune_shakespeare_24gb.py')


def test_card_presets_are_picked_by_name_with_or_without_py_and_an_unknown_one_is_one_line():
    paths = card_train.preset_paths('config')
    assert [os.path.basename(p) for p in card.selected(paths, ['train_gpt2_4gb', SPEEDRUN])] == [
        SPEEDRUN, 'train_gpt2_4gb.py']  # in the card's order
    assert card.selected(paths, []) == paths
    with pytest.raises(ConfigError, match=r"card_presets: train_gpt2_5gb.py is no card preset: use some of "
                                          r"speedrun_gpt2_12gb.py, "):
        card.selected(paths, ['train_gpt2_5gb'])


def test_a_fingerprint_follows_the_preset_file_and_the_training_code_but_not_the_cards_report(tmp_path, monkeypatch):
    preset = tmp_path / 'mine_12gb.py'
    preset.write_text('batch_size = 8\n')
    code = card.code_digest()
    first = card.fingerprint(code, 'preset', str(preset))
    assert card.fingerprint(code, 'preset', str(preset)) == first
    preset.write_text('batch_size = 4\n')
    assert card.fingerprint(code, 'preset', str(preset)) != first
    assert card.fingerprint('other code', 'preset', str(preset)) != card.fingerprint(code, 'preset', str(preset))
    read = []
    monkeypatch.setattr(card, 'digest', lambda paths, seed='': read.extend(paths))
    card.code_digest()
    assert {'train.py', 'model.py', 'training/attention.py', 'training/chunked_loss.py', 'training/step.py',
            'training/memory/estimate.py', 'training/phase_log.py'} <= set(read)
    assert not [path for path in read if os.path.basename(path).startswith('card')]  # the card's own: PART_FILES
    assert 'training/card_train.py' in card.PART_FILES['preset'] and 'training/card_checks.py' in \
        card.PART_FILES['checks']


NANOGPT_PATH = dict(micro_batch=[12, 1024], n_layer=12, n_embd=768, vocab_size=50304, dtype='bfloat16', eager_ratio=1.4,
                    compiled_ratio=0.98, ours_peak_bytes=2 ** 31, naive_peak_bytes=2 ** 32)
PROFILED = dict(micro_batch=[1, 8192], micro_steps=64, compiled=True, dtype='bfloat16', optim='muon', seconds=2.0,
                profiled_seconds=1.9, shares=dict(optimizer=0.1, attention=0.3, loss=0.05, matmul=0.4, other=0.15),
                top=[dict(name='sm90_xmma_gemm_bf16', category='matmul', seconds=0.5, share=0.26)])


def fake_check(passed):
    return dict(passed=passed, loss=5.2, reference_loss=5.1, loss_difference=1e-4, loss_noise=2e-4,
                gradient_parameter='lm_head.weight', gradient_difference=3e-3, gradient_noise=1e-3,
                tolerance=card_checks.NOISE_MULTIPLE)


def fitting_row(name, reserved=9):
    return dict(preset=name, card_gib=12, cap_bytes=11 * GIB, estimated_peak_bytes=8 * GIB,
                estimated_total_bytes=10 * GIB, estimate_fits=True, phase_reached='done', fits=True,
                max_allocated_bytes=8 * GIB, max_reserved_bytes=reserved * GIB, compile_seconds=40.0,
                resume_compile_seconds=5.0, step_seconds=0.5, eval_micro_batch_seconds=0.05, tokens_per_s=1e5,
                mfu=0.4, train_hours=1.5, eval_hours=0.25, hours=1.75, tokens=10 ** 9)


@pytest.fixture
def children(monkeypatch):
    """The card's children replaced: each part as measured, except those named in `stopped` (stopped at their limit)
    and the presets `lacks` names (skipped with its line). Returns (calls, stopped, lacks), what each run asked for
    in order, and the two lists a test fills."""
    calls, stopped, lacks, limits = [], [], {}, []

    def measured(job, limit, progress):
        limits.append(limit)
        kind = job['kind']
        calls.append(('checks', *job['checks']) if kind == 'checks' else kind)
        if kind == 'device':
            return dict(device='a CPU', total_memory=None, peak_flops=None, lacks=dict(lacks), phase='done')
        if kind in stopped:
            return dict(phase='timing', stopped=f'stopped after {limit[0]:.0f} s ({limit[1]}) while timing')
        if kind == 'checks':
            return dict(checks={name: fake_check(True) for name in job['checks']}, phase='done')
        return dict(NANOGPT_PATH if kind == 'nanogpt_path' else {SPEEDRUN: PROFILED, 'train_gpt2.py': PROFILED},
                    phase='done')

    def run_preset(path, device, device_type, steps, limit, facts, progress):
        name = os.path.basename(path)
        calls.append(name)
        if name in facts['lacks']:
            return dict(preset=name, card_gib=12, cap_bytes=None, skipped=facts['lacks'][name])
        if name in stopped:
            return dict(preset=name, card_gib=12, cap_bytes=11 * GIB, phase_reached='step', fits=None,
                        stopped=f'stopped after {limit[0]:.0f} s ({limit[1]}) while step')
        return fitting_row(name)
    monkeypatch.setattr(card, 'measured', measured)
    monkeypatch.setattr(card, 'run_preset', run_preset)
    return calls, stopped, lacks, limits


CHECK_NAMES = tuple(name for name, _ in card_checks.CHECKS)


def test_a_second_run_with_the_same_report_measures_only_what_the_first_did_not(children, tmp_path, monkeypatch):
    calls, *_ = children
    report, lines = tmp_path / 'card', []
    monkeypatch.chdir(tmp_path)  # the project's presets are found from any directory
    first = card.run('cpu', 'cpu', [SPEEDRUN], report=report, progress=lines.append)
    assert calls == ['device', ('checks', *CHECK_NAMES), SPEEDRUN, 'nanogpt_path', 'profile']
    assert json.loads((tmp_path / 'card.json').read_text()) == first  # written after the last part too
    assert [row['preset'] for row in first['presets']] == [SPEEDRUN] and first['presets'][0]['fingerprint']
    assert first['profile']['fingerprint'] and all(check['fingerprint'] for check in first['checks'].values())
    assert any(line.startswith(f'| {SPEEDRUN} | 12 GB | 11.00 | ') for line in lines)  # each row printed as it ends
    calls.clear()
    second = card.run('cpu', 'cpu', [SPEEDRUN, 'train_gpt2_4gb.py'], report=report, progress=lines.append)
    assert calls == ['device', 'train_gpt2_4gb.py']
    assert [run['measured'] for run in second['runs']] == [
        [f"checks: {', '.join(CHECK_NAMES)}", SPEEDRUN, "nanoGPT's path", 'profile'], ['train_gpt2_4gb.py']]
    calls.clear()
    card.run('cpu', 'cpu', [SPEEDRUN, 'train_gpt2_4gb.py'], report=report, progress=lines.append)
    assert calls == ['device']


def test_never_measured_parts_come_first_then_stopped_ones_then_stale_ones(children, tmp_path):
    calls, stopped, _, _ = children
    report = tmp_path / 'card'
    stopped.append('train_gpt2_4gb.py')
    card.run('cpu', 'cpu', [SPEEDRUN, 'train_gpt2_4gb.py'], report=report, progress=lambda line: None)
    saved = json.loads((tmp_path / 'card.json').read_text())
    assert 'fingerprint' not in saved['presets'][1] and saved['presets'][1]['stopped'].endswith(' while step')
    saved['presets'][0]['fingerprint'] = 'made by other code'
    saved['nanogpt_path'].pop('fingerprint')  # an earlier card's: no fingerprint, so stale too
    (tmp_path / 'card.json').write_text(json.dumps(saved))
    stopped.clear()
    calls.clear()
    waiting = card.run('cpu', 'cpu', [SPEEDRUN, 'train_gpt2_4gb.py', 'train_gpt2_6gb.py'], seconds=0, report=report,
                       progress=lambda line: None)  # no time: nothing measured, the order said
    assert calls == ['device'] and waiting['runs'][-1]['left'] == [
        'train_gpt2_6gb.py', 'train_gpt2_4gb.py', SPEEDRUN, "nanoGPT's path"]
    assert waiting['presets'][0]['stale'] and STALE in (tmp_path / 'card.md').read_text()
    calls.clear()
    done = card.run('cpu', 'cpu', [SPEEDRUN, 'train_gpt2_4gb.py', 'train_gpt2_6gb.py'], report=report,
                    progress=lambda line: None)
    assert calls == ['device', 'train_gpt2_6gb.py', 'train_gpt2_4gb.py', SPEEDRUN, 'nanogpt_path']
    assert [row['preset'] for row in done['presets']] == [SPEEDRUN, 'train_gpt2_6gb.py', 'train_gpt2_4gb.py']
    assert not any('stale' in row for row in done['presets']) and STALE not in (tmp_path / 'card.md').read_text()


def test_a_stale_part_whose_attempt_failed_comes_with_the_never_measured_ones_and_a_fail_stays_stale(children,
                                                                                                     tmp_path):
    """A part that failed (an error) has nothing to keep: once the code changed, it goes first, with the parts never
    measured; an out-of-memory FAIL is a result, stale like the others; with the same code a failed part stands."""
    report = tmp_path / 'card'
    card.run('cpu', 'cpu', [SPEEDRUN, 'train_gpt2_4gb.py'], report=report, progress=lambda line: None)
    saved = json.loads((tmp_path / 'card.json').read_text())
    speedrun, fail = saved['presets']
    speedrun.update(phase_reached='starting', fits=None, error='ValueError: Expected a torch.device with a specified '
                                                              'index or an integer, but got:cuda')
    fail.update(phase_reached='evaluation', fits=False, error='torch.OutOfMemoryError: CUDA out of memory.',
                fingerprint='made by other code')
    saved['profile']['fingerprint'] = 'made by other code'
    (tmp_path / 'card.json').write_text(json.dumps(saved))
    paths = [SPEEDRUN, 'train_gpt2_4gb.py', 'train_gpt2_6gb.py']
    waiting = card.run('cpu', 'cpu', paths, seconds=0, report=report, progress=lambda line: None)
    assert waiting['runs'][-1]['left'] == ['train_gpt2_6gb.py', 'train_gpt2_4gb.py', 'profile']  # the error: current
    speedrun['fingerprint'] = 'made by other code'
    (tmp_path / 'card.json').write_text(json.dumps(saved))
    waiting = card.run('cpu', 'cpu', paths, seconds=0, report=report, progress=lambda line: None)
    assert waiting['runs'][-1]['left'] == [SPEEDRUN, 'train_gpt2_6gb.py', 'train_gpt2_4gb.py', 'profile']


def test_a_stale_result_stays_where_its_new_attempt_is_stopped_and_the_card_ends_at_card_seconds(children, tmp_path):
    calls, stopped, _, limits = children
    report = tmp_path / 'card'
    card.run('cpu', 'cpu', [SPEEDRUN], report=report, progress=lambda line: None)
    saved = json.loads((tmp_path / 'card.json').read_text())
    saved['profile']['fingerprint'] = 'made by other code'
    (tmp_path / 'card.json').write_text(json.dumps(saved))
    stopped.append('profile')
    limits.clear()
    result = card.run('cpu', 'cpu', [SPEEDRUN], seconds=100, part_seconds=600, report=report,
                      progress=lambda line: None)
    assert limits[-1][1] == 'card_seconds' and limits[-1][0] <= 100  # the card's end comes before the part's limit
    assert result['profile'][SPEEDRUN] == PROFILED and result['profile']['stale']
    assert result['profile']['last_attempt'].startswith('stopped after ') and \
        result['profile']['last_attempt'].endswith('(card_seconds) while timing')


def test_an_earlier_result_stays_where_a_new_attempt_measured_nothing_and_only_a_result_does():
    old = dict(fitting_row(SPEEDRUN), fingerprint='made by other code', stale=True)
    stopped = dict(preset=SPEEDRUN, stopped='stopped after 9 s (card_seconds) while step')
    assert card.kept(old, stopped) == dict(old, last_attempt='stopped after 9 s (card_seconds) while step')
    assert card.kept(old, dict(preset=SPEEDRUN, skipped='needs torchao'))['last_attempt'] == 'skipped: needs torchao'
    failed = dict(preset=SPEEDRUN, fits=False, phase_reached='step', error='out of memory', fingerprint='new')
    assert card.kept(old, failed) is failed
    assert card.kept(dict(preset=SPEEDRUN, skipped='needs torchao'), stopped) is stopped  # a skip is no result


def test_a_preset_this_machine_lacks_a_library_for_is_skipped_with_that_line_and_measured_once_it_has_it(children,
                                                                                                         tmp_path):
    calls, _, lacks, _ = children
    report = tmp_path / 'card'
    lacks['finetune_gpt2xl_12gb.py'] = "optim='adamw_8bit' needs torchao (No module named 'torchao'): pip install"
    skipped = card.run('cpu', 'cpu', ['finetune_gpt2xl_12gb.py'], report=report, progress=lambda line: None)
    assert skipped['presets'] == [dict(preset='finetune_gpt2xl_12gb.py', card_gib=12, cap_bytes=None,
                                       skipped=lacks['finetune_gpt2xl_12gb.py'])]
    assert f"| skipped: {lacks['finetune_gpt2xl_12gb.py']} |" in (tmp_path / 'card.md').read_text()
    lacks.clear()
    calls.clear()
    measured = card.run('cpu', 'cpu', ['finetune_gpt2xl_12gb.py'], report=report, progress=lambda line: None)
    assert calls == ['device', 'finetune_gpt2xl_12gb.py'] and measured['presets'][0]['fits']


def test_the_checks_stopped_at_their_limit_keep_the_ones_done_and_the_rest_run_next_time(children, monkeypatch,
                                                                                         tmp_path):
    calls, *_ = children
    fake = card.measured
    first, running, *rest = CHECK_NAMES

    def measured(job, limit, progress):
        if job['kind'] != 'checks':
            return fake(job, limit, progress)
        calls.append(('checks', *job['checks']))
        return dict(checks={first: fake_check(True)}, phase=running,
                    stopped=f'stopped after 7 s (card_preset_seconds) while {running}')
    monkeypatch.setattr(card, 'measured', measured)
    result = card.run('cpu', 'cpu', [SPEEDRUN], part_seconds=7, report=tmp_path / 'card', progress=lambda line: None)
    assert list(result['checks']) == [first, running] and result['checks'][first]['fingerprint']
    assert result['checks'][running] == {'stopped': f'stopped after 7 s (card_preset_seconds) while {running}'}
    assert f'| {running} | stopped after 7 s (card_preset_seconds) while {running} | | | | |' in \
        (tmp_path / 'card.md').read_text()
    monkeypatch.setattr(card, 'measured', fake)
    calls.clear()
    card.run('cpu', 'cpu', [SPEEDRUN], report=tmp_path / 'card', progress=lambda line: None)
    assert calls == ['device', *([('checks', *rest)] if rest else []), ('checks', running)]  # never measured first


def test_a_report_of_another_gpu_or_torch_is_refused_in_one_line(children, tmp_path):
    (tmp_path / 'card.json').write_text(json.dumps(dict(device='NVIDIA H200', torch='2.11.0+cu130', presets=[])))
    version = torch.__version__.split('+')[0]
    with pytest.raises(ConfigError, match=rf"card_report={tmp_path / 'card'} is the report of NVIDIA H200 with torch "
                                          rf"2.11.0\+cu130, not of this a CPU with torch {version}"):
        card.run('cpu', 'cpu', [SPEEDRUN], report=tmp_path / 'card', progress=lambda line: None)
    (tmp_path / 'card.json').write_text('{"device": ')
    with pytest.raises(ConfigError, match=r'card\.json cannot be read as a card report \(.*\): name another path'):
        card.run('cpu', 'cpu', [SPEEDRUN], report=tmp_path / 'card', progress=lambda line: None)


@pytest.fixture
def only_presets(monkeypatch):
    """The card's children but the presets' train.py runs replaced (the device a CPU, the other parts measured)."""
    def measured(job, limit, progress):
        if job['kind'] == 'device':
            return dict(device='a CPU', total_memory=None, peak_flops=None, lacks={}, phase='done')
        if job['kind'] == 'checks':
            return dict(checks={name: fake_check(True) for name in job['checks']}, phase='done')
        return dict(NANOGPT_PATH if job['kind'] == 'nanogpt_path' else {SPEEDRUN: PROFILED}, phase='done')
    monkeypatch.setattr(card, 'measured', measured)
    monkeypatch.setenv('PYTHONPATH', str(PATCHES))


@pytest.mark.slow
def test_an_out_of_memory_error_at_the_evaluation_is_a_fail_row_naming_it_and_the_card_goes_on(only_presets,
                                                                                               monkeypatch, tmp_path):
    """train.py's first evaluation raises CUDA's out-of-memory error (tests/patches/forward_fault.py) in each preset:
    each row is a FAIL at the evaluation, with train.py's line, and the card measures the next preset."""
    monkeypatch.setenv('TESTS_PATCHES', 'forward_fault')
    monkeypatch.setenv('FORWARD_FAULT', 'oom evaluation 1')
    result = card.run('cpu', 'cpu', [SPEEDRUN, 'train_gpt2_4gb.py'], report=tmp_path / 'card',
                      progress=lambda line: None)
    assert [row['preset'] for row in result['presets']] == [SPEEDRUN, 'train_gpt2_4gb.py']
    for row in result['presets']:
        assert row['fits'] is False and row['phase_reached'] == 'evaluation', row
        assert row['error'].startswith('error: out of memory during evaluation at micro-batch 2.')
        assert row['estimated_peak_bytes'] > 0 and 'step_seconds' not in row and row['fingerprint']
    assert '| FAIL at evaluation: error: out of memory during evaluation at micro-batch 2. |' in \
        (tmp_path / 'card.md').read_text()


@pytest.mark.slow
def test_a_failing_step_is_an_error_row_at_the_step_not_a_fail(only_presets, monkeypatch, tmp_path):
    monkeypatch.setenv('TESTS_PATCHES', 'forward_fault')
    monkeypatch.setenv('FORWARD_FAULT', 'nan training 1')
    [row] = card.run('cpu', 'cpu', ['train_gpt2_4gb.py'], report=tmp_path / 'card', progress=lambda line: None)[
        'presets']
    assert row['fits'] is None and row['phase_reached'] == 'step'
    assert row['error'].startswith('error: the training loss is nan at iter 0'), row


@pytest.mark.slow
def test_a_check_hung_in_compilation_is_stopped_at_its_limit_with_its_phase(monkeypatch):
    """A child process whose torch.compile never returns (tests/patches/hung_compile.py) is ended at its limit: the
    result says so, with the check it was in."""
    monkeypatch.setenv('PYTHONPATH', str(PATCHES))
    monkeypatch.setenv('TESTS_PATCHES', 'hung_compile')
    printed = []
    job = dict(kind='checks', name='check', checks=['compiled against eager'], path=os.path.abspath(SPEEDRUN_PATH),
               device='cpu', device_type='cpu', tiny=True)
    row = card.measured(job, (20, 'card_preset_seconds'), printed.append)
    assert row['stopped'] == 'stopped after 20 s (card_preset_seconds) while compiled against eager'
    assert row['phase'] == 'compiled against eager' and 'check: compiled against eager' in printed


def test_a_preset_s_lever_the_card_turns_off_takes_its_dependent_keys_with_it(tmp_path):
    """The card runs a preset without HellaSwag (synthetic tokens); a preset that scores some examples would leave
    hellaswag_examples inert, which train.py refuses: the card's overrides set it back to its default too. And its
    tiny warmup start applies only where the preset warms its window up."""
    preset = tmp_path / 'scored_12gb.py'
    preset.write_text("hellaswag = True\nhellaswag_examples = 500\n")
    config, overrides, _ = load_preset(str(preset), tiny=True)
    assert overrides['hellaswag'] is False and overrides['hellaswag_examples'] == config['hellaswag_examples'] == 0
    assert config['attn_window_warmup_start'] == 64  # train.py's: no warmup here
    rules.check_config(config, 1, 'cpu')
    warmed, _, _ = load_preset(SPEEDRUN_PATH, tiny=True)
    assert warmed['attn_window_warmup_start'] == 16  # TINY's, where the speedrun preset warms its window up
    preset.write_text("hellaswag_examples = 500\n")  # the preset's own mistake: train.py refuses it, so does the card
    config, overrides, _ = load_preset(str(preset), tiny=True)
    assert 'hellaswag_examples' not in overrides and config['hellaswag_examples'] == 500
    with pytest.raises(ConfigError, match='hellaswag_examples=500 acts only with hellaswag=True'):
        rules.check_config(config, 1, 'cpu')
