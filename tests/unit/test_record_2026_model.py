"""gpt2026.py is the GPT of modded-nanogpt's single-GPU record of 24 Jan 2026: against
tests/record_reference_2026_01_24.py (the record's code read again, none of the port's), from the same weights, in
float64 on the CPU, the loss and every gradient agree within 1e-10 (relative to each tensor's largest value) at
points of the run that cover its stages: each window stage (with YaRN's rescalings behind it), each set of
multi-token prediction weights, before and after the embedding's split, training's summed loss and validation's mean,
the final validation's longer window. The port runs small: the record's 11 layers and 6 heads, heads 8 wide, a
64-token vocabulary, rows of 128 tokens holding several documents, the windows' blocks of 128 positions scaled to 4;
its loss in chunks of 40 rows. Each piece of the record taken out of the port, one at a time, breaks the agreement."""
import copy
import dataclasses
import functools
import math

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from training import attention
import flash_varlen_on_a_cpu
import gpt2026
from training.opcount import OperatorCounter
import record_reference_2026_01_24 as R
from record_port_2026 import ours_from_record, record_from_ours

VOCAB, BOS, T = 64, 63, 128
CFG = R.RecordConfig(vocab_size=VOCAB, bigram_vocab_size=5 * VOCAB, head_dim=8, model_dim=48, bos_id=BOS,
                     block_size=4)
PORT = gpt2026.GPT2026Config(vocab_size=VOCAB, bigram_vocab_size=5 * VOCAB, n_head=6, n_embd=48, doc_token=BOS)
CHUNK_ROWS = 40  # 256 rows in 7 chunks, the last one short
TOLERANCE = 1e-10
L, D = CFG.num_layers, CFG.model_dim


@dataclasses.dataclass(frozen=True)
class Stage:
    """A point of the record's run: a training step's forward (summed MTP loss) or a validation's (mean loss)."""
    step: int
    training: bool
    windows: tuple  # (short, long) in blocks
    fitted: tuple  # the long windows YaRN went through (blocks)
    mtp_weights: tuple  # training's, as the record's fp32 values
    tied: bool


def stage_at(step, training=True):
    """The record's schedule at `step`: its windows (the final validation's long one extended without YaRN), the
    MTP weights, and whether the embedding is still the head's (the split comes after split_step's update)."""
    final = step == CFG.num_iterations
    short, long = R.get_ws(step, CFG)
    fitted = tuple(R.long_windows_fitted(min(step, CFG.num_iterations - 1), CFG))
    return Stage(step, training, (short, CFG.ws_validate_post_yarn_ext if final else long), fitted,
                 tuple(R.mtp_weights_at(step, CFG).tolist()) if training else (), step <= R.split_step(CFG))


STAGES = {
    'step 0: windows 1/3, mtp 1, 0.5, 0.25, tied': stage_at(0),
    'step 300: mtp 1, 0.5, 0.1058': stage_at(300),
    'validation at step 500 (windows 1/3, tied)': stage_at(500, training=False),
    'step 700: windows 3/7 after YaRN, mtp 1, 0.3782': stage_at(700),
    'step 1041: windows 5/11 after YaRN twice, mtp 1, the last tied step': stage_at(1041),
    'step 1042: the first untied step': stage_at(1042),
    'step 1580: extension, windows 6/13 after YaRN 3 times': stage_at(1580),
    'final validation at 1600: the long window 20 without YaRN': stage_at(1600, training=False),
}


def test_the_stages_are_the_records():
    """The record's schedule at the points above, and the split after step 1041."""
    assert [(s.windows, s.fitted, len(s.mtp_weights), s.tied) for s in STAGES.values()] == [
        ((1, 3), (3,), 3, True), ((1, 3), (3,), 3, True), ((1, 3), (3,), 0, True), ((3, 7), (3, 7), 2, True),
        ((5, 11), (3, 7, 11), 1, True), ((5, 11), (3, 7, 11), 1, False), ((6, 13), (3, 7, 11, 13), 1, False),
        ((6, 20), (3, 7, 11, 13), 0, False)]
    assert R.split_step(CFG) == 1041


