"""training/memory/estimate.py: its breakdown, each lever (parallelism, checkpointing, the autocast cache, resume, the
optimizers, bf16 weights). Tiny models, and one block of GPT-2's width and
vocabulary for the loss path (GPT-2 124M itself, and the estimate against the real train.py's peak:
tests/e2e/test_estimate_memory.py)."""
import contextlib
import importlib.util

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from conftest import estimator_config
from helpers import check_only_the_naive_loss_holds_the_logits, gpt2_estimator_config
from training import configurator, optim, optimizers, record2026
from training.checkpoint import save_checkpoint
from training.errors import ConfigError
from training.memory import estimate as em
from training.memory.tracer import CUDA_ALIGNMENT, MemoryTracer


GIB = 2 ** 30
needs_torchao = pytest.mark.skipif(importlib.util.find_spec('torchao') is None,
                                   reason='adamw_8bit needs torchao: pip install -r requirements-dev.txt')


def test_breakdown_sums_to_peak_and_names_the_parts(tiny):
    result = em.trace(tiny)
    for phase in ('train', 'eval'):
        assert sum(result[phase]['breakdown'].values()) == result[phase]['peak_bytes']
    breakdown = result['train']['breakdown']
    params = sum(p.numel() for p in em.build(tiny)[0].parameters())
    assert breakdown['parameters'] >= 4 * params and breakdown['optimizer_state'] >= 8 * params
    assert breakdown['gradients'] >= 4 * params  # 2 micro-steps: the gradients exist during the 2nd forward
    assert breakdown['activations'] > 0 and breakdown['ddp_gradient_buckets'] == 0


def test_ddp_adds_a_copy_of_the_gradients(tiny):
    tiny = {**tiny, 'gradient_accumulation_steps': 4}  # 2 micro-steps per rank either way
    single = em.trace(tiny, evaluate=False)['train']
    ddp = em.trace({**tiny, 'world_size': 2}, evaluate=False)['train']
    params = sum(p.numel() for p in em.build(tiny)[0].parameters())
    assert ddp['breakdown']['ddp_gradient_buckets'] == pytest.approx(4 * params, abs=512)
    assert ddp['peak_bytes'] - single['peak_bytes'] == ddp['breakdown']['ddp_gradient_buckets']


def test_zero1_and_fsdp_split_the_per_rank_state_over_the_ranks(tiny):
    """Rank 0's share, traced through the real sharding code over a stand-in process group, one micro-step a rank
    (FSDP over several: test_fsdp_mixed_precision_gathers_the_weights_in_half_the_bytes)."""
    tiny = {**tiny, 'gradient_accumulation_steps': 1, 'n_layer': 3}  # FSDP gathers a block or two at a time
    params = sum(p.numel() for p in em.build(tiny)[0].parameters())
    single = em.trace(tiny, evaluate=False)['train']
    for parallelism in ('zero1', 'fsdp'):
        peaks, weights = [], []
        for world_size in (2, 4):
            result = em.trace({**tiny, 'world_size': world_size, 'gradient_accumulation_steps': world_size,
                               'parallelism': parallelism}, evaluate=False)
            breakdown = result['train']['breakdown']
            assert result['parallelism'] == parallelism
            # AdamW's two fp32 moments: rank 0 holds about its 1/world_size share, a tensor or a row more at most
            assert 8 * params / world_size <= breakdown['optimizer_state'] < 8 * params / world_size * 1.5
            if parallelism == 'fsdp':  # no DDP bucket copy of the gradients
                assert breakdown['ddp_gradient_buckets'] == 0
            peaks.append(result['train']['peak_bytes'])
            weights.append(breakdown['parameters'])
        assert peaks[1] < peaks[0]
        if parallelism == 'fsdp':  # shards plus the blocks gathered at the peak
            assert weights[1] < weights[0] and weights[1] < 4 * params
            assert peaks[0] < single['peak_bytes']


