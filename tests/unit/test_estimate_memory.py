"""estimate_memory.py in this process: its report, exit status, JSON and --find_batch_size, and one-line errors."""
import json

import pytest
import torch

from training import configurator
import estimate_memory
from training import rules
from training.memory import estimate as em, fit


GIB = 2 ** 30


def as_keys(config):
    """`config` as the keys estimate_memory.py reads (estimator_keys), each with its value as the default."""
    return {key: configurator.Key(value, 'a key') for key, value in config.items()}


def test_find_batch_size_cli_returns_a_fitting_batch_whose_double_does_not_fit(tiny, capsys, monkeypatch, trace_once):
    tiny = {**tiny, 'n_layer': 1, 'batch_size': 4, 'gradient_accumulation_steps': 32}  # 128 samples of 32 tokens a step

    def estimated_total(config, batch_size, checkpointing):  # warm-started, as the search traces (the same peak)
        config = fit.rebatched({**config, 'activation_checkpointing': checkpointing}, batch_size)
        return em.total_bytes(em.trace(config, evaluate=False, warm_start=True)['train']['peak_bytes'])

    budget_gb = (estimated_total(tiny, 8, False) + 1) / GIB
    monkeypatch.setattr(estimate_memory, 'estimator_keys', lambda: as_keys(tiny))
    # the card's memory less the headroom is the budget
    argv = ['--find_batch_size', '--json', f'--gpu_memory_gb={budget_gb + 0.25}', '--gpu_headroom_gb=0.25']
    with pytest.raises(SystemExit):
        estimate_memory.main(argv)
    result = json.loads(capsys.readouterr().out)
    assert result['budget_bytes'] == result['gpu_memory_bytes'] - GIB // 4 == int(budget_gb * GIB)
    config = estimate_memory.load_config(argv)  # the script's config: trace_once retraces none of its traces
    off, on = result['find_batch_size']
    assert off['largest_batch_size'] == 8 and on['largest_batch_size'] >= 8
    for choice in (off, on):
        largest, checkpointing = choice['largest_batch_size'], choice['activation_checkpointing']
        total = estimated_total(config, largest, checkpointing)
        assert choice['largest_total_bytes'] == total <= result['budget_bytes']
        assert estimated_total(config, 2 * largest, checkpointing) > result['budget_bytes']
        applied = passes_train_py_checks(tiny, choice['command'])  # what the report prints: train.py takes it
        assert (applied['batch_size'], applied['gradient_accumulation_steps'], applied['activation_checkpointing']) \
            == (choice['batch_size'], choice['gradient_accumulation_steps'], checkpointing)
        # the fewest micro-steps with micro-batches up to the largest, then the smallest micro-batch that keeps the
        # config's 128 samples per step with them
        accumulation = -(-128 // largest)
        assert choice['gradient_accumulation_steps'] == accumulation
        assert choice['batch_size'] == -(-128 // accumulation) <= largest
        assert choice['tokens_per_step'] == choice['batch_size'] * 32 * accumulation >= 128 * 32


@pytest.mark.parametrize('argv, named', [
    (['--batchsize=8'], '--batch_size'),
    (['--gpu_memory_gb=0.1'], 'gpu_memory_gb=0.1'),
    (['--loss=fused'], "loss 'fused'"),
    (['--gradient_accumulation_steps=3', '--world_size=2'], 'divisible by the 2 processes'),
    (['--init_from=gpt2', '--block_size=2048'], 'block_size=2048'),
    (['--init_from=gpt3'], "init_from 'gpt3'"),
    (['--measure'], 'CUDA is not available'),
    (['--fsdp_mixed_precision'], "parallelism='fsdp'"),
    (['--fsdp_mixed_precision', '--parallelism=fsdp', '--dtype=float32'], "dtype='float32'"),
    (['--eval_only=True', '--ladder'], '--ladder sizes the training step, which eval_only=True never runs'),
    (['--eval_only=True', '--find_batch_size'], '--find_batch_size sizes the training step'),
])
def test_bad_input_is_one_line_error(argv, named, capsys):
    if '--measure' in argv and torch.cuda.is_available():
        pytest.skip('CUDA is available here')
    with pytest.raises(SystemExit) as exit_info:
        estimate_memory.main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith('error: ') and err.count('\n') == 1 and named in err


def passes_train_py_checks(config, command):
    """`config` with the printed --key=value `command` applied, checked by train.py's own rules (training.rules) for
    its world_size on a GPU; the applied config."""
    applied = {**config, **command}
    rules.check_config(applied, applied['world_size'], 'cuda')
    return applied


def test_a_config_that_fits_needs_no_ladder(tiny, capsys, monkeypatch):
    monkeypatch.setattr(estimate_memory, 'estimator_keys', lambda: as_keys(tiny))
    with pytest.raises(SystemExit) as exit_info:
        estimate_memory.main(['--ladder', '--gpu_memory_gb=12'])
    assert exit_info.value.code == estimate_memory.FITS
    out = capsys.readouterr().out
    assert 'ladder: fits as configured, nothing to change' in out and 'add to your command' not in out


def test_headroom_is_left_free_and_shown(tiny):
    """A config whose total fits the card exactly fits with no headroom and not with the default's."""
    tiny = {**tiny, 'n_layer': 1, 'gradient_accumulation_steps': 1}  # the smallest trace: its figures do not matter
    result = fit.estimate({**tiny, 'gpu_headroom_gb': 0.0})
    needed = max(result['total_bytes'], result['eval_total_bytes'])
    card_gb = needed / GIB
    exact = {**tiny, 'gpu_memory_gb': card_gb}
    assert fit.estimate({**exact, 'gpu_headroom_gb': 0.0})['fits']
    leaving = fit.estimate(exact)
    assert not leaving['fits'] and leaving['headroom_bytes'] == int(tiny['gpu_headroom_gb'] * GIB) > 0
    assert ', 0.50 GiB of it left free: --gpu_headroom_gb), ' in estimate_memory.report(exact, leaving)


def test_exit_status_progress_and_json(tiny, capsys, monkeypatch):
    """0 when the config fits, 1 when it does not (so `estimate_memory.py ... && train.py ...` gates a launch), 2 for
    bad input; progress on stderr, so --json's stdout stays one JSON object."""
    tiny = {**tiny, 'n_layer': 1, 'gradient_accumulation_steps': 1}  # the smallest trace: its figures do not matter
    monkeypatch.setattr(estimate_memory, 'estimator_keys', lambda: as_keys(tiny))
    estimate = fit.estimate

    def noisy_estimate(*args, **kwargs):  # as a pretrained config prints its dropout note: not into the JSON
        print('overriding dropout rate to 0.0')
        return estimate(*args, **kwargs)
    monkeypatch.setattr(fit, 'estimate', noisy_estimate)
    for argv, status in ((['--gpu_memory_gb=12'], estimate_memory.FITS),
                         (['--gpu_memory_gb=1.1', '--batch_size=4096'], estimate_memory.DOES_NOT_FIT),
                         (['--gpu_memory_gb=1.1', '--eval_batch_size=8192'], estimate_memory.DOES_NOT_FIT),
                         (['--gpu_memory_gb=12', '--gpu_headroom_gb=-1'], estimate_memory.BAD_INPUT)):
        with pytest.raises(SystemExit) as exit_info:
            estimate_memory.main(['--json', *argv])
        assert exit_info.value.code == status, argv
        out, err = capsys.readouterr()
        if status != estimate_memory.BAD_INPUT:
            result = json.loads(out)
            assert result['fits'] == (status == estimate_memory.FITS)
            if '--eval_batch_size=8192' in argv:  # training fits, evaluation does not: does not fit
                assert result['total_bytes'] <= result['budget_bytes'] < result['eval_total_bytes']
            assert err.splitlines()[0] == 'overriding dropout rate to 0.0'  # on stderr, with the progress
            assert 'tracing training at micro-batch' in err.splitlines()[1]
    assert (estimate_memory.FITS, estimate_memory.DOES_NOT_FIT, estimate_memory.BAD_INPUT) == (0, 1, 2)


def test_eval_only_is_judged_by_its_evaluation_of_the_weights_alone(weighty, capsys, monkeypatch):
    """nanoGPT's eval configs (eval_only=True): train.py evaluates once and stops, so no gradient or AdamW moment
    ever exists. The verdict and exit status are the evaluation's, of the model as built, not of an evaluation
    traced after training steps, their state alive."""
    params = sum(p.numel() for p in em.build(weighty)[0].parameters())
    training = fit.estimate({**weighty, 'gpu_headroom_gb': 0.0})
    evaluating = fit.estimate({**weighty, 'eval_only': True, 'gpu_headroom_gb': 0.0})
    assert evaluating['train'] is None and evaluating['total_bytes'] is None
    assert training['eval']['peak_bytes'] - evaluating['eval']['peak_bytes'] >= 8 * params  # the two moments
    monkeypatch.setattr(estimate_memory, 'estimator_keys', lambda: as_keys({**weighty, 'eval_only': True}))
    for total, status in ((evaluating['eval_total_bytes'], estimate_memory.FITS),
                          (evaluating['eval_total_bytes'] - 2 ** 20, estimate_memory.DOES_NOT_FIT)):
        assert total < training['total_bytes']  # a training config on that card would not fit
        with pytest.raises(SystemExit) as exit_info:
            estimate_memory.main([f'--gpu_memory_gb={total / GIB}', '--gpu_headroom_gb=0'])
        out, err = capsys.readouterr()
        assert exit_info.value.code == status
        assert 'training: none, eval_only=True' in out and 'estimated training total' not in out
        assert ('verdict: fits' if status == estimate_memory.FITS else 'verdict: evaluation does NOT fit') in out
        assert 'eval_only: no training step to trace' in err


def test_a_dataset_not_prepared_here_is_estimated_with_gpt2s_vocabulary_and_says_so(tiny, tmp_path):
    """As train.py would build it without a meta.pkl; a prepared dataset (tiny's meta.pkl) has no such note."""
    tiny = {**tiny, 'n_layer': 1, 'gradient_accumulation_steps': 1}
    unprepared = {**tiny, 'dataset': 'shakespeare_char'}
    text = estimate_memory.report(unprepared, fit.estimate(unprepared))
    assert f"note: {tmp_path / 'shakespeare_char'} is not prepared here, so vocab_size 50,304 is GPT-2's" in text
    assert 'is not prepared here' not in estimate_memory.report(tiny, fit.estimate(tiny))


def test_estimate_memory_reports_muon(weighty):
    config = {**weighty, 'optim': 'muon'}
    text = estimate_memory.report(config, fit.estimate(config))
    assert "Muon for the blocks' matrices, fused AdamW for the rest" in text


def test_a_ladder_that_fits_only_without_the_headroom_says_so(tiny):
    """--ladder's last line where no rung fits: when the last rung fits the card's memory at micro-batch 1 but not
    what gpu_headroom_gb leaves of it, it names --gpu_headroom_gb=0; when it fits neither, the other fixes."""
    config = {**tiny, 'n_layer': 1, 'gradient_accumulation_steps': 1, 'gpu_memory_gb': 2.0}
    result = fit.estimate(config)  # 1.5 GiB of the card for the run, 0.5 left free
    rung = dict(rung='bf16 weights', cost='', levers={}, fits=False, skipped=None)
    for need_gb, last_line in ((1.65, 'ladder: no rung fits the 1.50 GiB that gpu_headroom_gb leaves, but the last, '
                                      'bf16 weights, needs 1.65 GiB at micro-batch 1: with nothing else on the GPU, '
                                      '--gpu_headroom_gb=0 fits it'),
                               (2.1, 'ladder: no rung fits this card: a smaller model or block_size, or several GPUs '
                                     '(fsdp)')):
        ladder = [dict(rung, batch_1_total_bytes=int(need_gb * GIB)), dict(rung, rung='skipped', skipped='refused')]
        text = estimate_memory.report(config, {**result, 'fits': False, 'ladder': ladder})
        assert text.splitlines()[-1] == last_line


def test_a_record_model_that_does_not_fit_is_told_what_applies_to_it(tiny):
    """gpt2026.py's training is the record's: not model.py's levers (activation checkpointing, fsdp), but rows of
    fewer tokens in more micro-steps."""
    config = {**tiny, 'n_layer': 1, 'gradient_accumulation_steps': 1, 'gpu_memory_gb': 2.0}
    result = fit.estimate(config)
    needed = result['budget_bytes'] + GIB
    over = {**result, 'fits': False, 'total_bytes': needed, 'needed_bytes': needed}
    ladder = [dict(rung='as configured', cost='', levers={}, fits=False, skipped=None, batch_1_total_bytes=3 * GIB)]
    for model_file, verdict, last in (
            ('model.py', 'try --find_batch_size, --activation_checkpointing=True or --ladder',
             ', or several GPUs (fsdp)'),
            ('gpt2026.py', "try a smaller --block_size, with more --gradient_accumulation_steps for the same tokens a "
                           "step (model.py's memory levers do not apply to gpt2026.py's record)", '')):
        lines = estimate_memory.report({**config, 'model_file': model_file}, {**over, 'ladder': ladder}).splitlines()
        assert [line for line in lines if line.startswith('verdict: ')][0].endswith(f'1.00 GiB over: {verdict}')
        assert lines[-1] == 'ladder: no rung fits this card: a smaller model or block_size' + last


def test_a_record_model_under_torchrun_is_told_its_optimizer_sums_the_gradients(tiny):
    """Not DDP's notes (its buckets, zero1 or fsdp to try): gpt2026.py's optimizer sums the gradients in place."""
    config = {**tiny, 'n_layer': 1, 'gradient_accumulation_steps': 2, 'world_size': 2}
    traced = fit.estimate({**config, 'world_size': 1})
    for parallelism in ('ddp', 'zero1'):
        result = {**traced, 'world_size': 2, 'parallelism': parallelism}
        assert estimate_memory.PARALLELISM_NOTES[parallelism] in estimate_memory.report(config, result).splitlines()
        lines = estimate_memory.report({**config, 'model_file': 'gpt2026.py'}, result).splitlines()
        assert estimate_memory.SUMMED_GRADIENTS_NOTES[parallelism] in lines
        assert estimate_memory.PARALLELISM_NOTES[parallelism] not in lines
