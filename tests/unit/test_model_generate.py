"""GPT.generate with its KV cache: the tokens of nanoGPT's generate, greedy and sampled, across block_size, while each
position within block_size runs through the model once."""
import pytest
import torch

import model as model_lib
from helpers import tiny_gpt
from model import KVCache


BLOCK_SIZE = 16


# the modern architecture's options that change what attention sees: rotary positions from the cache's offset,
# a window and documents that the cached positions' masks must keep (token 3 starts a document: the prompts and
# samples hold several), and those that add the tokens' own rows and earlier blocks' outputs to the new positions'
# (value_embeds, unet_skips, x0_shortcut), which the cache must not change
MODERN = dict(pos_emb='rope', norm='rmsnorm', qk_norm=True, mlp='relu2', tie_weights=False, logit_softcap=15.0,
              value_embeds=1, unet_skips=True, x0_shortcut=True, attn_window=6, doc_token=3)
WINDOW = dict(pos_emb='rope', attn_window=6) # the window alone: the cached positions' mask without documents
# the 24 Nov 2024 record: block 0's values mixed into every block's (value_residual), the normed embedding
RECORD_2024 = dict(pos_emb='rope', norm='rmsnorm', norm_gain=False, embed_norm=True, qk_norm=True, mlp='relu2',
                   tie_weights=False, logit_softcap=30.0, unet_skips=True, x0_shortcut=True, value_residual=True,
                   attn_window=6, doc_token=3)
# the speedrun presets' record (4 Jan 2025) at 4 layers: the window in blocks of 2 positions (the cached positions'
# masks by block too), half-turning rotary, no attention in block 2, the other blocks' values scaled or mixed
RECORD = dict(RECORD_2024, value_residual=False, logit_softcap=15.0, n_layer=4, value_embeds=1, value_scale=True,
              no_attn_layer=2, rope_truncated=True, attn_window_block=2)
OPTIONS = dict(argvalues=[{}, MODERN, WINDOW, RECORD_2024, RECORD],
               ids=['gpt2', 'modern', 'window', 'record of 24 Nov 2024', 'record'])


def large_weights_gpt(**options):
    """The tiny GPT, 32 wide, with large weights: its next tokens depend on the context and positions (GPT-2's small
    init repeats one token greedily) and no two nearly tie (the greedy choices here lead by > 0.03 in logits), so
    rounding differences between the cached and the full forward cannot change a choice."""
    model = tiny_gpt(block_size=BLOCK_SIZE, n_embd=32, **options).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:  # embeddings (wte, wpe) N(0, 1), the other matrices N(0, 0.5)
                p.normal_(0.0, 1.0 if name.startswith('transformer.w') else 0.5)
            elif name.endswith(('lambdas', 'skip_weights')):  # away from their start, (1, 0) is x0_shortcut's identity
                p.uniform_(0.5, 1.5)
    return model


def nanogpt_generate(model, idx, max_new_tokens, temperature=1.0, top_k=None):
    """nanoGPT's GPT.generate (tests/gpt2_model_reference.py's, unchanged) on `model`: the whole (cropped) sequence
    runs again for each token."""
    import gpt2_model_reference  # here, not at collection: it compiles a function at import (torch's compiler)
    return gpt2_model_reference.GPT.generate(model, idx, max_new_tokens, temperature=temperature, top_k=top_k)


@pytest.mark.parametrize('options', **OPTIONS)
@pytest.mark.parametrize('sampling', [dict(top_k=1), dict(temperature=1.0), dict(temperature=0.8, top_k=5)],
                         ids=['greedy', 'sampled', 'sampled top_k'])
@pytest.mark.parametrize('prompt_length, max_new_tokens', [(5, 9), (5, 30), (20, 6)],
                         ids=['within block_size', 'past block_size', 'prompt past block_size'])