def test_fsdp_mixed_precision_gathers_the_weights_in_half_the_bytes(tiny):
    """Through the real fully_shard with its MixedPrecisionPolicy: the shards stay fp32 (as does the optimizer state);
    the blocks gathered at the peak are bf16."""
    tiny = {**tiny, 'gradient_accumulation_steps': 4, 'n_layer': 2, 'dtype': 'bfloat16', 'parallelism': 'fsdp',
            'world_size': 2}
    fp32, bf16 = (em.trace({**tiny, 'fsdp_mixed_precision': on}, evaluate=False)['train'] for on in (False, True))
    shards = sum(p.numel() for p in em.build(tiny)[0].parameters()) * 4 / 2  # about rank 0's fp32 share
    gathered_fp32, gathered_bf16 = (r['breakdown']['parameters'] - shards for r in (fp32, bf16))
    assert 0.45 * gathered_fp32 < gathered_bf16 < 0.6 * gathered_fp32
    assert bf16['breakdown']['optimizer_state'] == fp32['breakdown']['optimizer_state']
    assert bf16['peak_bytes'] < fp32['peak_bytes']


def test_activation_checkpointing_lowers_the_traced_activations(tiny):
    tiny = {**tiny, 'n_layer': 4, 'batch_size': 8}  # enough blocks that their saved activations dominate
    plain, checkpointed = (em.trace({**tiny, 'activation_checkpointing': on}, evaluate=False, warm_start=True)['train']
                           for on in (False, True))
    assert checkpointed['breakdown']['activations'] < plain['breakdown']['activations'] / 2
    assert checkpointed['peak_bytes'] < plain['peak_bytes']


def test_attention_dropout_is_traced_as_cudas_kernels_apply_it(tiny):
    """CUDA's attention kernels apply dropout inside, keeping no (T, T) matrix of attention weights, where a CPU's
    math kernel would: the trace keeps, beyond a run without dropout, only the other dropouts' masks."""
    config = {**tiny, 'block_size': 256, 'n_embd': 32}  # a (T, T) matrix outweighs a layer's (T, C) activations
    plain, dropped = (em.trace({**config, 'dropout': p}, evaluate=False, warm_start=True)['train']['breakdown']
                      for p in (0.0, 0.1))
    weights = config['batch_size'] * config['n_head'] * 256 * 256 * 4  # one layer's attention weights, fp32
    assert 0 < dropped['activations'] - plain['activations'] < weights


def test_windowed_documents_trace_cudas_flash_kernel_not_the_cpus_masked_blocks(tiny):
    """On CUDA in bf16, attn_window and doc_token run FlashAttention's variable-length kernel, which keeps what causal
    attention keeps, give or take a layout copy; a CPU computes the windows in blocks, its padded keys and values and
    masks kept as well."""
    packed = {**tiny, 'dtype': 'bfloat16', 'pos_emb': 'rope', 'block_size': 64, 'attn_window': 16, 'doc_token': 0}
    cuda, cpu = (em.trace(packed, evaluate=False, warm_start=True, device_type=device)['train']['breakdown']
                 for device in ('cuda', 'cpu'))
    plain = em.trace({**packed, 'attn_window': 0, 'doc_token': -1}, evaluate=False, warm_start=True)['train']
    assert cuda['activations'] == pytest.approx(plain['breakdown']['activations'], rel=0.05)
    assert cuda['activations'] < cpu['activations']


def test_windows_in_blocks_trace_flexattentions_kernel_unless_masked_is_asked(tiny):
    """On CUDA windows in blocks run FlexAttention's kernel, which keeps its output and a logsumexp, not the masked
    attention's (w, 2w) additive mask and padded blocks; attention_kernel='masked' traces those."""
    windowed = {**tiny, 'dtype': 'bfloat16', 'pos_emb': 'rope', 'block_size': 384, 'batch_size': 1,
                'attn_window': 256, 'attn_window_block': 128, 'doc_token': 0}
    flex, masked = (em.trace({**windowed, 'attention_kernel': kernel}, evaluate=False, warm_start=True)['train']
                    for kernel in ('auto', 'masked'))
    def window_masks(trace):  # the masked attention's (w, 2w) scores of a block: its mask among them
        return [a for a in trace['largest_allocations'] if a['shape'][-2:] == [256, 512]]
    assert window_masks(masked) and not window_masks(flex)
    assert flex['breakdown']['activations'] < masked['breakdown']['activations']


