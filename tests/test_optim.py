"""optim.py: the optimizer step fused into backward gives the standard loop's parameters; AdamW with bf16 moments and
torchao's 8-bit AdamW train a tiny GPT like AdamW with the state they promise; estimate_memory.py shows each lever;
train.py refuses what optimizer_in_backward cannot honour, runs it under torch.compile as in eager, and trains and
resumes exactly with each lever."""
import importlib.util
import sys

import pytest
import torch

from helpers import logged_losses, run_script, tiny_gpt, train, train_steps
from model import GPT, GPTConfig
from training import optim
from training.errors import ConfigError
from training.memory import estimate as em
from training.memory.tracer import inner_tensors

needs_torchao = pytest.mark.skipif(importlib.util.find_spec('torchao') is None,
                                   reason='adamw_8bit needs torchao: pip install -r requirements-dev.txt')
LOW_MEMORY = ['adamw_bf16', pytest.param('adamw_8bit', marks=needs_torchao)]


OPTIMIZER = dict(learning_rate=1e-2, weight_decay=0.1, beta1=0.9, beta2=0.95, weight_dtype='float32',
                 optimizer_in_backward=False)
MUON = dict(OPTIMIZER, optim='muon', learning_rate=1e-3, muon_learning_rate=0.02, muon_momentum=0.95)


def gpt_and_optimizer(optim_name='adamw', in_backward=False):
    """A 2-layer GPT whose weight matrices all have >= 4096 elements (torchao quantizes those), and train.py's
    optimizer of it; with biases under Muon, so the blocks hold 1-D parameters too."""
    model = tiny_gpt(n_embd=64, vocab_size=96, bias=optim_name == 'muon')
    config = {**(MUON if optim_name == 'muon' else OPTIMIZER), 'optim': optim_name, 'optimizer_in_backward': in_backward}
    return model, optim.build_optimizer(model, config, 'cpu')


@pytest.mark.parametrize('optim_name', ['adamw', 'muon'])
def test_in_backward_step_gives_the_standard_loops_parameters(optim_name):
    """Muon too: it orthogonalizes each matrix on its own, so stepping each parameter as backward finishes it is
    exact."""
    standard_model, standard = gpt_and_optimizer(optim_name)
    fused_model, fused = gpt_and_optimizer(optim_name, in_backward=True)
    assert train_steps(standard_model, [standard], 4) == train_steps(fused_model, [fused], 4)
    for a, b in zip(standard_model.parameters(), fused_model.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-7)
    # the checkpoint's optimizer state has the standard optimizer's layout and values, and loads either way
    saved, expected = fused.state_dict(), standard.state_dict()
    assert [g['params'] for g in saved['param_groups']] == [g['params'] for g in expected['param_groups']]
    assert saved['state'].keys() == expected['state'].keys()
    for index, state in expected['state'].items():
        for key, value in state.items():
            torch.testing.assert_close(saved['state'][index][key], value, rtol=0, atol=1e-7)
    gpt_and_optimizer(optim_name)[1].load_state_dict(saved)
    gpt_and_optimizer(optim_name, in_backward=True)[1].load_state_dict(expected)


def moment_bytes(optimizer):
    state = [t for values in optimizer.state.values() for value in values.values() for t in inner_tensors(value)]
    return sum(t.nbytes for t in state if t.dim() > 0)  # not the scalar step counters


