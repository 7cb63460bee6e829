"""train.py with each optimizer lever, in subprocesses: what optimizer_in_backward cannot honour is refused, runs
under torch.compile train as in eager, and each lever (Muon too) trains and resumes exactly."""
import importlib.util

import pytest
import torch

from helpers import logged_losses, train
from model import GPT, GPTConfig
from training import optim


needs_torchao = pytest.mark.skipif(importlib.util.find_spec('torchao') is None,
                                   reason='adamw_8bit needs torchao: pip install -r requirements-dev.txt')


def test_in_backward_under_compile_trains_as_eager(data_dir, tmp_path):
    """The steps run in gradient hooks, outside the compiled graph: torch.compile must not skip or repeat them."""
    args = ['--max_iters=4', '--eval_interval=4', '--optimizer_in_backward=True', '--grad_clip=0']
    eager = train(data_dir, tmp_path / 'eager', *args)
    compiled = train(data_dir, tmp_path / 'compiled', *args, '--compile=True')
    assert eager.returncode == 0 and compiled.returncode == 0, compiled.stderr
    eager_losses, compiled_losses = logged_losses(eager.stdout), logged_losses(compiled.stdout)
    assert eager_losses.keys() == compiled_losses.keys() == set(range(5))
    assert compiled_losses == pytest.approx(eager_losses, rel=1e-4)  # inductor may order float sums differently


@pytest.mark.parametrize('args, key', [
    (['--optimizer_in_backward=True', '--grad_clip=0', '--gradient_accumulation_steps=2'],
     'gradient_accumulation_steps=2'),
    (['--optimizer_in_backward=True'], 'grad_clip=1.0'),
])
def test_train_refuses_what_in_backward_cannot_honour(data_dir, tmp_path, args, key):
    result = train(data_dir, tmp_path / 'out', '--max_iters=2', *args)
    assert result.returncode == 2 and not (tmp_path / 'out').exists()
    [error] = result.stderr.strip().splitlines()
    assert error.startswith('error: optimizer_in_backward=True') and key in error


BF16_WEIGHTS = ['--dtype=bfloat16', '--weight_dtype=bfloat16']


@pytest.mark.parametrize('levers', [['--optim=adamw_bf16', '--optimizer_in_backward=True', '--grad_clip=0'],
                                    pytest.param(['--optim=adamw_8bit'], marks=needs_torchao),
                                    BF16_WEIGHTS,
                                    pytest.param([*BF16_WEIGHTS, '--optim=adamw_8bit', '--optimizer_in_backward=True',
                                                  '--grad_clip=0'], marks=needs_torchao)])
def test_train_and_resume_with_each_lever(data_dir, tmp_path, levers):
    """The checkpoint at iter 6 is written before iter 6's step: the resumed run's iter 6 repeats it exactly."""
    out = tmp_path / 'out'
    first = train(data_dir, out, '--max_iters=6', '--eval_interval=3', *levers)
    assert first.returncode == 0, first.stderr
    assert 'Failed to load' not in first.stderr  # torchao's warnings about compiled extensions it does not need
    losses = logged_losses(first.stdout)
    assert losses[6] < losses[0]
    resumed = train(data_dir, out, '--max_iters=6', '--eval_interval=3', '--init_from=resume', *levers)
    assert resumed.returncode == 0, resumed.stderr
    assert logged_losses(resumed.stdout) == {6: losses[6]}
    if '--optim=adamw_8bit' in levers:
        optim.require('adamw_8bit')  # torchao's import allows its 8-bit state in a weights_only load, as in train.py
    weights = torch.load(out / 'ckpt.pt', weights_only=True)['model']
    assert {v.dtype for v in weights.values()} == {torch.bfloat16 if BF16_WEIGHTS[1] in levers else torch.float32}
    nanogpt_model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=34, bias=False))
    nanogpt_model.load_state_dict(weights)  # as nanoGPT's sample.py loads it, into fp32 weights
    if '--optimizer_in_backward=True' in levers[:2]:  # resuming with the other optimizer is refused by name
        other = train(data_dir, out, '--max_iters=6', '--init_from=resume', '--optim=adamw', *levers[1:])
        assert other.returncode == 2 and "--optim=adamw_bf16" in other.stderr.strip().splitlines()[-1]


def test_train_resumes_exactly_and_refuses_another_optim(data_dir, tmp_path):
    """With accumulation and clipping; the checkpoint at iter 6 is written before iter 6's step."""
    out, args = tmp_path / 'out', ['--max_iters=6', '--eval_interval=3', '--gradient_accumulation_steps=2']
    first = train(data_dir, out, '--optim=muon', *args)
    assert first.returncode == 0, first.stderr
    losses = logged_losses(first.stdout)
    assert losses[6] < losses[0]
    resumed = train(data_dir, out, '--optim=muon', *args, '--init_from=resume')
    assert resumed.returncode == 0, resumed.stderr
    assert logged_losses(resumed.stdout) == {6: losses[6]}
    other = train(data_dir, out, '--optim=muon', *args, '--init_from=resume', '--optim=adamw')
    assert other.returncode == 2
    assert other.stderr.strip().splitlines() == [f"error: {out / 'ckpt.pt'} holds the state of optim='muon', not "
                                                 f"optim='adamw': resume with --optim=muon"]


def test_train_under_compile_as_eager(data_dir, tmp_path):
    """Muon, and attention in blocks of a window within documents (token 0, the newline, starts one), the window
    growing from 4 to 8 (a new shape for the compiled model, in training and evaluation)."""
    args = ['--max_iters=4', '--eval_interval=4', '--pos_emb=rope', '--attn_window=8', '--doc_token=0',
            '--attn_window_warmup_iters=2', '--attn_window_warmup_start=4']
    eager = train(data_dir, tmp_path / 'eager', '--optim=muon', *args)
    compiled = train(data_dir, tmp_path / 'compiled', '--optim=muon', *args, '--compile=True')
    assert eager.returncode == 0 and compiled.returncode == 0, compiled.stderr
    assert logged_losses(compiled.stdout) == pytest.approx(logged_losses(eager.stdout), rel=1e-4)