def record_config(data_dir, **keys):
    """estimate_memory.py's config of a gpt2026.py model at the record's depth, 32 wide, rows of 256 tokens."""
    return estimator_config(data_dir, 64, model_file='gpt2026.py', n_layer=11, n_head=2, n_embd=32, doc_token=0,
                            block_size=256, batch_size=1, gradient_accumulation_steps=1, grad_clip=0.0,
                            max_iters=1600, dtype='bfloat16', **keys)


def test_a_record_model_is_traced_at_its_largest_stage_on_the_varlen_kernel(tmp_path, monkeypatch):
    """model_file='gpt2026.py' traced after the split at the last batch size (warm-started: as two iterations,
    tests/e2e/test_estimate_memory.py): the embedding's gradient and NorMuonAdam's whole state, Adam's for the
    embedding among it (counted from a real step), 2 of the stage's 3 micro-steps; each attention layer in
    FlashAttention's varlen kernel (its documents, one a row in the trace), without a (T, T) mask."""
    config, segmented = record_config(tmp_path), []
    rows_as_documents = em.rows_as_documents
    monkeypatch.setattr(em, 'rows_as_documents', lambda *args: segmented.append(1) or rows_as_documents(*args))
    em.check_config(config)
    result = em.trace(config, evaluate=False, warm_start=True)
    model, optimizer = em.build(config)
    optimizer.schedule(record2026.SPLIT_STEP)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()
    record2026.split_embedding(model, optimizer)
    state = sum(-(-t.nbytes // CUDA_ALIGNMENT) * CUDA_ALIGNMENT  # each tensor in whole blocks of the allocator's
                for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t))
    train = result['train']
    assert result['model']['n_layer'] == 11 and result['micro_steps_traced'] == 2
    assert train['breakdown']['optimizer_state'] == state
    assert train['breakdown']['gradients'] >= 4 * sum(p.numel() for p in model.parameters())
    assert len(segmented) == 2  # the forward's two layouts of the heads (single, paired), not each of its 10 layers
    assert not [a for a in train['largest_allocations'] if a['shape'][-2:] == [256, 256]]


def test_resume_takes_the_model_from_the_checkpoint(tiny, tmp_path):
    model_args = dict(n_layer=3, n_head=2, n_embd=32, block_size=16, bias=False, vocab_size=100, dropout=0.0)
    save_checkpoint({'model': {}, 'model_args': model_args}, str(tmp_path / 'out'))
    shape = {key: configurator.train_defaults()[key] for key in ('n_layer', 'n_head', 'n_embd', 'bias')}  # unset
    config = {**tiny, **shape, 'init_from': 'resume', 'out_dir': str(tmp_path / 'out'), 'block_size': 16}
    model = em.trace(config, evaluate=False)['model']
    assert {k: model[k] for k in ('n_layer', 'n_embd', 'block_size', 'vocab_size', 'bias')} == \
        dict(n_layer=3, n_embd=32, block_size=16, vocab_size=100, bias=False)
    with pytest.raises(ConfigError, match='no checkpoint at'):
        em.trace({**config, 'out_dir': str(tmp_path / 'missing')})


def test_naive_loss_builds_the_full_logits_and_chunked_does_not():
    """GPT-2's width and vocabulary in one block, at micro-batch 8 (786 MiB of logits) in chunks of 128 MiB; GPT-2 124M
    at batch 64, the seeds' 6.14 GiB of logits: tests/e2e/test_estimate_memory.py."""
    check_only_the_naive_loss_holds_the_logits(8, n_layer=1, loss_chunk_mib=128)


def test_gpt2_at_batch_12_peaks_at_most_7_gib_with_the_default_loss_budget():
    """GPT-2 124M at batch 12 x 1024, bf16: 4 chunks of the default 1 GiB budget (what keeps its operators near
    nanoGPT's: tests/unit/training/test_opcount.py) peak at most 7 GiB, nanoGPT's loss about 11.7; --ladder's
    128 MiB rung less."""
    peaks = {mib: em.trace(gpt2_estimator_config(12, loss_chunk_mib=mib), evaluate=False,
                           warm_start=True)['train']['peak_bytes'] for mib in (1024, 128)}
    assert peaks[128] < peaks[1024] <= 7 * GIB


