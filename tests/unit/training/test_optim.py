"""training/optim.py and the optimizers it builds: the optimizer fused into backward gives the standard loop's
parameters; AdamW with bf16 moments and torchao's 8-bit AdamW train like AdamW with the state they promise;
optim='muon' (torch's Muon on the blocks' matrices, AdamW on the rest) steps as torch's two optimizers and resumes
exactly; the checks refuse what cannot run with one line. The classes' own updates: test_optimizers.py."""
import copy
import importlib.util
import io
import sys

import pytest
import torch

from helpers import fixed_batch, tiny_gpt, train_steps, warm_up_lr
from training import optim, optimizers
from training.errors import ConfigError
from training.memory.tracer import inner_tensors


needs_torchao = pytest.mark.skipif(importlib.util.find_spec('torchao') is None,
                                   reason='adamw_8bit needs torchao: pip install -r requirements-dev.txt')
LOW_MEMORY = ['adamw_bf16', pytest.param('adamw_8bit', marks=needs_torchao)]


OPTIMIZER = dict(learning_rate=1e-2, weight_decay=0.1, beta1=0.9, beta2=0.95, weight_dtype='float32',
                 optimizer_in_backward=False)
MUON = dict(OPTIMIZER, optim='muon', learning_rate=1e-3, muon_learning_rate=0.02, muon_momentum=0.95)


def gpt_and_optimizer(optim_name='adamw', in_backward=False, device_type='cpu'):
    """A 2-layer GPT whose weight matrices all have >= 4096 elements (torchao quantizes those), and train.py's
    optimizer of it, built as on `device_type`; with biases under Muon, so the blocks hold 1-D parameters too."""
    model = tiny_gpt(n_embd=64, vocab_size=96, bias=optim_name == 'muon')
    config = {**(MUON if optim_name == 'muon' else OPTIMIZER), 'optim': optim_name,
              'optimizer_in_backward': in_backward}
    return model, optim.build_optimizer(model, config, device_type)


@pytest.mark.parametrize('optim_name', ['adamw', 'muon'])
def test_in_backward_step_gives_the_standard_loops_parameters(optim_name):
    """Muon too: it orthogonalizes each matrix on its own, so stepping each parameter as backward finishes it is
    exact."""
    standard_model, standard = gpt_and_optimizer(optim_name)
    fused_model, fused = gpt_and_optimizer(optim_name, in_backward=True)
    assert train_steps(standard_model, standard, 4) == train_steps(fused_model, fused, 4)
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


@pytest.mark.parametrize('optim_name, in_backward', [('adamw', False), ('muon', False), ('adamw', True)])
def test_optimizers_built_as_on_cuda_are_torchs_fused_adamw_and_step_as_the_cpus(optim_name, in_backward):
    """On CUDA train.py's AdamW (Muon's, for the groups that are not matrices) is torch's fused kernel, which torch
    runs on a CPU too, with its own checks of the parameters and gradients it gets: built as on CUDA, it takes this
    model's and its step from the same weights and gradients is the CPU loop's, up to fp32 rounding (over more steps
    Muon's bf16 Newton-Schulz iterations would grow that rounding into bf16's)."""
    model, optimizer = gpt_and_optimizer(optim_name, in_backward)
    cuda_model, cuda_optimizer = gpt_and_optimizer(optim_name, in_backward, 'cuda')  # the same seeded weights
    assert {group.get('fused') for group in cuda_optimizer.state_dict()['param_groups'] if not group.get('muon')} \
        == {True}
    assert {group.get('fused') for group in optimizer.state_dict()['param_groups']} <= {None, False}
    before = [p.detach().clone() for p in model.parameters()]
    train_steps(cuda_model, cuda_optimizer, 1)
    train_steps(model, optimizer, 1)
    for a, b, initial in zip(cuda_model.parameters(), model.parameters(), before):
        assert not torch.equal(b, initial)
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)  # a step moves a weight by about lr (1e-3 to 1e-2)


def moment_bytes(optimizer):
    state = [t for values in optimizer.state.values() for value in values.values() for t in inner_tensors(value)]
    return sum(t.nbytes for t in state if t.dim() > 0)  # not the scalar step counters


