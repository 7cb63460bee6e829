"""training/record2026.py is the training of modded-nanogpt's single-GPU record of 24 Jan 2026: its schedules equal
the record's (tests/record_reference_2026_01_24.py) at every step of the run, and its optimizer, NorMuonAdam on
gpt2026.py's model, takes the record's optimizer steps: fed the same gradients from the same weights and state, in
float64 (Polar Express too), the weights after each step and the state after the last agree within 1e-12 (relative
to each tensor's largest value) at points of the run that cover its schedules: the momentum's warmup and cooldown,
each lr stage, the cooldown and the extension, Adam's steps every other step on two steps' gradients, and the
embedding's split after step 1041 with the head's Adam state. The model runs small (the record's 11 layers, 48
wide, a 64-token vocabulary). Each piece of the record taken out of the port, one at a time, breaks the agreement."""
import copy
import functools
import math

import pytest
import torch

import gpt2026
import record_reference_2026_01_24 as R
from record_port_2026 import ours_from_record, ours_from_record_state
from training import record2026

CFG = R.RecordConfig(vocab_size=64, bigram_vocab_size=320, head_dim=8, model_dim=48, bos_id=63, block_size=4)
PORT = gpt2026.GPT2026Config(vocab_size=64, bigram_vocab_size=320, n_head=6, n_embd=48, doc_token=63)
TOLERANCE = 1e-12
# each: the number of steps from it: the warmups; lr's second stage; the split at 1041 and two untied steps after;
# the cooldown; the extension; the momentum's cooldown
RUNS = {0: 2, 520: 2, 1040: 4, 1300: 2, 1560: 2, 1598: 2}


def test_the_schedules_are_the_records_at_every_step():
    """Batch size, windows (the final validation's too), lr factor, momentum, MTP weights, Adam's turn and the
    split, from step 0 to the final validation at 1,600; YaRN fitted to each long window the record applies it to."""
    cfg = R.RecordConfig()
    steps = range(record2026.NUM_ITERATIONS + 1)
    assert record2026.NUM_ITERATIONS == cfg.num_iterations and record2026.SPLIT_STEP == R.split_step(cfg) == 1041
    assert [record2026.batch_size_at(s) for s in steps] == [R.get_bs(s, cfg) for s in steps]
    assert [record2026.windows_at(s) for s in steps] == [tuple(128 * w for w in R.get_ws(s, cfg)) for s in steps]
    assert record2026.windows_at(1600, final_validation=True) == (6 * 128, 20 * 128)
    assert [record2026.lr_factor_at(s) for s in steps] == [R.get_lr(s, cfg) for s in steps]
    assert [record2026.momentum_at(s) for s in steps] == [R.get_muon_momentum(s, cfg) for s in steps]
    assert [record2026.mtp_weights_at(s) for s in steps] == [tuple(R.mtp_weights_at(s, cfg).tolist()) for s in steps]
    assert [record2026.adam_steps_at(s) for s in steps] == [s % 2 == 1 for s in steps]
    model = gpt2026.GPT2026(gpt2026.GPT2026Config(vocab_size=64, bigram_vocab_size=64, n_head=2, n_embd=16))
    for s in range(record2026.NUM_ITERATIONS):
        model.fit_rotary(record2026.windows_at(s)[1])
    assert model.rotary_windows == [128 * w for w in R.long_windows_fitted(cfg.num_iterations - 1, cfg)]
    assert model.rotary_windows == [384, 896, 1408, 1664]
    tokens = sum(record2026.batch_size_at(s) for s in range(record2026.NUM_ITERATIONS))
    assert tokens == 424_673_280  # the run's 0.42B tokens


def test_every_parameter_has_the_records_label_and_group():
    """Each of the port's parameters is in the group of the record's label for the tensor it comes from."""
    model = gpt2026.GPT2026(copy.deepcopy(PORT))
    optimizer = record2026.NorMuonAdam(model)
    names = {p: n for n, p in model.named_parameters()}
    sizes = {group['label']: len(group['params']) for group in optimizer.param_groups}
    assert sizes == {'attn.c_attn': 10, 'attn.c_proj': 10, 'mlp.c_fc': 11, 'mlp.c_proj': 11, 'scalars': 15,
                     'x0_lambdas': 1, 'value_embeds': 3, 'bigram_embed': 1, 'smear_gate': 1, 'skip_gate': 1,
                     'attention_gates': 15, 'embeddings': 2}
    assert sorted(names[p] for group in optimizer.param_groups for p in group['params']) == sorted(names.values())


