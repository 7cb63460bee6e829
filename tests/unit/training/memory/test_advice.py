"""training/memory/advice.py: the out-of-memory advice keeps the tokens per step and passes train.py's checks."""
import pytest

from training import rules
from training.memory.advice import fitting_batch_size, oom_advice, resplit


GIB = 2 ** 30


@pytest.mark.parametrize('phase, batch_size, accumulation, world_size, checkpointing, in_backward', [
    ('training', 12, 40, 1, False, False), ('training', 6, 8, 4, True, False), ('training', 12, 1, 1, False, True),
    ('evaluation', 16, 1, 1, False, True),
])
def test_oom_advice_commands_pass_train_py_checks(tiny, phase, batch_size, accumulation, world_size, checkpointing,
                                                  in_backward):
    """Each --key=value the advice prints, applied, is a config train.py accepts; with the step in backward (which
    cannot accumulate) it lowers the micro-batch alone."""
    stats = dict(allocated=9 * GIB, reserved=11 * GIB, peak=11 * GIB, total=12 * GIB)
    config = {**tiny, 'batch_size': batch_size, 'gradient_accumulation_steps': accumulation, 'world_size': world_size,
              'activation_checkpointing': checkpointing, 'optimizer_in_backward': in_backward,
              'grad_clip': 0.0 if in_backward else 1.0}
    rules.check_config(config, world_size, 'cuda')
    message = oom_advice(phase, batch_size, accumulation, world_size, checkpointing, stats, 2 * GIB, in_backward)
    suggestions = [part.split(' (')[0] for part in message.split('next step: ')[1].split(', or ')]
    commands = [dict(arg[2:].split('=') for arg in part.split()) for part in suggestions if part.startswith('--')]
    assert commands
    for command in commands:
        typed = {key: value if key == 'parallelism' else eval(value) for key, value in command.items()}
        rules.check_config({**config, **typed}, world_size, 'cuda')
    if in_backward and phase == 'training':
        assert commands[0] == {'batch_size': '11'} and 'fewer tokens per step' in message
    # under torchrun, ddp's training is told of zero1
    assert ({'parallelism': 'zero1'} in commands) == (world_size > 1 and phase == 'training')


def test_oom_advice_scales_the_batch_and_keeps_tokens():
    stats = dict(allocated=9 * GIB, reserved=11 * GIB, peak=11 * GIB, total=12 * GIB)
    # (12 - 2) / (11 - 2) of 12 is 13: capped below the batch that failed, 11; 480 samples in micro-batches of up
    # to 11 take 44 micro-steps, of 11 (484 samples)
    message = oom_advice('training', 12, 40, 1, False, stats, fixed=2 * GIB)
    assert 'peak 11.00 GiB, card total 12.00 GiB (before the first forward: 2.00 GiB)' in message
    assert '--batch_size=11 --gradient_accumulation_steps=44' in message
    assert '--activation_checkpointing=True' in message
    assert fitting_batch_size(12, 2 * GIB, 20 * GIB, 12 * GIB) == 6  # 12 * 10 / 18, rounded down
    assert fitting_batch_size(1, 2 * GIB, 20 * GIB, 12 * GIB) == 1
    assert resplit(12, 40, 1, 6) == (6, 80)
    # 12 samples over 4 processes, at most 2 a micro-batch: 8 micro-steps (2 a process) of 2, the fewest that keep 12
    assert resplit(3, 4, 4, 2) == (2, 8)
    assert resplit(8, 64, 2, 12) == (12, 44)  # 512 samples: 44 micro-steps of 12 (528, 22 a process), not 64 of 8
    done = oom_advice('training', 1, 8, 1, True, stats, fixed=2 * GIB)
    assert '--batch_size' not in done and 'smaller block_size or model' in done
    # gpt2026.py's record: no activation checkpointing to turn on
    record = oom_advice('training', 1, 32, 1, False, stats, fixed=2 * GIB, checkpointing_possible=False)
    assert record.splitlines()[-1] == 'next step: a smaller block_size or model: batch 1 does not fit'
    assert '--activation_checkpointing' not in oom_advice('training', 2, 32, 1, False, stats, fixed=2 * GIB,
                                                          checkpointing_possible=False)
    # under torchrun: zero1 for ddp, nothing to split further for zero1 or fsdp
    assert '--parallelism=zero1' in oom_advice('training', 1, 32, 2, True, stats, fixed=2 * GIB)
    for parallelism in ('zero1', 'fsdp'):
        assert '--parallelism' not in oom_advice('training', 1, 32, 2, True, stats, 2 * GIB, parallelism=parallelism)