def test_cached_and_uncached_generate_give_nanogpts_tokens(sampling, prompt_length, max_new_tokens, options):
    model = large_weights_gpt(**options)
    prompt = torch.randint(50, (3, prompt_length), generator=torch.Generator().manual_seed(1))
    runs = {}
    for name, generate in [('nanoGPT', lambda: nanogpt_generate(model, prompt, max_new_tokens, **sampling)),
                           ('cached', lambda: model.generate(prompt, max_new_tokens, **sampling)),
                           ('uncached', lambda: model.generate(prompt, max_new_tokens, **sampling, use_cache=False))]:
        torch.manual_seed(7)
        runs[name] = generate()
    reference = runs['nanoGPT']
    assert reference.shape == (3, prompt_length + max_new_tokens) and torch.equal(reference[:, :prompt_length], prompt)
    new_tokens = reference[:, prompt_length:].tolist()
    assert len({tuple(row) for row in new_tokens}) == 3  # the samples differ: batch rows are kept apart
    assert torch.equal(runs['cached'], reference)
    assert torch.equal(runs['uncached'], reference)


@pytest.mark.parametrize('options', **OPTIONS)
def test_forward_with_cache_gives_the_logits_of_the_whole_sequence(options):
    """The prompt, then one token, then several at once (each attending causally to the others and to the cache)."""
    model = large_weights_gpt(**options)
    tokens = torch.randint(50, (2, 11), generator=torch.Generator().manual_seed(2))
    cache = KVCache(model.config, batch_size=2, max_len=BLOCK_SIZE, device='cpu', dtype=torch.float32)
    with torch.no_grad():
        for start, end in [(0, 6), (6, 7), (7, 11)]:
            cached, _ = model(tokens[:, start:end], cache=cache)
            whole, _ = model(tokens[:, :end])
            assert cache.length == end
            # with attn_window, the whole sequence's attention runs in blocks, summing in another order
            torch.testing.assert_close(cached, whole, rtol=1e-4, atol=1e-4)


def count_tokens_run(model, generate):
    """How many token positions go through the model's embedding while `generate` runs."""
    counts = []
    hook = model.transformer.wte.register_forward_hook(lambda module, args, out: counts.append(args[0].shape[1]))
    generate()
    hook.remove()
    return sum(counts)


@pytest.mark.parametrize('max_new_tokens', [10, 20], ids=['within block_size', 'past block_size'])
def test_cache_runs_each_position_once_within_block_size(max_new_tokens):
    model = large_weights_gpt()
    prompt = torch.zeros(1, 4, dtype=torch.long)
    cached = count_tokens_run(model, lambda: model.generate(prompt, max_new_tokens))
    uncached = count_tokens_run(model, lambda: model.generate(prompt, max_new_tokens, use_cache=False))
    lengths = range(4, 4 + max_new_tokens)  # the sequence's length at each step
    assert uncached == sum(min(n, BLOCK_SIZE) for n in lengths)
    # with the cache: the prompt, then one token a step up to block_size; past it, the cropped window every step
    assert cached == min(lengths[-1], BLOCK_SIZE) + sum(BLOCK_SIZE for n in lengths if n > BLOCK_SIZE)


def test_cached_generate_under_autocast_keeps_the_cache_in_autocasts_dtype(monkeypatch):
    """bf16 keys and values, as the attention computes them: half the memory of float32, and no cast of the whole
    cache at every step."""
    caches = []

    class RecordedKVCache(KVCache):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            caches.append(self)

    monkeypatch.setattr(model_lib, 'KVCache', RecordedKVCache)
    model = large_weights_gpt()
    with torch.autocast('cpu', dtype=torch.bfloat16):
        out = model.generate(torch.zeros(2, 3, dtype=torch.long), 20, top_k=1)
    assert out.shape == (2, 23)
    keys, values = caches[0].layers[0]
    assert keys.dtype == values.dtype == torch.bfloat16 and keys.shape == (2, 2, BLOCK_SIZE, 16)