def test_zero1_slices_adams_tables_and_hands_out_the_rest_largest_first_to_the_least_loaded_rank():
    """record2026.owners: Adam's parameters whose rows divide among the processes SLICED (each process its rows),
    every other parameter to one rank, the head and the embedding (whose state the split hands over) together; each
    rank's whole parameters' state (Adam's two moments an element, NorMuon's one) within twice the largest one's of
    the others', the ranks numbered from the largest share down; the same on every process."""
    optimizer = record2026.NorMuonAdam(gpt2026.GPT2026(copy.deepcopy(PORT)))
    params = {p: 2 if group['kind'] == 'adam' else 1 for group in optimizer.param_groups for p in group['params']}
    head, embedding = optimizer.param_groups[-1]['params']
    assert optimizer.param_groups[-1]['label'] == 'embeddings'
    for world in (2, 3, 4, 5):
        owner = record2026.owners(optimizer.param_groups, world)
        sliced = {p for p, moments in params.items() if moments == 2 and p.size(0) % world == 0}
        assert owner.keys() == params.keys() and {p for p in owner if owner[p] == record2026.SLICED} == sliced
        assert owner[head] == owner[embedding]
        assert set(owner.values()) - {record2026.SLICED} == set(range(world))
        whole = {p: moments * p.numel() for p, moments in params.items() if p not in sliced}
        shares = [sum(size for p, size in whole.items() if owner[p] == rank) for rank in range(world)]
        assert shares == sorted(shares, reverse=True) and shares[0] - shares[-1] <= 2 * max(whole.values())
        assert record2026.owners(optimizer.param_groups, world) == owner


def test_under_zero1_a_process_makes_loads_and_steps_the_state_of_its_share_alone():
    """As rank 0 and rank 1 of 2 (a stand-in process group, whose collectives move nothing): a step makes the state
    of the rank's share, its whole parameters' and its rows of the sliced ones, and updates only those; a full state
    dict (one process's) loads as that share."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    def new_model():
        torch.manual_seed(0)
        return gpt2026.GPT2026(copy.deepcopy(PORT))

    def stepped_optimizer(shard):
        model = new_model()
        optimizer = record2026.NorMuonAdam(model)
        if shard:
            optimizer.shard()
        for p in model.parameters():  # tied: no gradient for the embedding
            p.grad = None if p is model.transformer.wte.weight else torch.ones_like(p)
        optimizer.schedule(1)
        optimizer.step()
        return model, optimizer

    full = stepped_optimizer(shard=False)[1].state_dict()
    before = dict(new_model().named_parameters())
    for rank in (0, 1):
        torch.distributed.init_process_group('fake', store=FakeStore(), rank=rank, world_size=2)
        try:
            model, optimizer = stepped_optimizer(shard=True)
            names = {p: n for n, p in model.named_parameters()}
            stepped = {p for p in optimizer.owner if optimizer.owns(p) and p is not model.transformer.wte.weight}
            sliced = {p for p in stepped if optimizer.owner[p] == record2026.SLICED}
            assert {p for p in optimizer.owner if optimizer.owner[p] == rank} and sliced  # of both kinds
            for loaded in (False, True):
                if loaded:
                    optimizer.load_state_dict(full)
                assert set(optimizer.state) == stepped
                for p in sliced:  # its rows' state: rank 0 the first half
                    assert optimizer.state[p]['exp_avg'].shape == (p.size(0) // 2, *p.shape[1:])
                    assert optimizer.rows(p) == slice(rank * p.size(0) // 2, (rank + 1) * p.size(0) // 2)
            # updated: its whole parameters, and the sliced (the stand-in's gather copies its rows to the others')
            assert {n for p, n in names.items() if not torch.equal(p, before[n])} <= {names[p] for p in stepped}
        finally:
            torch.distributed.destroy_process_group()


def record_weights(tied, g):
    """Random weights of the record's shapes (the padding and layer 6's lambdas zero, as unused), the embedding
    lm_head's transpose while tied."""
    w = {name: torch.randn(shape, generator=g, dtype=torch.float64) / math.sqrt(shape[-1])
         for name, shape in R.record_shapes(CFG).items()}
    w['mlp_bank'][11] = 0
    w['scalars'][CFG.num_layers + 12:CFG.num_layers + 14] = 0
    if tied:
        w['embed.weight'] = w['lm_head.weight'].T.clone()
    return w