@pytest.mark.parametrize('optim_name', LOW_MEMORY)
def test_low_memory_optimizers_train_like_adamw_with_smaller_state(optim_name):
    adamw_model, adamw = gpt_and_optimizer()
    model, optimizer = gpt_and_optimizer(optim_name)
    reference, losses = train_steps(adamw_model, [adamw], 20), train_steps(model, [optimizer], 20)
    assert losses[-1] < 0.5 * losses[0]
    assert losses[-1] == pytest.approx(reference[-1], rel=0.1, abs=0.05)
    params = list(model.parameters())
    if optim_name == 'adamw_bf16':  # both moments in 2 bytes instead of 4
        assert moment_bytes(optimizer) * 2 == moment_bytes(adamw)
    else:  # quantized tensors: 1 byte an element, a fp32 scale per block of 256 and a 256-entry fp32 code map
        quantized = [p.numel() for p in params if p.numel() >= 4096 and p.numel() % 256 == 0]
        small = [p.numel() for p in params if not (p.numel() >= 4096 and p.numel() % 256 == 0)]
        assert moment_bytes(optimizer) == sum(2 * (n + 4 * n // 256 + 4 * 256) for n in quantized) + 8 * sum(small)
        assert moment_bytes(optimizer) < 0.3 * moment_bytes(adamw)


@needs_torchao
def test_estimator_reflects_each_lever(weighty, monkeypatch):
    # the non-fused steps' temporaries are one chunk's: small chunks keep them small beside this model's state
    monkeypatch.setattr(optim, 'CHUNK_ELEMENTS', 2 ** 14)
    def traced(**overrides):
        return em.trace({**weighty, **overrides}, evaluate=False)['train']
    adamw, bf16, int8 = (traced(optim=name) for name in ('adamw', 'adamw_bf16', 'adamw_8bit'))
    state = adamw['breakdown']['optimizer_state']
    assert bf16['breakdown']['optimizer_state'] == pytest.approx(state / 2, rel=0.01)
    assert int8['breakdown']['optimizer_state'] < 0.3 * state
    assert adamw['peak_bytes'] > bf16['peak_bytes'] > int8['peak_bytes']
    # in backward: the gradients of all parameters never exist at once
    fused = traced(optimizer_in_backward=True)
    assert fused['breakdown']['gradients'] < adamw['breakdown']['gradients'] / 4
    assert fused['peak_bytes'] < adamw['peak_bytes'] - adamw['breakdown']['gradients'] / 2
    with pytest.raises(ConfigError, match='gradient_accumulation_steps=2'):
        em.check_config({**weighty, 'optimizer_in_backward': True, 'gradient_accumulation_steps': 2})


@pytest.mark.parametrize('overrides, message', [
    ({'gradient_accumulation_steps': 2}, '--gradient_accumulation_steps=1'),
    ({'grad_clip': 1.0}, '--grad_clip=0.0'),
    ({'dtype': 'float16'}, '--dtype=bfloat16'),
    ({'world_size': 2}, 'one process'),
    ({'auto_batch_size': True}, 'auto_batch_size'),
    ({'optim': 'adam8', 'optimizer_in_backward': False}, "unknown optim 'adam8'"),
])
def test_check_config_names_the_conflict(overrides, message):
    config = {**IN_BACKWARD, **overrides}
    with pytest.raises(ConfigError, match=message):
        optim.check_config(config, config.pop('world_size', 1))


IN_BACKWARD = {'optim': 'adamw', 'optimizer_in_backward': True, 'gradient_accumulation_steps': 1, 'grad_clip': 0.0,
               'dtype': 'float32', 'auto_batch_size': False, 'weight_dtype': 'float32', 'parallelism': 'ddp',
               'learning_rate': 6e-4, 'beta1': 0.9, 'beta2': 0.95, 'weight_decay': 0.1}


def test_in_backward_lists_every_conflict_in_one_line_the_process_count_first():
    """Under torchrun the process count is what explains the rest; every fix shows at once, not one a run."""
    config = {**IN_BACKWARD, 'gradient_accumulation_steps': 2, 'grad_clip': 1.0, 'dtype': 'float16'}
    with pytest.raises(ConfigError) as error:
        optim.check_config(config, 2)
    message = str(error.value)
    assert '\n' not in message and message.startswith('optimizer_in_backward=True conflicts with 2 processes')
    fixes = ['without torchrun', '--gradient_accumulation_steps=1', '--grad_clip=0.0', '--dtype=bfloat16',
             '--optimizer_in_backward=False']
    assert all(fix in message for fix in fixes)
    assert [message.index(fix) for fix in fixes] == sorted(message.index(fix) for fix in fixes)


@pytest.mark.parametrize('overrides, message', [
    ({'learning_rate': -1.0}, 'learning_rate must be positive, got -1.0: e.g. --learning_rate=6e-4'),
    ({'learning_rate': 0.0}, 'learning_rate must be positive'),
    ({'beta2': 1.5}, "beta2 is a moment's decay rate in [0, 1), got 1.5: e.g. --beta2=0.95"),
    ({'beta1': -0.1}, "beta1 is a moment's decay rate in [0, 1), got -0.1: e.g. --beta1=0.9"),
    ({'weight_decay': -1.0}, 'weight_decay must be 0 or more, got -1.0'),
    ({'grad_clip': -1.0}, 'grad_clip is a norm, 0 or more, got -1.0'),
])
def test_hyperparameters_out_of_range_are_refused_before_torch_sees_them(overrides, message):
    with pytest.raises(ConfigError) as error:
        optim.check_config({**IN_BACKWARD, 'optimizer_in_backward': False, **overrides}, 1)
    assert message in str(error.value) and '\n' not in str(error.value)
    optim.check_config({**IN_BACKWARD, 'optimizer_in_backward': False, 'beta2': 0.0, 'weight_decay': 0.0}, 1)


def test_missing_torchao_names_the_install(monkeypatch):
    monkeypatch.setitem(sys.modules, 'torchao.optim', None)  # import torchao.optim raises ImportError
    with pytest.raises(ConfigError, match='pip install torchao'):
        optim.require('adamw_8bit')


@pytest.mark.slow
def test_in_backward_under_compile_trains_as_eager(data_dir, tmp_path):
    """The steps run in gradient hooks, outside the compiled graph: torch.compile must not skip or repeat them."""
    args = ['--max_iters=4', '--eval_interval=4', '--optimizer_in_backward=True', '--grad_clip=0']
    eager = train(data_dir, tmp_path / 'eager', *args)
    compiled = train(data_dir, tmp_path / 'compiled', *args, '--compile=True')
    assert eager.returncode == 0 and compiled.returncode == 0, compiled.stderr
    eager_losses, compiled_losses = logged_losses(eager.stdout), logged_losses(compiled.stdout)
    assert eager_losses.keys() == compiled_losses.keys() == set(range(5))
    assert compiled_losses == pytest.approx(eager_losses, rel=1e-4)  # inductor may order float sums differently


@pytest.mark.slow
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


@pytest.mark.slow
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
    weights = torch.load(out / 'ckpt.pt', weights_only=True)['model']
    assert {v.dtype for v in weights.values()} == {torch.bfloat16 if BF16_WEIGHTS[1] in levers else torch.float32}
    nanogpt_model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=34, bias=False))
    nanogpt_model.load_state_dict(weights)  # as nanoGPT's sample.py loads it, into fp32 weights
    if '--optimizer_in_backward=True' in levers[:2]:  # resuming with the other optimizer is refused by name
        other = train(data_dir, out, '--max_iters=6', '--init_from=resume', '--optim=adamw', *levers[1:])
        assert other.returncode == 2 and "--optim=adamw_bf16" in other.stderr.strip().splitlines()[-1]


