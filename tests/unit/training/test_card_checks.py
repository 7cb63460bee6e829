"""training/card_checks.py's FlexAttention checks, on the CPU stand-in of the CUDA kernel (tests/flex_on_a_cpu.py): the
speedrun preset's model at a scale FlexAttention runs (windows in blocks of 128), its check passing where the kernel's
block mask is right and failing where its window is a block short. The other checks: test_card.py."""
import json
import math
import os
import subprocess
import sys

import pytest

from training import attention
import flex_on_a_cpu
from helpers import ROOT
from training import card_checks
from training.card_measure import load_preset

# the speedrun preset with 2 layers 32 wide (heads of 16), rows of 6 blocks of 128 (the checks' documents 2 blocks
# long: a window a block short shows) and its windows in blocks
FLEX_SCALE = dict(n_layer=2, n_head=2, n_embd=32, block_size=768, attn_window=256, attn_window_block=128)


@pytest.fixture
def speedrun(monkeypatch):
    """(config, model_args) of the speedrun preset at FLEX_SCALE, FlexAttention's kernel the CPU stand-in."""
    monkeypatch.setattr(attention, 'compiled_flex_attention', lambda: flex_on_a_cpu.flex_attention)
    config, _, model_args = load_preset('config/speedrun_gpt2_12gb.py', tiny=True)
    config = {**config, 'batch_size': 1, 'block_size': 768}
    return config, {**model_args, **FLEX_SCALE}


def test_flex_check_passes_where_the_block_mask_is_right(speedrun):
    config, model_args = speedrun
    calls = len(flex_on_a_cpu.calls)
    options = attention.flex_kernel_options(type('GPU', (), {'shared_memory_per_block_optin': 101376}), 16)[0]
    check = card_checks.flex_against_masked(config, model_args, 'cpu', 'cpu', options)
    assert len(flex_on_a_cpu.calls) > calls  # the kernel ran, with the consumer card's tiles
    assert check['passed'], check
    assert abs(check['loss'] - math.log(model_args['vocab_size'])) > 0.1
    assert 0 < check['gradient_difference'] <= card_checks.NOISE_MULTIPLE * check['gradient_noise']


def test_flex_check_fails_where_the_window_is_a_block_short(speedrun, monkeypatch):
    config, model_args = speedrun
    block_mask = attention.flex_block_mask
    monkeypatch.setattr(attention, 'flex_block_mask', lambda doc, t, window_blocks, block, device=None:
                        block_mask(doc, t, window_blocks - 1, block, device))
    check = card_checks.flex_against_masked(config, model_args, 'cpu', 'cpu', {})
    assert not check['passed']
    assert check['gradient_difference'] > card_checks.NOISE_MULTIPLE * check['gradient_noise']


def test_flex_checks_are_skipped_with_their_reason_off_cuda(speedrun):
    config, model_args = speedrun
    for name, check in card_checks.CHECKS:
        if name.startswith('flex'):
            assert check(config, model_args, 'cpu', 'cpu') == {
                'skipped': 'FlexAttention trains on CUDA only (the tests run it on a CPU stand-in)'}


@pytest.mark.slow
def test_on_a_bare_cpu_the_kernel_checks_are_skipped_not_run(tmp_path):
    """In a process where no stand-in registered CPU kernels for FlashAttention's operator (a fresh one: the tests'
    registration lasts their process), the varlen check is skipped with its reason, as the flex checks are."""
    code = ("import json, torch\n"
            "from training import card_checks\n"
            "from training.card_measure import load_preset\n"
            "config, _, model_args = load_preset('config/speedrun_gpt2_12gb.py', tiny=True)\n"
            "assert not card_checks.kernel_registered_on_cpu()\n"
            "print(json.dumps({name: check(config, model_args, 'cpu', 'cpu') for name, check in card_checks.CHECKS\n"
            "                  if 'kernel' in name or 'flex' in name}))\n")
    result = subprocess.run([sys.executable, '-c', code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                            env={k: v for k, v in os.environ.items() if k != 'PYTHONPATH'})
    assert result.returncode == 0, result.stderr[-2000:]
    checks = json.loads(result.stdout.splitlines()[-1])
    assert checks['varlen kernel against masked'] == {
        'skipped': "FlashAttention's kernel is CUDA only (the tests give a CPU stand-in)"}
    assert all('skipped' in check for check in checks.values()) and len(checks) == 3