def record_state(w, first, g):
    """The record's optimizer state as it could be before step `first` (even): moments random (second ones
    positive), Adam's step count its odd steps so far; zero for what no layer uses, and for the embedding's Adam
    before the split (never stepped)."""
    state = R.init_optimizer_state(w, CFG)
    for name, s in state.items():
        if name in ('grads', 'split_embed') or (name == 'embed.weight' and first <= R.split_step(CFG)):
            continue
        for key, t in s.items():
            if key == 'step':
                s[key] = first // 2
            else:
                t.copy_(torch.randn(t.shape, generator=g, dtype=t.dtype) * 1e-2)
                if key in ('exp_avg_sq', 'second_momentum_buffer'):
                    t.square_()
    for key in ('momentum_buffer', 'second_momentum_buffer'):
        state['mlp_bank'][key].view(12, 2, *state['mlp_bank'][key].shape[1:])[11] = 0
    for key in ('exp_avg', 'exp_avg_sq'):
        state['scalars'][key][CFG.num_layers + 12:CFG.num_layers + 14] = 0
    state['split_embed'] = first > R.split_step(CFG)
    return state


def record_gradients(n_steps, g):
    """A backward's gradients for each step, zero where no layer takes any (the MLP bank's padding, layer 6's
    attention lambdas), large as a summed loss's."""
    grads = []
    for _ in range(n_steps):
        step = {name: torch.randn(shape, generator=g, dtype=torch.float64) for name, shape in
                R.record_shapes(CFG).items()}
        step['mlp_bank'][11] = 0
        step['scalars'][CFG.num_layers + 12:CFG.num_layers + 14] = 0
        grads.append(step)
    return grads


def ours_gradients(grads, tied):
    """The port's gradients from the record's model's: while tied, the head's includes the embedding's (the port's
    embedding is the head's weight), and wte has none."""
    ours = ours_from_record(grads, CFG)
    if tied:
        ours['lm_head.weight'] = ours['lm_head.weight'] + ours.pop('transformer.wte.weight')
    return ours


@functools.cache  # the same for every case: only the port changes
def reference_run(first):
    g = torch.Generator().manual_seed(first)
    w = record_weights(first <= R.split_step(CFG), g)
    state = record_state(w, first, g)
    grads = record_gradients(RUNS[first], g)
    weights = []
    for step, step_grads in zip(range(first, first + RUNS[first]), grads):
        w, state = R.optimizer_step(w, step_grads, state, step, CFG)
        weights.append(w)
    return weights, state, grads


def port_run(first, grads, initial):
    """The port's model from the record's initial weights and state: its weights after each step, and its state."""
    model = gpt2026.GPT2026(copy.deepcopy(PORT)).double()
    model.embedding_tied = first <= record2026.SPLIT_STEP
    optimizer = record2026.NorMuonAdam(model, orthogonalization_dtype=None)
    weights, state = initial
    ours_weights, ours_state = ours_from_record(weights, CFG), ours_from_record_state(state, CFG)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(ours_weights[name])
            if not (model.embedding_tied and name == 'transformer.wte.weight'):
                optimizer.state[p] = {k: v.clone() if torch.is_tensor(v) else v for k, v in ours_state[name].items()}
    params, after = dict(model.named_parameters()), []
    for step, step_grads in zip(range(first, first + RUNS[first]), grads):
        optimizer.schedule(step)
        for name, grad in ours_gradients(step_grads, model.embedding_tied).items():  # backward adds to .grad
            params[name].grad = grad.clone() if params[name].grad is None else params[name].grad + grad
        optimizer.step()
        optimizer.zero_grad()
        if step == record2026.SPLIT_STEP:
            record2026.split_embedding(model, optimizer)
        after.append({name: p.detach().clone() for name, p in params.items()})
    return after, {name: optimizer.state[p] for name, p in params.items()}, model.embedding_tied


