"""GPT.forward's positions (a padded batch, as the Hugging Face export's attention_mask gives it): each row's tokens get
the losses and logits that the row has alone, wherever the padding is (left, right, holes), in every attention kind
the row alone runs (GPT-2's causal, attn_window's blocks, doc_token's mask, FlashAttention's varlen kernel), with
learned and rotary positions; the padding itself is never seen and never produces a NaN."""
import pytest
import torch

import flash_varlen_on_a_cpu
from helpers import tiny_gpt, tokens_with_documents
from model import KVCache
from training.attention import Kernels, kind

# the speedrun record's architecture, every option that sees positions or tokens: rotary positions, a window shorter
# than the rows (blocked_attention alone), documents at token 3, the value tables, skips, shortcut, soft-cap
RECORD = dict(pos_emb='rope', norm='rmsnorm', norm_gain=False, embed_norm=True, qk_norm=True, mlp='relu2',
              tie_weights=False, logit_softcap=30.0, value_embeds=1, unet_skips=True, x0_shortcut=True,
              value_residual=True, attn_window=4, doc_token=3)
LENGTHS = (16, 11, 6, 1)
PAD = 3  # the doc_token: padding must not start a document


def rows_and_targets():
    """Rows of LENGTHS tokens, documents in the longer ones, and their targets."""
    rows = [tokens_with_documents((n,), seed=n) for n in LENGTHS]
    return rows, [torch.randint(50, (n,), generator=torch.Generator().manual_seed(n)) for n in LENGTHS]


def padded_batch(rows, targets, where):
    """(tokens, targets, positions, tokens_mask) of `rows` and their targets in one (len(rows), 16) batch, padded with
    PAD (targets -1) on the left, on the right, or in holes: every third position from 1 padding (in a row short
    enough to leave them), then the left."""
    tokens_mask = torch.zeros(len(rows), 16, dtype=torch.bool)
    for i, row in enumerate(rows):
        n = len(row)
        slots = list(range(16)) if where != 'holes' or n > 11 else [j for j in range(16) if j % 3 != 1]
        tokens_mask[i, slots[:n] if where == 'right' else slots[-n:]] = True
    tokens, padded_targets = torch.full(tokens_mask.shape, PAD), torch.full(tokens_mask.shape, -1)
    tokens[tokens_mask], padded_targets[tokens_mask] = torch.cat(rows), torch.cat(targets)
    positions = (tokens_mask.cumsum(1) - 1).masked_fill(~tokens_mask, -1)
    return tokens, padded_targets, positions, tokens_mask


def randomized(model):
    """`model` with weights far from their init (the zero-initialized and identity ones too), in float64, so that
    every option acts and no row's losses are close to another's."""
    torch.manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.5 if p.dim() == 2 else 1.0)
    return model.double().eval()


@pytest.mark.parametrize('where', ['left', 'right', 'holes'])
@pytest.mark.parametrize('options', [{}, dict(doc_token=3), dict(pos_emb='rope', attn_window=4), RECORD],
                         ids=['gpt2', 'documents', 'window', 'record'])
def test_a_padded_row_has_the_losses_and_logits_it_has_alone(options, where):
    model = randomized(tiny_gpt(**options))
    rows, targets = rows_and_targets()
    tokens, padded_targets, positions, tokens_mask = padded_batch(rows, targets, where)
    attention = model.attention(tokens, positions, None, model.config.attn_window)
    # a padding query sees itself: no query without a key, for which some of SDPA's CUDA kernels have given NaN
    # (pytorch/pytorch#110213) that attention's weights of 0 carry into every later position (0 * NaN)
    assert attention.kind == 'masked' and (attention.mask == 0).any(-1).all()  # additive: 0 where a key is seen
    with torch.no_grad():
        _, losses = model(tokens, padded_targets, reduction='none', positions=positions)
        logits, _ = model(tokens, positions=positions)
        assert not losses.isnan().any() and not logits.isnan().any()
        for i, (row, row_targets) in enumerate(zip(rows, targets)):
            _, alone = model(row[None], row_targets[None], reduction='none')
            torch.testing.assert_close(losses[i][tokens_mask[i]], alone[0], atol=1e-10, rtol=0)
            if where == 'left':  # the last position is the row's last token
                torch.testing.assert_close(logits[i], model(row[None])[0][0], atol=1e-10, rtol=0)
    assert len({round(loss.sum().item(), 6) for loss in losses}) == len(rows)  # the rows' losses are their own


def test_padding_runs_the_mask_where_a_row_alone_runs_flash_attentions_kernel(monkeypatch, flash_kernel):
    """Where the rows alone run FlashAttention's varlen kernel (CUDA, bf16: here its CPU stand-in), a padded batch
    runs under the mask of its padding, with the same losses."""
    model = randomized(tiny_gpt(**RECORD))
    model.kernels = Kernels()
    monkeypatch.setattr(Kernels, 'varlen_kernel', lambda self, device, dtype, head_size: flash_kernel)
    rows, targets = rows_and_targets()
    tokens, padded_targets, positions, tokens_mask = padded_batch(rows, targets, 'left')
    assert kind(model.attention(rows[0][None], torch.arange(16), None, 4)) == 'varlen'
    assert kind(model.attention(tokens, positions, None, 4)) == 'masked'  # the padded batch: under its mask
    # in fp64: a padded key let in shows above rounding, not under bf16's
    with torch.no_grad(), flash_varlen_on_a_cpu.full_precision():
        _, losses = model(tokens, padded_targets, reduction='none', positions=positions)
        for i, (row, row_targets) in enumerate(zip(rows, targets)):
            _, alone = model(row[None], row_targets[None], reduction='none')
            torch.testing.assert_close(losses[i][tokens_mask[i]], alone[0], atol=1e-10, rtol=0)


def test_padded_rows_run_without_a_cache():
    """A KVCache's keys are the positions 0, 1, ... of every row: a padded batch is refused there."""
    model = tiny_gpt()
    cache = KVCache(model.config, 1, 16, 'cpu', torch.float32)
    with pytest.raises(AssertionError, match='padded rows'):
        model(torch.ones(1, 4, dtype=torch.long), cache=cache, positions=torch.tensor([[-1, 0, 1, 2]]))