def record_weights():
    """Weights away from the record's start, so that every piece acts and gets a gradient: random tables, banks,
    gates and head (most start at zero), lambdas off their starting values; the embedding not the head's."""
    g = torch.Generator().manual_seed(0)
    randn = lambda *shape: torch.randn(*shape, generator=g, dtype=torch.float64)
    w = {name: randn(*shape) for name, shape in R.record_shapes(CFG).items()}
    w['lm_head.weight'] /= math.sqrt(D)
    w['attn_bank'] /= math.sqrt(D)
    w['mlp_bank'][:, 0] /= math.sqrt(D)
    w['mlp_bank'][:, 1] /= math.sqrt(4 * D)
    w['mlp_bank'][11] = 0  # the padding entry, which no layer uses
    w['scalars'] = torch.cat([torch.full((L,), 1.1), torch.tensor([0.5, 1.0]).repeat(L), torch.full((L,), 0.1),
                              torch.tensor([0.0, 0.5, -1.5])]).double() + 0.3 * w['scalars']
    w['x0_lambdas'] = 0.3 * w['x0_lambdas']
    return w


def record_weights_at(stage):
    """record_weights, the embedding being lm_head's transposed while tied, as the record's optimizer keeps it."""
    w = record_weights()
    return {**w, 'embed.weight': w['lm_head.weight'].T.clone()} if stage.tied else w


def tokens():
    """Two micro-batches of 128 tokens and their targets: row 0 starts at a document (training's rows), row 1 inside
    one (validation's); documents of 3 to 100 tokens, longer than some windows, none starting at a block's start."""
    g = torch.Generator().manual_seed(1)
    data = torch.randint(0, BOS, (2, T + 1), generator=g)
    data[0, [0, 3, 21, 70]] = BOS
    data[1, [9, 110]] = BOS
    return data[:, :-1].contiguous(), data[:, 1:].contiguous()


@functools.cache
def reference(stage):
    """(loss, gradients) of the reference at `stage`, those of the tied embedding as the optimizer sees them."""
    x, y = tokens()
    mtp_weights = torch.tensor(stage.mtp_weights, dtype=torch.float32) if stage.training else None
    loss, grads = R.loss_and_grads(record_weights_at(stage), x, y, CFG, *stage.windows, list(stage.fitted),
                                   mtp_weights)
    return loss, R.tie_gradients(grads) if stage.tied else grads


def port_model(stage, attend=gpt2026.attend, segments=None):
    """gpt2026's model in float64 at `stage`: its rotary fitted through the stage's long windows, untied after the
    split, holding record_weights (its wte unused while tied); its attention `attend` over `segments`."""
    model = gpt2026.GPT2026(copy.deepcopy(PORT), loss_chunk_rows=CHUNK_ROWS, attend=attend, segments=segments).double()
    for window in stage.fitted:
        model.fit_rotary(window * CFG.block_size)
    model.embedding_tied = stage.tied
    weights = ours_from_record(record_weights(), CFG)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(weights[name])
    return model


def port(model, stage):
    """(loss, gradients under the record's names) of the port at `stage`."""
    x, y = tokens()
    windows = tuple(w * CFG.block_size for w in stage.windows)
    if stage.training:
        _, loss = model(x, y, windows=windows, mtp_weights=stage.mtp_weights, reduction='sum')
    else:
        _, loss = model(x, y, windows=windows)
    loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), record_from_ours(grads, CFG)


def relative_error(a, b):
    return ((a - b).abs().max() / b.abs().max().clamp(min=1e-30)).item()


def disagreements(model, stage, port_stage=None):
    """{what: relative error} over TOLERANCE between the port's model at `stage` (run at port_stage if given) and
    the reference; a gradient only one side has counts as infinitely far."""
    (loss, grads), (ref_loss, ref_grads) = port(model, port_stage or stage), reference(stage)
    errors = {'loss': relative_error(loss, ref_loss)}
    for n in grads.keys() | ref_grads.keys():
        errors[f'grad {n}'] = relative_error(grads[n], ref_grads[n]) if n in grads and n in ref_grads else math.inf
    return {what: e for what, e in errors.items() if not e <= TOLERANCE}


