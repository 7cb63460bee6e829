"""training/card.py's arithmetic and report: the hours to a budget, the presets' order, the checks' verdicts (the
measurements themselves run in tests/e2e/test_bench.py, on a CPU)."""
from training import card


def test_the_speedrun_preset_comes_first_and_only_card_presets_are_listed():
    names = [path.rsplit('/', 1)[-1] for path in card.preset_paths('config')]
    assert names[0] == card.SPEEDRUN
    assert 'speedrun_gpt2_8gb.py' in names and 'train_gpt2.py' not in names and 'eval_gpt2.py' not in names
    assert all(card.PRESET_PATTERN.search(name) for name in names)


def test_hours_count_every_step_and_every_evaluation():
    config = dict(max_iters=100, eval_interval=50, eval_iters=4, batch_size=8, eval_batch_size=2)
    measured = dict(step_seconds=36.0, eval_micro_batch_seconds=1.5)
    # 100 steps of 36 s, and 3 evaluations (0, 50, 100) of 2 splits x 16 micro-batches of 1.5 s
    assert card.hours_to_budget(config, measured) == (100 * 36 + 3 * 2 * 16 * 1.5) / 3600


def test_the_report_fails_a_check_outside_its_tolerance_and_lists_skipped_presets():
    result = dict(device='NVIDIA H100', torch='2.11', seconds=300.0, scaled_down=False, checks={
        'compiled against eager': dict(difference=1e-3, tolerance=card.BF16_TOLERANCE),
        'varlen kernel against masked': dict(difference=1e-3, gradient_difference=0.2, tolerance=card.BF16_TOLERANCE)},
        presets=[dict(preset='train_gpt2_4gb.py', estimated_peak_bytes=2 * 2 ** 30, estimated_total_bytes=3 * 2 ** 30,
                      max_allocated_bytes=2 ** 31, max_reserved_bytes=2 ** 31 + 2 ** 29, step_seconds=0.5,
                      tokens_per_s=100000.0, mfu=0.4),
                 dict(preset='finetune_gpt2xl_8gb.py', skipped='over the 420 s budget')],
        speedrun_tokens=917504000, speedrun_hours=1.25)
    lines = card.markdown(result).splitlines()
    assert lines[0] == '# NVIDIA H100'
    assert '| compiled against eager | pass | 1.00e-03 | 0.02 |' in lines
    assert '| varlen kernel against masked | FAIL | 1.00e-03, gradients 2.00e-01 | 0.02 |' in lines
    assert '| train_gpt2_4gb.py | 2.00 (3.00) | 2.00 | 2.50 | 0.500 | 100,000 | 40.0% |' in lines
    assert '| finetune_gpt2xl_8gb.py | n/a | skipped: over the 420 s budget | | | | |' in lines
    assert lines[-1].startswith('speedrun_gpt2_12gb.py: 917,504,000 tokens in 1.25 h at the measured rate')