@pytest.mark.parametrize('overrides', [
    {'gradient_accumulation_steps': 1}, {'gradient_accumulation_steps': 2},
    {'gradient_accumulation_steps': 4, 'activation_checkpointing': True},
    {'gradient_accumulation_steps': 1, 'grad_clip': 0.0, 'optimizer_in_backward': True},
    {'dtype': 'bfloat16', 'weight_dtype': 'bfloat16', 'optim': 'adamw_bf16'},
    {'dtype': 'bfloat16', 'activation_checkpointing': True, 'autocast_cache': True},
], ids=lambda overrides: ','.join(f'{k}={v}' for k, v in overrides.items()))
def test_warm_start_trace_has_the_same_peak_as_two_full_iterations(tiny, overrides):
    config = {**tiny, 'n_layer': 1, **overrides}  # what warm_start skips is in every block alike: one is enough
    full = em.trace(config, evaluate=False)['train']
    warm = em.trace(config, evaluate=False, warm_start=True)['train']
    assert (warm['peak_bytes'], warm['breakdown']) == (full['peak_bytes'], full['breakdown'])


@pytest.mark.parametrize('overrides', [
    {'optimizer_in_backward': True},
    {'optimizer_in_backward': True, 'optim': 'adamw_bf16'},  # sliced: its warm-up steps make states, run no update
    pytest.param({'optimizer_in_backward': True, 'optim': 'adamw_8bit', 'weight_dtype': 'bfloat16',
                  'dtype': 'bfloat16'}, marks=needs_torchao),
    {'optim': 'adamw_bf16'},  # the first step, every gradient held, is the peak: traced in full
], ids=lambda overrides: ','.join(f'{k}={v}' for k, v in overrides.items()))
def test_warm_start_where_the_weights_training_state_dominates(weighty, overrides):
    """Where the weights' training state dominates, the optimizer step is the peak, or all the gradients at once
    would be: the step in backward never holds them. One block: each parameter's warm-up is alike."""
    config = {**weighty, 'n_layer': 1, **overrides}
    full = em.trace(config, evaluate=False)['train']
    warm = em.trace(config, evaluate=False, warm_start=True)['train']
    assert (warm['peak_bytes'], warm['breakdown']) == (full['peak_bytes'], full['breakdown'])


def test_autocast_cache_holds_a_copy_of_the_weights_that_off_frees(tiny):
    """autocast's cache keeps the bf16 cast of every weight through the forward; with checkpointing nothing else
    holds them (backward recomputes the block), so with the cache off they are gone at the peak, as in evaluation."""
    config = {**tiny, 'dtype': 'bfloat16', 'activation_checkpointing': True, 'n_layer': 4}
    cached, uncached = (em.trace({**config, 'autocast_cache': on}, warm_start=True) for on in (True, False))
    matrices = sum(p.numel() for name, p in em.build(config)[0].named_parameters()
                   if p.dim() == 2 and name.startswith('transformer.h.'))
    assert cached['train']['breakdown']['weight_copies'] >= 2 * matrices  # the blocks' matrices in bf16
    assert uncached['train']['breakdown']['weight_copies'] < cached['train']['breakdown']['weight_copies'] / 4
    assert uncached['train']['peak_bytes'] < cached['train']['peak_bytes']  # the peak moves to backward
    # evaluation keeps nothing for backward: off, its peak is the cached one without the copies
    assert uncached['eval']['peak_bytes'] == cached['eval']['peak_bytes'] - cached['eval']['breakdown']['weight_copies']


@needs_torchao
def test_estimator_reflects_each_lever(weighty, monkeypatch):
    # the non-fused steps' temporaries are one chunk's: small chunks keep them small beside this model's state (a
    # quarter of its (1024, 256) matrices: smaller ones take many more ops to trace)
    monkeypatch.setattr(optimizers, 'CHUNK_ELEMENTS', 2 ** 16)
    def traced(**overrides):  # one block: the state's share of the peak is as large, in half the ops
        return em.trace({**weighty, 'n_layer': 1, **overrides}, evaluate=False)['train']
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


