"""optim='muon': torch's Muon on the transformer blocks' matrices and AdamW on the rest, as one optimizer. Its groups
hold exactly the blocks' 2-D matrices; its steps are torch's Muon's and AdamW's, also through GradScaler and in
backward; its state dict resumes exactly; the estimator traces its smaller state; train.py refuses what it cannot
run with one line, resumes exactly, and trains on 2 processes under ddp and zero1 as on one."""
import io

import pytest
import torch

import estimate_memory
from helpers import (PARALLEL_ARGS, TINY_ARGS, assert_same_losses, logged_losses, run_script, tiny_gpt, torchrun,
                     train, train_steps)
from training import optim
from training.errors import ConfigError
from training.memory import estimate as em

BLOCK_MATRICES = ('attn.c_attn.weight', 'attn.c_proj.weight', 'mlp.c_fc.weight', 'mlp.c_proj.weight')


OPTIMIZER = dict(learning_rate=1e-2, weight_decay=0.1, beta1=0.9, beta2=0.95, weight_dtype='float32',
                 optimizer_in_backward=False)
MUON = dict(OPTIMIZER, optim='muon', learning_rate=1e-3, muon_learning_rate=0.02, muon_momentum=0.95)


def gpt_and_optimizer(optim_name='adamw', in_backward=False):
    """A 2-layer GPT whose weight matrices all have >= 4096 elements (torchao quantizes those), and train.py's
    optimizer of it; with biases under Muon, so the blocks hold 1-D parameters too."""
    model = tiny_gpt(n_embd=64, vocab_size=96, bias=optim_name == 'muon')
    config = {**(MUON if optim_name == 'muon' else OPTIMIZER), 'optim': optim_name, 'optimizer_in_backward': in_backward}
    return model, optim.build_optimizer(model, config, 'cpu')


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


@pytest.mark.parametrize('scaled', [False, True])
def test_steps_equal_torchs_muon_and_adamw_on_the_same_groups(scaled):
    """Also through GradScaler (fp16's; its power-of-two scale unscales exactly), which steps it as any optimizer."""
    model, optimizer = gpt_and_optimizer('muon')
    reference, _ = gpt_and_optimizer('muon')
    groups = optim.muon_param_groups(reference, MUON)
    muon = torch.optim.Muon(groups[:1], lr=0.02, momentum=0.95)
    adamw = torch.optim.AdamW(groups[1:], lr=1e-3, betas=(0.9, 0.95))
    scalers = [torch.amp.GradScaler('cpu') if scaled else None for _ in range(2)]
    train_steps(model, [optimizer], 3, scaler=scalers[0])
    train_steps(reference, [muon, adamw], 3, scaler=scalers[1])
    assert_same_parameters(model, reference)
    for p, q in zip(model.parameters(), reference.parameters()):
        expected = (muon.state if q in muon.state else adamw.state)[q]
        assert optimizer.state[p].keys() == expected.keys()
        assert all(torch.equal(optimizer.state[p][k], v) for k, v in expected.items())


def test_state_dict_resumes_exactly():
    """Torch's layout, both optimizers' state in one dict (Muon's momentum for the matrices, AdamW's moments for the
    rest), through torch.save and a weights_only load as train.py's checkpoint; the resumed steps repeat."""
    model, optimizer = gpt_and_optimizer('muon')
    train_steps(model, [optimizer], 2)
    buffer = io.BytesIO()
    torch.save({'model': model.state_dict(), 'optimizer': optimizer.state_dict()}, buffer)
    train_steps(model, [optimizer], 3, first=2)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    kinds = {frozenset(state) for state in saved['optimizer']['state'].values()}
    assert kinds == {frozenset(['momentum_buffer']), frozenset(['step', 'exp_avg', 'exp_avg_sq'])}
    resumed, resumed_optimizer = gpt_and_optimizer('muon')
    resumed.load_state_dict(saved['model'])
    resumed_optimizer.load_state_dict(saved['optimizer'])
    train_steps(resumed, [resumed_optimizer], 3, first=2)
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


def test_estimator_traces_4_bytes_a_matrix_parameter(weighty):
    adamw, muon = (em.trace({**weighty, 'optim': name}, evaluate=False)['train'] for name in ('adamw', 'muon'))
    model = em.build({**weighty, 'optim': 'muon'}, False)[0]
    matrices = sum(p.numel() for p in model.transformer.h.parameters() if p.dim() == 2)
    rest = sum(p.numel() for p in model.parameters()) - matrices
    assert adamw['breakdown']['optimizer_state'] == pytest.approx(8 * (matrices + rest), rel=0.01)
    assert muon['breakdown']['optimizer_state'] == pytest.approx(4 * matrices + 8 * rest, rel=0.01)
    assert muon['peak_bytes'] < adamw['peak_bytes']
    zero1 = em.trace({**weighty, 'optim': 'muon', 'world_size': 2, 'parallelism': 'zero1'}, evaluate=False)['train']
    assert zero1['breakdown']['optimizer_state'] < 0.75 * muon['breakdown']['optimizer_state']


