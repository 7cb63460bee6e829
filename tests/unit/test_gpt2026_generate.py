"""GPT2026.generate with its KV cache: the logits of the whole sequence and the tokens of generate without it, while
each position runs through the model once. The model is the record's 11 layers (paired heads, long layers' shifted
keys, value tables, the skip and the backout) at a small width, with large weights, windows shorter than the sequences
(so that the cached positions' masks cut them), documents starting inside the prompt and the samples, after YaRN's
rescaling and the embedding's split: what the cache must carry over from one forward to the next, and no more."""
import pytest
import torch

import gpt2026

VOCAB, DOC = 64, 63
CONFIG = gpt2026.GPT2026Config(vocab_size=VOCAB, bigram_vocab_size=5 * VOCAB, n_head=6, n_embd=48, doc_token=DOC,
                               short_window=5, long_window=9)


def large_weights_model(dtype=torch.float64, **config):
    """The record's model, small, whose next tokens depend on the context, positions and documents (the record's
    zero init would give every position the same logits) and with the state a trained one carries."""
    torch.manual_seed(0)
    model = gpt2026.GPT2026(gpt2026.GPT2026Config(**{**vars(CONFIG), **config}), loss_chunk_rows=16).to(dtype).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.5)
    model.untie_embedding()
    for window in (5, 9):  # YaRN rescaled once: the rotary of positions past the first fitted window differs
        model.fit_rotary(window)
    return model


def tokens(length, seed=1):
    """Two rows of tokens below the document token, a document starting at position 4 of the first row and at
    positions 9 and 16 of the second (past the first windows), those within `length`."""
    idx = torch.randint(DOC, (2, length), generator=torch.Generator().manual_seed(seed))
    for row, position in ((0, 4), (1, 9), (1, 16)):
        if position < length:
            idx[row, position] = DOC
    return idx


@pytest.mark.parametrize('doc_token', [DOC, -1], ids=['documents', 'no documents'])
def test_forward_with_cache_gives_the_logits_of_the_whole_sequence(doc_token):
    """The prompt, then one token, several at once (each attending causally to the others and to the cache), one
    again: float64 logits within 1e-12 of the whole sequence's forward."""
    model, idx = large_weights_model(doc_token=doc_token), tokens(24)
    cache = gpt2026.KVCache(len(model.config.layers))
    with torch.no_grad():
        for start, end in [(0, 6), (6, 7), (7, 18), (18, 19), (19, 24)]:
            cached, _ = model(idx[:, start:end], cache=cache)
            whole, _ = model(idx[:, :end])
            assert cache.length == end and cached.shape == whole.shape == (2, 1, VOCAB)
            assert (cached - whole).abs().max() < 1e-12 * whole.abs().max()
    # what each layer keeps: the last window + 1 positions of its layout, the window reaching no further back (the
    # long layers' key shift one more): layer 0's paired heads (half the heads, two positions a token) of the short
    # window, layer 3's of the long one; layer 6 has no attention
    assert [cache.layers[i]['keys'].shape for i in (0, 3)] == [(2, 5 + 1, 3, 8), (2, 9 + 1, 6, 8)]
    assert cache.layers[6] == {}
    # and of the tokens: the document ids the long window reaches, the last two (the smear's and the bigrams')
    assert cache.docs.shape == (2, 9 + 1) and torch.equal(cache.tokens, idx[:, -2:])


def test_forward_with_cache_under_autocast_gives_the_logits_of_the_whole_sequence():
    """bf16 matmuls (autocast) in the cached forward, as sample.py's --dtype=bfloat16 runs them: the cached keys and
    values join the new ones in the dtype they were computed in."""
    model, idx = large_weights_model(torch.float32), tokens(12)
    cache = gpt2026.KVCache(len(model.config.layers))
    with torch.no_grad(), torch.autocast('cpu', dtype=torch.bfloat16):
        model(idx[:, :8], cache=cache)
        cached, _ = model(idx[:, 8:], cache=cache)
        whole, _ = model(idx)
    torch.testing.assert_close(cached, whole, rtol=0.05, atol=0.1)


@pytest.mark.parametrize('sampling', [dict(top_k=1), dict(temperature=1.0), dict(temperature=0.8, top_k=5)],
                         ids=['greedy', 'sampled', 'sampled top_k'])
def test_cached_and_uncached_generate_draw_the_same_tokens(sampling):
    """A prompt with documents starting 2 and 7 positions before its end: the samples' first tokens see them."""
    model, prompt = large_weights_model(), tokens(18)
    runs = {}
    for use_cache in (True, False):
        torch.manual_seed(7)
        runs[use_cache] = model.generate(prompt, 20, **sampling, use_cache=use_cache)
    assert runs[True].shape == (2, 38) and torch.equal(runs[True][:, :18], prompt)
    assert not torch.equal(runs[True][0, 18:], runs[True][1, 18:])  # the rows are kept apart
    assert torch.equal(runs[True], runs[False])


def test_the_cache_runs_each_position_once():
    """The bigram table is looked up for the positions a forward runs: with the cache, the prompt and then each new
    token once; without it, the whole sequence at every step."""
    model, counts = large_weights_model(), []
    model.transformer.bigram_embed.register_forward_hook(lambda module, args, out: counts.append(args[0].shape[1]))
    for use_cache, positions in ((True, 4 + 9), (False, sum(range(4, 14)))):  # the last token is never fed back
        counts.clear()
        model.generate(tokens(4), 10, use_cache=use_cache)
        assert sum(counts) == positions


def test_a_cache_refuses_a_longer_window_than_it_kept_the_keys_of():
    model, idx = large_weights_model(), tokens(12)
    cache = gpt2026.KVCache(len(model.config.layers))
    with torch.no_grad():
        model(idx[:, :10], cache=cache)
        model(idx[:, 10:11], cache=cache, windows=(3, 9))  # shorter: the keys it needs are kept
        with pytest.raises(ValueError, match='a KVCache kept the keys of a window of 3 positions, not 5'):
            model(idx[:, 11:], cache=cache)