@pytest.mark.parametrize('name', STAGES)
def test_the_port_is_the_record_loss_and_every_gradient_in_float64(name):
    stage = STAGES[name]
    model = port_model(stage)
    assert disagreements(model, stage) == {}
    assert (model.transformer.wte.weight.grad is None) == stage.tied  # tied: the head's weight is the embedding
    ref_loss, ref_grads = reference(stage)
    assert all(ref_grads[n].abs().max() > 0 for n in ref_grads if n not in ('scalars', 'mlp_bank'))  # all act


def zero_output(*modules):
    """Each module's output replaced by zeros: a table adds nothing; a gate reads nothing (its sigmoid constant)."""
    for module in modules:
        module.register_forward_hook(lambda module, inputs, output: torch.zeros_like(output))


def attentions(model):
    return [block.attn for block in model.transformer.h if block.attn is not None]


def paired_heads_at_their_interleaved_positions(monkeypatch):
    """The paired heads rotated where the interleaving puts them, 2t + h // (H/2), not the record's 2t + h % 2."""
    rotary = gpt2026.GPT2026.rotary

    def interleaved(self, T, device, dtype, start=0):
        tables, scale = rotary(self, T, device, dtype, start)
        frequencies, _ = gpt2026.yarn(self.config.n_embd // self.config.n_head, self.rotary_windows)
        heads = torch.arange(self.config.n_head)
        positions = 2 * torch.arange(start, start + T)[:, None] + heads // (self.config.n_head // 2)
        return {**tables, 'paired': gpt2026.rotary_cos_sin(frequencies, positions, dtype)}, scale
    monkeypatch.setattr(gpt2026.GPT2026, 'rotary', interleaved)


# each: (the change to the port's model, or None; the change to the stage it runs, or None)
PIECES_TAKEN_OUT = {
    'bigram embedding': (lambda model, mp: zero_output(model.transformer.bigram_embed), None),
    'value embeddings': (lambda model, mp: zero_output(*model.transformer.value_embeds), None),
    'smear gate': (lambda model, mp: zero_output(model.smear_gate), None),
    'skip gate': (lambda model, mp: zero_output(model.skip_gate), None),
    'attention gates': (lambda model, mp: zero_output(*(a.gate for a in attentions(model))), None),
    'value-embedding gates': (lambda model, mp: zero_output(*(a.value_gate for a in attentions(model)
                                                              if a.value_gate is not None)), None),
    'paired heads': (lambda model, mp: [setattr(a, 'paired', False) for a in attentions(model)], None),
    'paired heads rotated at their interleaved positions': (
        lambda model, mp: paired_heads_at_their_interleaved_positions(mp), None),
    'key offset': (lambda model, mp: [setattr(a, 'shift_keys', False) for a in attentions(model)], None),
    'documents': (lambda model, mp: setattr(model.config, 'doc_token', -1), None),
    'backout from layer 8': (lambda model, mp: setattr(model.config, 'backout_layer', 8), None),
    'skip from layer 2': (lambda model, mp: setattr(model.config, 'skip', (2, 6)), None),
    'attention scale 1/sqrt(head)': (
        lambda model, mp: mp.setattr(gpt2026, 'yarn', lambda d, w, device, yarn=gpt2026.yarn:
                                     (yarn(d, w, device)[0], d ** -0.5)),
        None),
    'softcap of before, 30 sigmoid(z / 7.5)': (
        lambda model, mp: (mp.setattr(gpt2026, 'SOFTCAP_SCALE', 30.0), mp.setattr(gpt2026, 'SOFTCAP_SHIFT', 0.0)),
        None),
    'the short window in the long layers': (None, lambda s: dataclasses.replace(s, windows=(s.windows[0],) * 2)),
    'YaRN': (None, lambda s: dataclasses.replace(s, fitted=s.fitted[:1])),
    'MTP weights': (None, lambda s: dataclasses.replace(s, mtp_weights=s.mtp_weights[:1])),
    'the split (tied throughout)': (None, lambda s: dataclasses.replace(s, tied=True)),
    'the tie (untied from the start)': (None, lambda s: dataclasses.replace(s, tied=False)),
}


@pytest.mark.parametrize('name', PIECES_TAKEN_OUT)
def test_each_piece_taken_out_of_the_port_breaks_the_agreement(name, monkeypatch):
    """At one of the stages at least: the first where it shows, the others not run."""
    change_model, change_stage = PIECES_TAKEN_OUT[name]
    for stage in STAGES.values():
        port_stage = change_stage(stage) if change_stage else stage
        model = port_model(port_stage)
        if change_model:
            change_model(model, monkeypatch)
        if disagreements(model, stage, port_stage):
            return
    pytest.fail(f'the port without {name} agrees with the record at every stage')


def test_the_bigram_hash_is_the_records_at_full_size_int32_overflow_included():
    """At the record's 251,520 rows position 1 hashes with the reserved index 251,519 as the token before it, whose
    product with 27,191 overflows int32 and wraps, as in the record: computed in int64 it would differ."""
    cfg = R.RecordConfig()
    idx = torch.randint(0, 50257, (3, 300), generator=torch.Generator().manual_seed(2))
    ours = gpt2026.bigram_hash(idx, cfg.bigram_vocab_size)
    assert all(torch.equal(ours[row], R.bigram_hash(idx[row], cfg)) for row in range(3))
    assert ours.min() >= 0 and ours.max() == cfg.bigram_vocab_size - 1 == ours[0, 0]
    wide = torch.bitwise_xor(36313 * idx[:, 1].long(), 27191 * (cfg.bigram_vocab_size - 1)) % 251519
    assert not torch.equal(wide, ours[:, 1].long())


def test_the_full_size_port_has_the_records_parameters():
    """Each of the record's tensors, under the weight map, is the port's, of the same shape; the port lacks only what
    the record never uses: the MLP bank's padding entry (2 x 3072 x 768) and layer 6's attention lambdas (2)."""
    cfg = R.RecordConfig()
    with torch.device('meta'):
        model = gpt2026.GPT2026(gpt2026.GPT2026Config())
        record = {name: torch.empty(shape) for name, shape in R.record_shapes(cfg).items()}
    ours = ours_from_record(record, cfg)
    assert {n: tuple(t.shape) for n, t in ours.items()} == {n: tuple(p.shape) for n, p in model.named_parameters()}
    n_record = sum(math.prod(shape) for shape in R.record_shapes(cfg).values())
    assert n_record - sum(p.numel() for p in model.parameters()) == 2 * 3072 * 768 + 2
    assert n_record == 5 * 50304 * 768 + 251520 * 768 + 10 * 4 * 768 ** 2 + 12 * 2 * 3072 * 768 + 15 * 6 * 12 + 24 + 58


def test_the_ports_initialization_is_the_records():
    """Zero and constant tensors exactly; the random ones from the record's distributions: c_attn and c_fc uniform
    of std 768**-0.5 and half that, the head N(0, 0.005), the embedding the head's copy."""
    torch.manual_seed(0)
    cfg = R.RecordConfig(vocab_size=512, bigram_vocab_size=1024, model_dim=768)
    port = gpt2026.GPT2026(gpt2026.GPT2026Config(vocab_size=512, bigram_vocab_size=1024))
    record = R.init_weights(cfg, torch.Generator().manual_seed(0), torch.float32)
    ours = ours_from_record(record, cfg)
    for name, p in port.named_parameters():
        expected = ours[name]
        if expected.abs().max() == 0 or expected.dim() < 2:
            assert torch.equal(p.detach(), expected), name
        else:
            assert abs(p.std() / expected.std() - 1) < 0.02, name
        if name.endswith(('c_attn.weight', 'c_fc.weight')):  # uniform: within the bound sqrt(3) std
            assert p.abs().max() <= math.sqrt(3) * (0.5 if 'mlp' in name else 1) / math.sqrt(768), name
    assert port.lm_head.weight.std().item() == pytest.approx(0.005, rel=0.02)
    assert torch.equal(port.transformer.wte.weight, port.lm_head.weight) and port.embedding_tied


def test_the_loss_never_holds_more_than_a_chunk_of_logits(monkeypatch):
    """Training (with gradients) and validation: every product onto the vocabulary has at most loss_chunk_rows
    rows, and together they cover the 256 positions once; sampling projects the last position alone."""
    stage = STAGES['step 0: windows 1/3, mtp 1, 0.5, 0.25, tied']
    model, products = port_model(stage), []
    linear = torch.nn.functional.linear

    def spy(x, weight, *args):
        y = linear(x, weight, *args)
        if y.size(-1) == VOCAB:
            products.append(y.shape)
        return y
    monkeypatch.setattr(torch.nn.functional, 'linear', spy)
    port(model, stage)
    with torch.no_grad():
        model(*tokens(), windows=(4, 12))
    assert [s[0] for s in products] == 2 * ([40] * 6 + [16])
    products.clear()
    with torch.no_grad():
        logits, _ = model(tokens()[0], windows=(4, 12))
    assert [tuple(s) for s in products] == [(2, 1, VOCAB)] and logits.shape == (2, 1, VOCAB)
    assert 0 < logits.min() and logits.max() < 23


def test_sampling_gives_the_records_capped_logits_of_the_last_position():
    stage = STAGES['final validation at 1600: the long window 20 without YaRN']
    x, _ = tokens()
    with torch.no_grad():
        logits, _ = port_model(stage)(x, windows=(24, 80))
        hidden = R.hidden_states(record_weights_at(stage), x[1], CFG, 6, 20, list(stage.fitted))
    assert relative_error(logits[1, 0], R.softcap(hidden[-1] @ record_weights()['lm_head.weight'])) < TOLERANCE


def test_the_split_and_yarn_are_the_models_state_and_travel_in_its_state_dict():
    """untie_embedding copies the head's weight into wte and stops the tie; fit_rotary keeps the long windows it
    went through, once each; a model loading the state dict has both, and runs as the first."""
    model = gpt2026.GPT2026(copy.deepcopy(PORT), loss_chunk_rows=CHUNK_ROWS).double()
    with torch.no_grad():
        model.transformer.wte.weight.normal_()
    model.untie_embedding()
    assert not model.embedding_tied and torch.equal(model.transformer.wte.weight, model.lm_head.weight)
    for window in (12, 12, 28, 44, 44):
        model.fit_rotary(window)
    assert model.rotary_windows == [12, 28, 44]
    copy_ = gpt2026.GPT2026(copy.deepcopy(PORT), loss_chunk_rows=CHUNK_ROWS).double()
    assert copy_.embedding_tied and copy_.rotary_windows == []
    copy_.load_state_dict(model.state_dict())
    assert not copy_.embedding_tied and copy_.rotary_windows == [12, 28, 44]
    x, y = tokens()
    with torch.no_grad():
        assert torch.equal(copy_(x, y, windows=(20, 44))[1], model(x, y, windows=(20, 44))[1])


@pytest.mark.parametrize('window', [5, 30, 200])  # 200: past the longest document, no limit
def test_attend_is_flashattentions_varlen_kernel_with_a_window_by_position(window, flash_kernel):
    """gpt2026.attend, which a CUDA run may replace by torch's varlen_attn (FlashAttention's variable-length kernel),
    computes what that kernel does with the documents as cu_seqlens and window_size=(window, 0): outputs and
    gradients, in float64 (full_precision: the comparison needs more digits than bf16's), on the CPU stand-in."""
    x, _ = tokens()
    docs = (x == BOS).cumsum(1)
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, T, 6, 8, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    starts = torch.zeros(2, T, dtype=torch.bool)
    starts[:, 0] = True
    starts |= x == BOS
    cu_seqlens = torch.cat([starts.view(-1).nonzero()[:, 0], torch.tensor([2 * T])]).to(torch.int32)
    longest = int(cu_seqlens.diff().max())
    with flash_varlen_on_a_cpu.full_precision():
        flash = flash_kernel(*(t.reshape(2 * T, 6, 8) for t in (q, k, v)), cu_seqlens, cu_seqlens, longest, longest,
                             scale=0.1, window_size=(window, 0)).view(2, T, 6, 8)
        ours = gpt2026.attend(q, k, v, docs, window, 0.1)
        assert relative_error(ours, flash) < TOLERANCE
        grads = [torch.autograd.grad(y, (q, k, v), torch.ones_like(y)) for y in (ours, flash)]
    assert all(relative_error(a, b) < TOLERANCE for a, b in zip(*grads))


@pytest.mark.parametrize('name', ['step 0: windows 1/3, mtp 1, 0.5, 0.25, tied',
                                  'final validation at 1600: the long window 20 without YaRN'])
def test_the_model_on_flashattentions_varlen_kernel_has_the_masked_attentions_loss_and_gradients(name, flash_kernel):
    """GPT2026 with attention.window_document_attention, the varlen kernel a CUDA run passes it, on the kernel's CPU
    stand-in: the loss and every gradient of its own SDPA under a mask, at training's windows and MTP weights and at
    the final validation's long window, in float64 (full_precision: the comparison needs more digits than bf16's)."""
    stage, calls = STAGES[name], []
    counted = lambda docs: calls.append(docs.shape) or attention.position_segments(docs)
    with flash_varlen_on_a_cpu.full_precision():
        loss, grads = port(port_model(stage), stage)
        with OperatorCounter() as operators:
            kernel_loss, kernel_grads = port(port_model(stage, attention.window_document_attention, counted), stage)
    # the documents' segments made once a forward for each layout, whatever the layers: the paired heads' over twice
    # the positions. Their count is read from the GPU (nonzero): the forward's only waits for it, two, not two a layer
    assert calls == [(2, T), (2, 2 * T)]
    assert sum(operators.waits.values()) == 2
    assert relative_error(kernel_loss, loss) < TOLERANCE and grads.keys() == kernel_grads.keys()
    assert all(relative_error(kernel_grads[n], grads[n]) < TOLERANCE for n in grads if grads[n].abs().max() > 0)


def test_per_position_losses_add_up_to_the_loss_and_skip_targets_of_minus_one():
    """reduction='none' (HellaSwag's scores): (B, T), each position's next-token loss, summing to the 'sum' loss of
    the next token alone; a target of -1 scores 0 and leaves the other positions as they were; no gradients."""
    stage = STAGES['final validation at 1600: the long window 20 without YaRN']
    model, (x, y) = port_model(stage), tokens()
    windows = tuple(w * CFG.block_size for w in stage.windows)
    with torch.no_grad():
        losses = model(x, y, windows=windows, reduction='none')[1]
        assert losses.shape == x.shape and relative_error(losses.sum(), model(x, y, windows=windows,
                                                                               reduction='sum')[1]) < TOLERANCE
        some = y.clone()
        some[:, ::3] = -1
        kept = model(x, some, windows=windows, reduction='none')[1]
        last = F.cross_entropy(model(x, windows=windows)[0][:, -1], y[:, -1], reduction='none')
    assert (kept[:, ::3] == 0).all() and torch.equal(kept[:, 1::3], losses[:, 1::3])
    assert relative_error(losses[:, -1], last) < TOLERANCE  # the capped logits' cross-entropy
    with pytest.raises(RuntimeError, match="reduction='none' has no gradients"):
        model(x, y, windows=windows, reduction='none')


def test_sampling_draws_each_token_from_the_last_positions_capped_logits():
    """top_k=1 samples greedily: each new token the argmax of the model's logits for the sequence so far."""
    model = port_model(STAGES['final validation at 1600: the long window 20 without YaRN'])
    x, _ = tokens()
    sampled = model.generate(x[:, :20], 5, top_k=1)
    with torch.no_grad():
        greedy = [model(sampled[:, :t])[0][:, -1].argmax(-1) for t in range(20, 25)]
    assert sampled.shape == (2, 25) and torch.equal(sampled[:, :20], x[:, :20])
    assert torch.equal(sampled[:, 20:], torch.stack(greedy, 1))




class OperatorNames(TorchDispatchMode):
    """The names of the aten operators dispatched while it is active."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func._opname)
        return func(*args, **(kwargs or {}))


def two_micro_batches(model, run=None):
    """The gradients (name -> tensor) after the backwards of two micro-batches (tokens(), then its rows swapped) at a
    tied training stage, and the operators of the backwards; run: the model's forward (model itself, or compiled)."""
    stage = STAGES['step 1041: windows 5/11 after YaRN twice, mtp 1, the last tied step']
    windows = tuple(w * CFG.block_size for w in stage.windows)
    operators = OperatorNames()
    for rows in ([0, 1], [1, 0]):
        x, y = (t[rows] for t in tokens())
        _, loss = (model if run is None else run)(x, y, windows=windows, mtp_weights=stage.mtp_weights, reduction='sum')
        with operators:
            loss.backward()
    return {n: p.grad for n, p in model.named_parameters() if p.grad is not None}, operators.names


def test_the_tables_gradients_accumulate_in_place_as_autograds_would(monkeypatch):
    """gpt2026.TableRows: over two micro-batches, every gradient (the tables', and the tied head's, which the
    embedding's lookup adds to the loss's) equals autograd's own through F.embedding, which writes a whole table's
    gradient at every lookup's backward (embedding_dense_backward) and then adds it; TableRows adds its rows alone."""
    stage = STAGES['step 1041: windows 5/11 after YaRN twice, mtp 1, the last tied step']
    grads, operators = two_micro_batches(port_model(stage))
    monkeypatch.setattr(gpt2026, 'table_rows', F.embedding)
    expected, autograds = two_micro_batches(port_model(stage))
    assert grads.keys() == expected.keys() and {'transformer.bigram_embed.weight', 'lm_head.weight'} <= grads.keys()
    for name in grads:
        torch.testing.assert_close(grads[name], expected[name], rtol=1e-12, atol=1e-12)
    assert autograds.count('embedding_dense_backward') == 2 * 5  # the embedding, bigram and 3 value tables
    assert 'embedding_dense_backward' not in operators and operators.count('index_put_') == 2 * 5


def test_the_tables_accumulation_hooks_see_their_whole_gradient():
    """What a DDP wrapper or a post-accumulate hook reads at a table's accumulation hook is its .grad with this
    backward's rows added: the hook runs after TableRows' backward, with nothing of its own to add."""
    model = port_model(STAGES['step 1041: windows 5/11 after YaRN twice, mtp 1, the last tied step'])
    table = model.transformer.bigram_embed.weight
    seen = []
    table.register_post_accumulate_grad_hook(lambda p: seen.append(p.grad.clone()))
    grads, _ = two_micro_batches(model)
    assert len(seen) == 2 and seen[0].abs().max() > 0 and torch.equal(seen[1], grads['transformer.bigram_embed.weight'])


@pytest.mark.slow
def test_compiled_the_tables_are_looked_up_eagerly_with_the_same_gradients():
    """torch.compile of the model (Inductor on the CPU, as the preset's compile=True on a GPU), 3 of the record's
    layers (paired heads and a value table, a long window, a short one and a value table) for the compilation's
    time: the tables' lookups run eagerly before its graph, at one graph break (TableRows' backward writes .grad,
    which no graph returns), and two micro-batches give the eager model's loss and gradients, the tables' added in
    place."""
    config = dataclasses.replace(PORT, layers=(('paired', 0), ('long', None), ('short', 1)), skip=(0, 2),
                                 backout_layer=1)
    torch.manual_seed(0)
    eager = gpt2026.GPT2026(config, loss_chunk_rows=CHUNK_ROWS)
    with torch.no_grad():
        for p in eager.parameters():
            p.normal_(0.0, 0.2)
    eager.fit_rotary(4 * CFG.block_size)
    compiled = copy.deepcopy(eager)
    expected, _ = two_micro_batches(eager)
    grads, operators = two_micro_batches(compiled, torch.compile(compiled))
    assert grads.keys() == expected.keys() and 'transformer.bigram_embed.weight' in grads
    for name in grads:
        torch.testing.assert_close(grads[name], expected[name], rtol=1e-4, atol=1e-5)
    assert 'embedding_dense_backward' not in operators and operators.count('index_put_') == 2 * 4
    # one graph break for all the lookups (dynamo would break at each TableRows, whose backward writes .grad)
    x, y = tokens()
    explained = torch._dynamo.explain(eager)(x, y, windows=(20, 44), mtp_weights=(1.0,), reduction='sum')
    assert [reason.user_stack[-1].name for reason in explained.break_reasons] == ['hidden_states']