def relative_error(a, b):
    return ((a - b).abs().max() / b.abs().max().clamp(min=1e-30)).item()


def disagreements(first):
    """{what: relative error} over TOLERANCE between the port's and the reference's steps from `first`: the weights
    after each step, the optimizer's state after the last (the unused embedding's left out while tied)."""
    g = torch.Generator().manual_seed(first)
    initial_weights = record_weights(first <= R.split_step(CFG), g)
    initial = initial_weights, record_state(initial_weights, first, g)
    ref_weights, ref_state, grads = reference_run(first)
    weights, state, tied = port_run(first, grads, initial)
    errors = {}
    for i, (ours, theirs) in enumerate(zip(weights, ref_weights)):
        theirs = ours_from_record(theirs, CFG)
        for name in ours:
            if not (name == 'transformer.wte.weight' and first + i <= record2026.SPLIT_STEP):
                errors[f'step {first + i}: {name}'] = relative_error(ours[name], theirs[name])
    theirs = ours_from_record_state(ref_state, CFG)
    for name, s in state.items():
        if tied and name == 'transformer.wte.weight':
            continue
        if s.keys() != theirs[name].keys():
            errors[f'state keys of {name}'] = math.inf
            continue
        for key, t in s.items():
            errors[f'{key} of {name}'] = (0 if t == theirs[name][key] else math.inf) if key == 'step' else \
                relative_error(t, theirs[name][key])
    return {what: e for what, e in errors.items() if not e <= TOLERANCE}


@pytest.mark.parametrize('first', RUNS)
def test_the_optimizer_takes_the_records_steps_in_float64(first):
    assert disagreements(first) == {}


# each: what replaces a piece of training/record2026.py (monkeypatch, module) -> None
PIECES_TAKEN_OUT = {
    "NorMuon's variance step": lambda mp, m: mp.setattr(m, 'normuon_normalize', lambda v, second, beta2: v),
    'Newton-Schulz for Polar Express': lambda mp, m: mp.setattr(m, 'POLAR_EXPRESS', ((3.4445, -4.7750, 2.0315),) * 5),
    'Adam every step': lambda mp, m: mp.setattr(m, 'adam_steps_at', lambda step: True),
    "Adam on one step's gradients": lambda mp, m: mp.setattr(m.NorMuonAdam, 'stepped_groups',
                                                              lambda self: self.param_groups),
    'weight decay not cautious': lambda mp, m: mp.setattr(m, 'cautious_mask', lambda update, p, zero_too:
                                                          torch.ones_like(p)),
    'the head decayed as the rest': lambda mp, m: mp.setitem(m.ADAM_TABLE, 'embeddings', ((0.5, 0.95), 1.0, 1.0)),
    "the value tables at Adam's lr": lambda mp, m: mp.setitem(m.ADAM_TABLE, 'value_embeds', ((0.75, 0.95), 1.0, 5.0)),
    "MLP's c_proj at c_fc's lr": lambda mp, m: mp.setitem(m.NORMUON_TABLE, 'mlp.c_proj', (1, 2.0)),
    'no momentum warmup or cooldown': lambda mp, m: mp.setattr(m, 'momentum_at', lambda step: 0.95),
    "lr's stages": lambda mp, m: mp.setattr(m, 'LR_PEAKS', (1.0, 1.0, 1.0)),
    "lr's cooldown over 40%": lambda mp, m: mp.setattr(m, 'COOLDOWN_FRAC', 0.4),
    "the split without the head's state": lambda mp, m: mp.setattr(m, 'split_embedding',
                                                                    lambda model, optimizer: model.untie_embedding()),
    'the split': lambda mp, m: mp.setattr(m, 'split_embedding', lambda model, optimizer: None),
}


@pytest.mark.parametrize('name', PIECES_TAKEN_OUT)
def test_each_piece_taken_out_of_the_optimizer_breaks_the_agreement(name, monkeypatch):
    """At one of the runs at least: the first where it shows, the others not run."""
    PIECES_TAKEN_OUT[name](monkeypatch, record2026)
    for first in RUNS:
        if disagreements(first):
            return
    pytest.fail(f'the optimizer without {name} agrees with the record at every run')