def test_estimate_memory_reports_muon(weighty):
    config = {**weighty, 'optim': 'muon'}
    text = estimate_memory.report(config, em.estimate(config))
    assert "Muon for the blocks' matrices, fused AdamW for the rest" in text


@pytest.mark.slow
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


@pytest.mark.slow
def test_train_under_compile_as_eager(data_dir, tmp_path):
    args = ['--max_iters=4', '--eval_interval=4']
    eager = train(data_dir, tmp_path / 'eager', '--optim=muon', *args)
    compiled = train(data_dir, tmp_path / 'compiled', '--optim=muon', *args, '--compile=True')
    assert eager.returncode == 0 and compiled.returncode == 0, compiled.stderr
    assert logged_losses(compiled.stdout) == pytest.approx(logged_losses(eager.stdout), rel=1e-4)


@pytest.mark.slow
def test_fsdp_is_refused_with_one_line(data_dir, tmp_path):
    result = torchrun(*TINY_ARGS, f'--data_dir={data_dir}', f'--out_dir={tmp_path / "out"}', '--optim=muon',
                      '--gradient_accumulation_steps=2', '--parallelism=fsdp')
    assert result.returncode != 0 and not (tmp_path / 'out').exists()
    errors = [line for line in result.stderr.splitlines() if line.startswith('error: ')]
    assert errors == ["error: optim='muon' orthogonalizes each whole weight matrix, which parallelism='fsdp' splits "
                      "over the processes: use --parallelism=zero1 (Muon's state is sharded there too) or ddp, or "
                      "another --optim with fsdp"]


@pytest.mark.slow
def test_two_processes_under_ddp_and_zero1_match_one(data_dir, tmp_path):
    """The same global batch (2 micro-batches) on one process and on two; zero1's checkpoint, gathered from both
    ranks' shares, resumes in one process with the uninterrupted run's losses."""
    args = [*PARALLEL_ARGS, f'--data_dir={data_dir}', '--optim=muon']
    single = run_script('train.py', *args, f'--out_dir={tmp_path / "single"}', '--max_iters=6')
    assert single.returncode == 0, single.stderr
    for mode in ('ddp', 'zero1'):
        result = torchrun(*args, f'--out_dir={tmp_path / mode}', '--max_iters=4', f'--parallelism={mode}')
        assert result.returncode == 0, f'{mode}: {result.stderr[-3000:]}'
        assert_same_losses(result.stdout, single.stdout, 'iter', range(5))
        assert_same_losses(result.stdout, single.stdout, 'step', (0, 2, 4))
    resumed = run_script('train.py', *args, f'--out_dir={tmp_path / "zero1"}', '--max_iters=6', '--init_from=resume')
    assert resumed.returncode == 0, resumed.stderr
    assert_same_losses(resumed.stdout, single.stdout, 'iter', range(4, 7))


@pytest.mark.slow
def test_bench_optim_prints_both_curves_and_the_state_bytes(data_dir):
    """bench_optim.py on the tiny character set, a few steps: both curves from the same initial loss, and Muon's
    state for the blocks' matrices half of AdamW's (the step counters aside)."""
    result = run_script('bench_optim.py', f'--data_dir={data_dir}', '--dataset=tiny_char', '--n_layer=1',
                        '--n_head=2', '--n_embd=32', '--block_size=16', '--batch_size=4', '--max_iters=4',
                        '--eval_interval=2', '--eval_iters=2', '--lr_decay_iters=4', '--warmup_iters=1')
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    header = lines.index('step         adamw        muon')
    rows = [line.split() for line in lines[header + 1:header + 4]]
    assert [row[0] for row in rows] == ['0', '2', '4'] and rows[0][1] == rows[0][2]
    state = {line.split(':')[0]: line for line in lines[header + 4:]}
    matrix_bytes = {name: int(text.split("blocks' matrices ")[1].split(' ')[0].replace(',', ''))
                    for name, text in state.items()}
    assert matrix_bytes['adamw'] == 2 * matrix_bytes['muon'] + 4 * 4  # AdamW's 4 scalar step counters


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