@pytest.mark.parametrize('name, weight_dtype', [('adamw_bf16', torch.float32), ('adamw', torch.bfloat16),
                                                pytest.param('adamw_8bit', torch.bfloat16, marks=needs_torchao)])
def test_representative_updates_trace_the_peak_of_every_update(monkeypatch, name, weight_dtype):
    """The first step (which creates the states as it goes) and a second one, updating only the last parameter of
    each shape and its representative chunks, against every parameter and chunk."""
    # chunks of 100 blocks of 256: a short last chunk after 11 full ones, in each matrix; each shape twice
    monkeypatch.setattr(optimizers, 'CHUNK_ELEMENTS', 100 * 256)
    optimizers.warm_up(name)

    def traced_steps(updates):
        tracer = MemoryTracer()
        with FakeTensorMode(), tracer, updates:
            model = torch.nn.Sequential(*(torch.nn.Linear(*shape, bias=False, dtype=weight_dtype)
                                          for shape in [(1000, 300), (300, 1000), (1000, 300), (300, 1000)]))
            optimizer = optim.optimizer_class(name, str(weight_dtype).removeprefix('torch.'))(model.parameters())
            tracer.watch(model, optimizer)
            for p in model.parameters():
                p.grad = torch.zeros_like(p)
            optimizer.step()  # the first step makes the states
            first = tracer.phase_result()
            tracer.reset_peak()
            optimizer.step()
            return first, tracer.phase_result()
    assert traced_steps(optimizers.representative_updates_only()) == traced_steps(contextlib.nullcontext())


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


def test_estimator_traces_4_bytes_a_matrix_parameter(weighty):
    adamw, muon = (em.trace({**weighty, 'optim': name}, evaluate=False)['train'] for name in ('adamw', 'muon'))
    model = em.build({**weighty, 'optim': 'muon'})[0]
    matrices = sum(p.numel() for p in model.transformer.h.parameters() if p.dim() == 2)
    rest = sum(p.numel() for p in model.parameters()) - matrices
    assert adamw['breakdown']['optimizer_state'] == pytest.approx(8 * (matrices + rest), rel=0.01)
    assert muon['breakdown']['optimizer_state'] == pytest.approx(4 * matrices + 8 * rest, rel=0.01)
    assert muon['peak_bytes'] < adamw['peak_bytes']
    zero1 = em.trace({**weighty, 'optim': 'muon', 'world_size': 2, 'parallelism': 'zero1',
                      'gradient_accumulation_steps': 2}, evaluate=False)['train']  # a micro-step a rank, as train.py
    assert zero1['breakdown']['optimizer_state'] < 0.75 * muon['breakdown']['optimizer_state']


def test_a_record_model_under_zero1_holds_its_share_of_the_state_and_no_ddp_buckets(tmp_path):
    """gpt2026.py's optimizer sums the gradients over the processes in place (record2026.sum_over_processes), with no
    DDP wrapper, whose buckets model.py's GPT has (test_ddp_adds_a_copy_of_the_gradients); under zero1 rank 0 holds
    the state of its share of the parameters (record2026.owners: its whole ones, and its half of the rows of Adam's
    sliced ones), the embedding's too after the split."""
    config = {**record_config(tmp_path), 'gradient_accumulation_steps': 2, 'world_size': 2, 'parallelism': 'zero1'}
    double = em.trace(config, evaluate=False, warm_start=True)
    assert double['world_size'] == 2 and double['train']['breakdown']['ddp_gradient_buckets'] == 0
    optimizer = em.build({**config, 'world_size': 1})[1]
    owner = record2026.owners(optimizer.param_groups, 2)
    share = [-(-v.nbytes // CUDA_ALIGNMENT) * CUDA_ALIGNMENT  # as the caching allocator rounds each
             for group in optimizer.param_groups for p in group['params'] if owner[p] in (0, record2026.SLICED)
             for v in optimizer.initial_state(p if owner[p] == 0 else p[:p.size(0) // 2], group).values()
             if torch.is_tensor(v)]
    assert double['train']['breakdown']['optimizer_state'] == sum(share)