@pytest.mark.parametrize('optim_name', LOW_MEMORY)
def test_low_memory_optimizers_train_like_adamw_with_smaller_state(optim_name):
    adamw_model, adamw = gpt_and_optimizer()
    model, optimizer = gpt_and_optimizer(optim_name)
    reference, losses = train_steps(adamw_model, adamw, 20), train_steps(model, optimizer, 20)
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


# -----------------------------------------------------------------------------
# bf16 weights (weight_dtype='bfloat16'): no fp32 copy, every update rounded stochastically


def test_sliced_adamw_on_fp32_weights_is_torchs_adamw():
    reference_model, reference = gpt_and_optimizer()
    model, _ = gpt_and_optimizer()
    sliced = model.configure_optimizers(0.1, 1e-2, (0.9, 0.95), 'cpu', optimizers.SlicedAdamW)
    assert train_steps(model, sliced, 5) == pytest.approx(train_steps(reference_model, reference, 5), abs=1e-6)
    for a, b in zip(model.parameters(), reference_model.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def test_loaded_moments_keep_their_dtype():
    """torch's load_state_dict casts moments to the parameters' dtype: bf16 moments would double after a resume."""
    model, optimizer = gpt_and_optimizer('adamw_bf16')
    train_steps(model, optimizer, 1)
    fresh_model, fresh = gpt_and_optimizer('adamw_bf16')
    fresh.load_state_dict(optimizer.state_dict())
    assert {t.dtype for state in fresh.state.values() for t in state.values() if t.dim()} == {torch.bfloat16}


BLOCK_MATRICES = ('attn.c_attn.weight', 'attn.c_proj.weight', 'mlp.c_fc.weight', 'mlp.c_proj.weight')


def assert_same_parameters(a, b):
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.equal(p, q)


def test_muon_groups_hold_exactly_the_blocks_matrices():
    model, optimizer = gpt_and_optimizer('muon')
    names = {p: name for name, p in model.named_parameters()}
    [muon] = [group for group in optimizer.param_groups if group['muon']]
    assert sorted(names[p] for p in muon['params']) == sorted(f'transformer.h.{i}.{name}' for i in range(2)
                                                              for name in BLOCK_MATRICES)
    assert (muon['lr'], muon['momentum'], muon['weight_decay']) == (0.02, 0.95, 0.1)
    decay, no_decay = [group for group in optimizer.param_groups if not group['muon']]
    # the tied token embedding (lm_head) and the position embedding: AdamW, decayed as nanoGPT's 2-D tensors
    assert sorted(names[p] for p in decay['params']) == ['transformer.wpe.weight', 'transformer.wte.weight']
    assert decay['weight_decay'] == 0.1 and no_decay['weight_decay'] == 0.0
    assert all(p.dim() == 1 for p in no_decay['params'])  # LayerNorms and biases, blocks' included
    assert len(muon['params']) + len(decay['params']) + len(no_decay['params']) == len(list(model.parameters()))


def reference_steps(model, optimizers, steps, scaler=None):
    """train_steps' steps with torch's optimizers stepped side by side, each through `scaler` if given."""
    x, y = fixed_batch(model)
    peaks = [[group['lr'] for group in optimizer.param_groups] for optimizer in optimizers]
    for step in range(steps):
        for optimizer, peak in zip(optimizers, peaks):
            warm_up_lr(optimizer, peak, step, steps)
        _, loss = model(x, y)
        (scaler.scale(loss) if scaler else loss).backward()
        for optimizer in optimizers:
            scaler.step(optimizer) if scaler else optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        if scaler:
            scaler.update()


@pytest.mark.parametrize('scaled', [False, True])
def test_steps_equal_torchs_muon_and_adamw_on_the_same_groups(scaled):
    """Also through GradScaler (fp16's; its power-of-two scale unscales exactly), which steps it as any optimizer."""
    model, optimizer = gpt_and_optimizer('muon')
    reference, _ = gpt_and_optimizer('muon')
    groups = optim.muon_param_groups(reference, MUON)
    muon = torch.optim.Muon(groups[:1], lr=0.02, momentum=0.95)
    adamw = torch.optim.AdamW(groups[1:], lr=1e-3, betas=(0.9, 0.95))
    scalers = [torch.amp.GradScaler('cpu') if scaled else None for _ in range(2)]
    train_steps(model, optimizer, 3, scaler=scalers[0])
    reference_steps(reference, [muon, adamw], 3, scaler=scalers[1])
    assert_same_parameters(model, reference)
    for p, q in zip(model.parameters(), reference.parameters()):
        expected = (muon.state if q in muon.state else adamw.state)[q]
        assert optimizer.state[p].keys() == expected.keys()
        assert all(torch.equal(optimizer.state[p][k], v) for k, v in expected.items())


def test_state_dict_resumes_exactly():
    """Torch's layout, both optimizers' state in one dict (Muon's momentum for the matrices, AdamW's moments for the
    rest), through torch.save and a weights_only load as train.py's checkpoint; the resumed steps repeat."""
    model, optimizer = gpt_and_optimizer('muon')
    train_steps(model, optimizer, 2)
    buffer = io.BytesIO()
    torch.save({'model': model.state_dict(), 'optimizer': optimizer.state_dict()}, buffer)
    train_steps(model, optimizer, 3, first=2)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    kinds = {frozenset(state) for state in saved['optimizer']['state'].values()}
    assert kinds == {frozenset(['momentum_buffer']), frozenset(['step', 'exp_avg', 'exp_avg_sq'])}
    resumed, resumed_optimizer = gpt_and_optimizer('muon')
    resumed.load_state_dict(saved['model'])
    resumed_optimizer.load_state_dict(saved['optimizer'])
    train_steps(resumed, resumed_optimizer, 3, first=2)
    assert_same_parameters(resumed, model)


def test_torch_without_muon_is_one_line(monkeypatch):
    monkeypatch.delattr(torch.optim, 'Muon')
    with pytest.raises(ConfigError, match=r"optim='muon' needs torch.optim.Muon, new in torch 2.9"):
        optim.require('muon')


@pytest.mark.parametrize('overrides, world_size, message', [
    ({'parallelism': 'fsdp'}, 2, "optim='muon' orthogonalizes each whole weight matrix"),
    ({'muon_momentum': 1.0}, 1, 'muon_momentum must be in [0, 1)'),
    ({'muon_learning_rate': -0.02}, 1, 'muon_learning_rate must be 0 or more, got -0.02'),
])
def test_check_config_refuses_with_one_line(overrides, world_size, message):
    config = {**MUON, 'parallelism': 'ddp', 'gradient_accumulation_steps': 1, 'grad_clip': 1.0,
              'dtype': 'float32', 'weight_dtype': 'float32', **overrides}
    with pytest.raises(ConfigError) as error:
        optim.check_config(config, world_size)
    assert message in str(error.value) and '\n' not in str(error.value)
    optim.check_config({**config, 'parallelism': 'fsdp', 'muon_learning_rate': 0.02, 'muon_momentum': 0.95}, 1)


def test_untied_head_and_embeddings_get_their_own_learning_rates_and_momentum_warms_up():
    model = tiny_gpt(n_embd=64, vocab_size=96, bias=True, pos_emb='rope', tie_weights=False)
    config = {**MUON, 'embedding_learning_rate': 0.3, 'head_learning_rate': 0.004, 'muon_momentum_warmup_iters': 4}
    optimizer = optim.build_optimizer(model, config, 'cpu')
    names = {p: name for name, p in model.named_parameters()}
    muon, embedding, head, no_decay = optimizer.param_groups
    assert [names[p] for p in embedding['params']] == ['transformer.wte.weight']
    assert [names[p] for p in head['params']] == ['lm_head.weight'] and head['weight_decay'] == 0.1
    # train.py's scheduled learning_rate at half its peak: every group at half of its own peak
    assert [optim.group_lr(group, 5e-4, config) for group in optimizer.param_groups] == pytest.approx(
        [0.01, 0.15, 0.002, 5e-4])
    assert [optim.muon_momentum_at(it, config) for it in (0, 2, 4, 100)] == pytest.approx([0.85, 0.9, 0.95, 0.95])
    assert optim.muon_momentum_at(0, MUON) == 0.95  # no warmup: muon_momentum from the start
    # unset (0), each group follows learning_rate, as before the keys existed
    assert [optim.group_lr(group, 5e-4, MUON) for group in optimizer.param_groups] == pytest.approx(
        [0.01, 5e-4, 5e-4, 5e-4])


@pytest.mark.parametrize('optim_name', ['adamw', 'muon'])
def test_scalars_go_to_adamw_without_decay_and_value_tables_with_the_embeddings(optim_name):
    model = tiny_gpt(n_layer=4, value_embeds=2, unet_skips=True, x0_shortcut=True)
    config = {'optim': optim_name, 'learning_rate': 1e-3, 'weight_decay': 0.1, 'beta1': 0.9, 'beta2': 0.95,
              'muon_learning_rate': 0.02, 'muon_momentum': 0.95, 'embedding_learning_rate': 0.01,
              'head_learning_rate': 0.0, 'weight_dtype': 'float32', 'optimizer_in_backward': False}
    optimizer = optim.build_optimizer(model, config, 'cpu')
    names = {p: name for name, p in model.named_parameters()}
    groups = {names[p]: group for group in optimizer.param_groups for p in group['params']}
    scalars = [n for n in names.values() if n.endswith(('lambdas', 'skip_weights'))]
    assert len(scalars) == 1 + 4 + 4  # the skip weights, each block's x0 weights and each block's value weights
    for name in scalars:
        assert groups[name]['weight_decay'] == 0.0 and not groups[name].get('muon')
    for name in ('transformer.value_embeds.0.weight', 'transformer.value_embeds.1.weight'):
        assert groups[name] is groups['transformer.wte.weight'] and groups[name]['weight_decay'] == 0.1
        if optim_name == 'muon':
            assert groups[name]['lr'] == 0.01  # embedding_learning_rate


def test_muon_split_qkv_and_scalar_learning_rate_make_their_own_groups():
    """muon_split_qkv: the c_attn matrices in a Muon group of their own, split in 3; scalar_learning_rate: the mixing
    weights in an AdamW group of their own at that lr; groups left empty (no gains, no biases) are dropped."""
    model = tiny_gpt(n_layer=4, bias=False, norm='rmsnorm', norm_gain=False, tie_weights=False, unet_skips=True,
                     x0_shortcut=True, value_residual=True, value_embeds=1)
    config = {**MUON, 'weight_decay': 0.0, 'muon_split_qkv': True, 'muon_momentum_form': 'sum',
              'scalar_learning_rate': 0.04, 'embedding_learning_rate': 0.6, 'head_learning_rate': 0.008}
    optimizer = optim.build_optimizer(model, config, 'cpu')
    names = {p: name for name, p in model.named_parameters()}
    matrices, qkv, embeddings, head, scalars = ([names[p] for p in group['params']] for group in optimizer.param_groups)
    assert qkv == [f'transformer.h.{i}.attn.c_attn.weight' for i in range(4)]
    assert not any('c_attn' in name for name in matrices)
    assert [group.get('split', 1) for group in optimizer.param_groups[:2]] == [1, 3]
    assert all(group['momentum_form'] == 'sum' for group in optimizer.param_groups[:2])
    assert sorted(scalars) == sorted(n for n in names.values() if n.endswith(('lambdas', 'v1_lambda', 'skip_weights')))
    assert len(scalars) == 1 + 4 + 4 + 2  # skip weights; each block's x0 and value-residual weights; 2 value tables'
    assert [group['lr'] for group in optimizer.param_groups] == pytest.approx([0.02, 0.02, 0.6, 0.008, 0.04])
    train_steps(model, optimizer, 2)  # the split group steps


def test_a_checkpoint_of_torchs_muon_groups_resumes():
    """Groups saved before momentum_form and split existed (torch's Muon's keys only) load with their defaults."""
    model, optimizer = gpt_and_optimizer('muon')
    train_steps(model, optimizer, 2)
    saved = copy.deepcopy(optimizer.state_dict())  # not the live state tensors, which the next steps change
    for group in saved['param_groups']:
        group.pop('momentum_form', None), group.pop('split', None)
    resumed, resumed_optimizer = gpt_and_optimizer('muon')
    resumed.load_state_dict(model.state_dict())
    resumed_optimizer.load_state_dict(saved)
    train_steps(model, optimizer, 2, first=2)
    train_steps(resumed, resumed_optimizer, 2, first=2)
    assert_same_parameters(resumed, model)