# -----------------------------------------------------------------------------
# bf16 weights (weight_dtype='bfloat16'): no fp32 copy, every update rounded stochastically

def test_stochastic_rounding_is_unbiased_and_lands_on_a_neighbour():
    torch.manual_seed(0)
    x = torch.tensor([1.0 + 2 ** -10, -3.0 - 2 ** -9 - 2 ** -11, 1e-3 * (1 + 2 ** -12)])  # between bf16 values
    below = x.to(torch.bfloat16).float()  # a neighbour; the other is one bf16 step further from zero
    draws = torch.stack([_rounded(x) for _ in range(4000)])
    steps = draws - below
    assert set(draws.view(-1).tolist()) <= set(below.tolist()) | set((below + steps.abs().amax(0) * x.sign()).tolist())
    assert draws.mean(0) == pytest.approx(x.tolist(), rel=2e-4)  # a draw's error is up to 2**-8: 4000 average it out
    exact = torch.tensor([1.5, -2.0])  # representable: never moves
    assert all(torch.equal(_rounded(exact), exact) for _ in range(10))


def _rounded(x):
    stored = torch.empty_like(x, dtype=torch.bfloat16)
    optim._store_bf16_stochastic(stored, x.clone())
    return stored.float()


def test_sliced_adamw_on_fp32_weights_is_torchs_adamw():
    reference_model, reference = gpt_and_optimizer()
    model, _ = gpt_and_optimizer()
    sliced = model.configure_optimizers(0.1, 1e-2, (0.9, 0.95), 'cpu', optim.SlicedAdamW)
    assert train_steps(model, [sliced], 5) == pytest.approx(train_steps(reference_model, [reference], 5), abs=1e-6)
    for a, b in zip(model.parameters(), reference_model.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def test_a_bf16_weight_update_lands_on_a_neighbour_of_the_fp32_update():
    """One step from the same weights and gradients: each bf16 weight is torch's fp32 update rounded down or up."""
    torch.manual_seed(0)
    weights = torch.randn(3000, dtype=torch.bfloat16) * 0.02
    grads = torch.randn(3000, dtype=torch.bfloat16) * 1e-3
    fp32 = torch.nn.Parameter(weights.float())
    bf16 = torch.nn.Parameter(weights.clone())
    reference = torch.optim.AdamW([fp32], lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1, foreach=False)
    ours = optim.optimizer_class('adamw', 'bfloat16')([bf16], lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)
    fp32.grad, bf16.grad = grads.float(), grads.clone()
    reference.step()
    ours.step()
    nearest = fp32.detach().to(torch.bfloat16).float()
    ulp = nearest.abs().mul(2 ** -7).clamp(min=2 ** -133)  # a bf16 step near the value (8 significant bits)
    assert bf16.dtype == torch.bfloat16 and ((bf16.float() - fp32).abs() <= ulp * 1.001).all()
    assert (bf16.float() != nearest).any() and (bf16.float() == nearest).any()  # rounded both ways, not to nearest


def test_bf16_weights_halve_weights_and_gradients_in_the_estimate(weighty):
    def traced(**overrides):
        return em.trace({**weighty, 'dtype': 'bfloat16', **overrides}, evaluate=False)['train']['breakdown']
    fp32, bf16 = traced(), traced(weight_dtype='bfloat16')
    assert bf16['parameters'] == pytest.approx(fp32['parameters'] / 2, rel=0.01)
    # half, where the peak may catch the tied embedding's two gradient contributions (embedding and loss) together
    embedding = 256 * 256 * 2
    assert fp32['gradients'] / 2 * 0.99 <= bf16['gradients'] <= fp32['gradients'] / 2 + embedding
    assert bf16['optimizer_state'] == fp32['optimizer_state']  # fp32 moments still
    assert bf16['weight_copies'] == 0  # no cast needed: the weights are bf16 already


@pytest.mark.parametrize('overrides, message', [
    ({'dtype': 'float32'}, "weight_dtype='bfloat16' trains in bf16, not dtype='float32'"),
    ({'optim': 'muon'}, "torch's Muon does not do"),
    ({'weight_dtype': 'float16'}, "unknown weight_dtype 'float16'"),
])
def test_weight_dtype_refusals(weighty, overrides, message):
    with pytest.raises(ConfigError, match=message):
        em.check_config({**weighty, 'dtype': 'bfloat16', 'weight_dtype': 'bfloat16', **overrides})


def test_loaded_moments_keep_their_dtype():
    """torch's load_state_dict casts moments to the parameters' dtype: bf16 moments would double after a resume."""
    model, optimizer = gpt_and_optimizer('adamw_bf16')
    train_steps(model, [optimizer], 1)
    fresh_model, fresh = gpt_and_optimizer('adamw_bf16')
    fresh.load_state_dict(optimizer.state_dict())
    assert {t.dtype for state in fresh.state.values() for t in state.values() if t.dim()} == {torch.bfloat16}


@pytest.mark.slow
def test_bench_optim_compares_weight_precisions_and_the_autocast_cache(data_dir):
    """The same initial loss for every run; autocast's cache changes no loss; torch's AdamW on bf16 weights (rounding
    to nearest) keeps its moments in bf16, bf16_weights in fp32."""
    runs = ['adamw', 'bf16_weights', 'bf16_nearest', 'autocast_cache']
    result = run_script('bench_optim.py', f'--data_dir={data_dir}', '--dataset=tiny_char', '--n_layer=1',
                        '--n_head=2', '--n_embd=32', '--block_size=16', '--batch_size=4', '--max_iters=4',
                        '--eval_interval=2', '--eval_iters=2', '--lr_decay_iters=4', '--warmup_iters=1',
                        '--dtype=bfloat16', '--activation_checkpointing=True', f"--runs={','.join(runs)}")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split() == ['step', *runs])
    rows = [line.split()[1:] for line in lines[header + 1:header + 4]]
    assert len(set(rows[0])) == 1 and all(row[0] == row[3] for row in rows)
    state = {line.split(':')[0]: int(line.split('optimizer state ')[1].split(' ')[0].replace(',', ''))
             for line in lines[header + 4:]}
    assert state['bf16_weights'] == state['adamw'] and state['bf16_nearest'] < 0.6 * state['adamw']
