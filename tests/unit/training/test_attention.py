"""training/attention.py's FlexAttention path: the BlockMask equals local_attention_mask's token rule, the model's flex
forward and backward equal the masked attention's (through the CPU stand-in of the CUDA kernel, tests/flex_on_a_cpu.py),
the attention kind chosen, the kernel options for a GPU's shared memory and the probe. The other kinds are
tests/unit/test_model_options.py's."""
import types

import pytest
import torch

import flex_on_a_cpu
import model as model_lib
from helpers import tokens_with_documents
from model import GPT, GPTConfig, local_attention_mask
from training import attention
from training.attention import Kernels, flex_block_mask, flex_kernel_options, flex_probe, flex_tile_bytes
from training.opcount import OperatorCounter

# the GPUs' shared memory a thread block may use (cudaDevAttrMaxSharedMemoryPerBlockOptin)
H100, A100, RTX_3060 = 232448, 166912, 101376


def token_mask(block_mask, t):
    """(B, t, t) bool: the keys a BlockMask lets each query see as the kernels read it, its blocks expanded: a full
    block's every key, a partial block's where its mask_mod says so, none of the other blocks'."""
    def blocks(counts, indices):
        n = indices.size(-1)
        listed = torch.arange(n) < counts[:, 0, :, None].long()
        dense = torch.zeros(indices.size(0), indices.size(2), n, dtype=torch.bool)
        return dense.scatter_(-1, indices[:, 0].long(), listed)
    partial = blocks(block_mask.kv_num_blocks, block_mask.kv_indices)
    full = blocks(block_mask.full_kv_num_blocks, block_mask.full_kv_indices)
    assert not (partial & full).any(), 'a block both full and partial'
    size = block_mask.BLOCK_SIZE[0]
    q, k = torch.arange(t)[:, None], torch.arange(t)[None, :]
    rows = []
    for b in range(partial.size(0)):
        masked = block_mask.mask_mod(torch.tensor(b), torch.tensor(0), q, k)
        rows.append(full[b][q // size, k // size] | (partial[b][q // size, k // size] & masked))
    return torch.stack(rows)


def documents(layout, b, t):
    """(B, t) document ids for a named layout, nondecreasing along each row as a model's count of doc tokens."""
    if layout == 'one':
        return None
    starts = torch.zeros(b, t, dtype=torch.bool)
    if layout == 'mid-block':
        starts[:, [5, 21, 22, t - 1]] = True  # one starting inside a block, one of a single position, the last alone
    else:
        starts = torch.rand(b, t, generator=torch.Generator().manual_seed(t)) < 0.08
    return starts.long().cumsum(1)


@pytest.mark.parametrize('layout', ['one', 'mid-block', 'random'])
@pytest.mark.parametrize('t, window_blocks', [(64, 1), (64, 2), (100, 3), (37, 5), (128, 8)])
def test_block_mask_is_local_attention_masks_token_rule(layout, t, window_blocks):
    """Rows of whole blocks and of a part of one, windows of 1 block up to longer than the row, each row its own
    documents."""
    block = 8
    doc = documents(layout, 2, t)
    pos = torch.arange(t)
    expected = local_attention_mask(pos, pos, window_blocks * block, doc, doc, block)
    block_mask = flex_block_mask(doc, t, window_blocks, block)
    found = token_mask(block_mask, t)  # one row's mask for all without documents
    assert torch.equal(found.expand(2, t, t), expected.expand(2, t, t))
    q, k = torch.arange(t)[:, None], torch.arange(t)[None, :]  # and as FlexAttention computes it eagerly: mask_mod's
    assert all(torch.equal(block_mask.mask_mod(torch.tensor(b), torch.tensor(0), q, k), expected.expand(2, t, t)[b])
               for b in range(2))


def test_a_window_one_block_short_is_not_the_token_rule():
    t, block, window_blocks = 96, 8, 4
    doc = documents('mid-block', 1, t)
    pos = torch.arange(t)
    expected = local_attention_mask(pos, pos, window_blocks * block, doc, doc, block)
    short = flex_block_mask(doc, t, window_blocks - 1, block)
    assert not torch.equal(token_mask(short, t), expected)
    assert not torch.equal(short.mask_mod(torch.tensor(0), torch.tensor(0), pos[:, None], pos[None, :]), expected[0])


@pytest.mark.parametrize('layout', ['one', 'random'])
def test_block_mask_is_made_on_the_gpu_without_waiting_for_it(layout):
    """Each forward's BlockMask, on the meta device standing for a GPU: made there from the documents' ids, no copy
    from the host and no value read back (a wait of the CPU for the GPU in every micro-step)."""
    doc = documents(layout, 2, 1000)
    with OperatorCounter(gpu='meta') as counter:
        flex_block_mask(None if doc is None else doc.to('meta', non_blocking=True), 1000, 3, 128, 'meta')
    assert sum(counter.counts.values()) > 0 and sum(counter.waits.values()) == 0


def test_full_blocks_are_the_earlier_blocks_of_one_document():
    """A full block is computed without its mask: only blocks before the query's, both of one and the same
    document, are full."""
    t, block = 64, 8
    doc = torch.zeros(1, t, dtype=torch.long)
    doc[:, 20:] = 1  # the second document starts inside block 2
    mask = flex_block_mask(doc, t, 8, block)
    full = {(q, int(k)) for q in range(8) for k in mask.full_kv_indices[0, 0, q, :mask.full_kv_num_blocks[0, 0, q]]}
    assert full == {(1, 0), *((q, k) for q in range(4, 8) for k in range(3, q))}


SPEEDRUN_LIKE = dict(n_layer=3, n_head=2, n_embd=32, vocab_size=64, bias=False, pos_emb='rope', norm='rmsnorm',
                     qk_norm=True, mlp='relu2', tie_weights=False, logit_softcap=15.0, value_embeds=1, unet_skips=True,
                     x0_shortcut=True, embed_norm=True, norm_gain=False, value_scale=True, no_attn_layer=1,
                     rope_truncated=True, block_size=384, attn_window=256, attn_window_block=128, doc_token=3)


def loss_and_grads(model, x):
    model.zero_grad(set_to_none=True)
    _, loss = model(x, x)
    loss.backward()
    return loss.item(), {name: p.grad.clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize('t', [384, 300], ids=['whole blocks', 'a part of a block'])
def test_flex_training_step_equals_the_masked_attentions(monkeypatch, t):
    """The speedrun model scaled down (windows of 2 blocks of 128, documents), on FlexAttention's operator: the loss
    and every gradient of the masked attention's, in fp32."""
    monkeypatch.setattr(attention, 'compiled_flex_attention', lambda: flex_on_a_cpu.flex_attention)
    x = tokens_with_documents((2, t), 1, every=300)  # documents longer than the window: full blocks, and cut off
    torch.manual_seed(0)
    flex = GPT(GPTConfig(**SPEEDRUN_LIKE), kernels=Kernels(flex=True))
    masked = GPT(GPTConfig(**SPEEDRUN_LIKE), kernels=Kernels(flex=False))
    masked.load_state_dict(flex.state_dict())
    for model in (flex, masked):  # the zero-initialized projections and head would hide attention from the loss
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                torch.nn.init.normal_(p, generator=torch.Generator().manual_seed(len(name)), std=p.size(-1) ** -0.5)
    calls = len(flex_on_a_cpu.calls)
    (flex_loss, flex_grads), (masked_loss, masked_grads) = loss_and_grads(flex, x), loss_and_grads(masked, x)
    assert len(flex_on_a_cpu.calls) - calls == 2  # the two layers with attention, in the flex model only
    assert flex_loss == pytest.approx(masked_loss, rel=1e-6)
    for name, grad in masked_grads.items():
        torch.testing.assert_close(flex_grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)


def kinds(config, x, monkeypatch, training=False, **kernels):
    """The kinds of attention a forward of a GPT of `config` with Kernels(**kernels) runs in its layers."""
    chosen = []
    model = GPT(GPTConfig(**config), kernels=Kernels(**kernels)).train(training)
    original = model_lib.attend
    monkeypatch.setattr(model_lib, 'attend', lambda q, k, v, a, cache, p: chosen.append(attention.kind(a)) or
                        original(q, k, v, a, cache, p))
    with torch.no_grad():
        model(x)
    monkeypatch.setattr(model_lib, 'attend', original)
    return set(chosen)


def test_flex_runs_windows_in_blocks_of_a_multiple_of_128_without_dropout(monkeypatch):
    monkeypatch.setattr(attention, 'compiled_flex_attention', lambda: flex_on_a_cpu.flex_attention)
    x = tokens_with_documents((1, 384), 0, every=90)
    assert kinds(SPEEDRUN_LIKE, x, monkeypatch, flex=True) == {'flex'}
    assert kinds(SPEEDRUN_LIKE, x, monkeypatch) == {'window'}  # on a CPU, unless asked (the estimator's trace, tests)
    assert kinds(SPEEDRUN_LIKE, x, monkeypatch, flex=False) == {'window'}
    in_blocks_of_64 = {**SPEEDRUN_LIKE, 'attn_window_block': 64, 'attn_window': 256}
    assert kinds(in_blocks_of_64, x, monkeypatch, flex=True) == {'window'}
    assert kinds({**SPEEDRUN_LIKE, 'n_embd': 48, 'n_head': 2}, x, monkeypatch, flex=True) == {'window'}  # heads of 24
    assert kinds({**SPEEDRUN_LIKE, 'dropout': 0.1}, x, monkeypatch, training=True, flex=True) == {'window'}
    assert kinds({**SPEEDRUN_LIKE, 'dropout': 0.1}, x, monkeypatch, flex=True) == {'flex'}  # evaluation: no dropout
    assert kinds(SPEEDRUN_LIKE, x[:, :256], monkeypatch, flex=True) == {'window'}  # within the window: no block to skip


def test_torchs_tiles_where_the_gpu_has_the_shared_memory_for_them():
    for shared in (H100, A100):
        assert flex_kernel_options(types.SimpleNamespace(shared_memory_per_block_optin=shared), 128) == ({},)


@pytest.mark.parametrize('head_size', [64, 128, 256])
def test_consumer_cards_get_tiles_that_fit_their_shared_memory_then_the_smallest(head_size):
    """An RTX 3060's 99 KiB a block: the fastest tiles whose estimate fits (torch's forward tiles need 128 KiB at
    head size 128, Triton's own figure), then the smallest as the probe's fallback; each a valid tiling of 128."""
    choices = flex_kernel_options(types.SimpleNamespace(shared_memory_per_block_optin=RTX_3060), head_size)
    assert flex_tile_bytes(128, 64, 3, 128) == 131072 > RTX_3060
    assert 1 <= len(choices) <= 2 and choices[-1]['fwd_BLOCK_M'] == attention.FLEX_FORWARD_TILES[-1][0]
    for options in choices:
        assert flex_tile_bytes(options['fwd_BLOCK_M'], options['fwd_BLOCK_N'], options['fwd_num_stages'],
                               head_size) <= RTX_3060 or options is choices[-1]
        assert flex_tile_bytes(options['bwd_BLOCK_N1'], options['bwd_BLOCK_M1'], options['bwd_num_stages'],
                               head_size) <= RTX_3060 or options is choices[-1]
        assert all(128 % options[key] == 0 for key in options if 'BLOCK' in key)
        assert options['bwd_BLOCK_N1'] % options['bwd_BLOCK_M1'] == 0
        assert options['bwd_BLOCK_M2'] % options['bwd_BLOCK_N2'] == 0
    if head_size == 128:
        assert (choices[0]['fwd_BLOCK_M'], choices[0]['fwd_BLOCK_N'], choices[0]['fwd_num_stages']) == (128, 64, 2)


def test_probe_runs_the_kernel_forward_and_backward_or_says_why_not(monkeypatch):
    monkeypatch.setattr(attention, 'compiled_flex_attention', lambda: flex_on_a_cpu.flex_attention)
    options = flex_kernel_options(types.SimpleNamespace(shared_memory_per_block_optin=RTX_3060), 16)[0]
    assert flex_probe('cpu', 2, 16, torch.float32, 128, options) is None
    assert flex_probe('cpu', 2, 16, torch.float32, 128, {'fwd_BLOCK_M': 256}) == \
        'RuntimeError: BLOCK_M=256 does not divide the BlockMask block size (128, 128)'

    def out_of_resources(*args, **kwargs):
        raise RuntimeError('No valid triton configs.\nOutOfMemoryError: out of resource: shared memory')
    monkeypatch.setattr(attention, 'compiled_flex_attention', lambda: out_of_resources)
    assert flex_probe('cpu', 2, 16, torch.float32, 128, {}) == 'RuntimeError: No valid triton configs.'
