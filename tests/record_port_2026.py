"""What the tests of the 24 Jan 2026 record's port share (tests/unit/test_record_2026_model.py,
tests/unit/training/test_record2026.py): the map between the record's tensors (tests/record_reference_2026_01_24.py's
names: banks, the scalars vector, lm_head stored transposed) and gpt2026.py's parameters, for weights, gradients and
the optimizers' per-parameter state."""
import torch

import record_reference_2026_01_24 as R


def ours_from_record(w, cfg):
    """The record's weights (or anything of their shapes: moments, gradients) under the port's names, as views where
    they can be: the banks' entries as each layer's matrices and gates, the scalars as named lambdas, lm_head's weight
    and MLP's c_proj transposed (F.linear's layout). The MLP bank's padding entry and layer 6's attention lambdas,
    which no layer uses, have no counterpart."""
    scalars, L, D = w['scalars'], cfg.num_layers, cfg.model_dim
    ours = {'transformer.wte.weight': w['embed.weight'], 'lm_head.weight': w['lm_head.weight'].T,
            'transformer.bigram_embed.weight': w['bigram_embed.weight'], 'smear_gate.weight': w['smear_gate.weight'],
            'skip_gate.weight': w['skip_gate.weight'], 'x0_lambdas': w['x0_lambdas'],
            'resid_lambdas': scalars[:L], 'bigram_lambdas': scalars[3 * L:4 * L], 'smear_lambda': scalars[4 * L:][:1],
            'backout_lambda': scalars[4 * L + 1:][:1], 'skip_lambda': scalars[4 * L + 2:][:1]}
    ours.update({f'transformer.value_embeds.{j}.weight': w[f'value_embeds.{j}.weight'] for j in range(3)})
    for i in range(L):
        p = f'transformer.h.{i}.'
        ours[p + 'mlp.c_fc.weight'], ours[p + 'mlp.c_proj.weight'] = w['mlp_bank'][i, 0], w['mlp_bank'][i, 1].T
        if i in R.ATTN_LAYERS:
            a = R.ATTN_LAYERS.index(i)
            ours[p + 'attn.c_attn.weight'], ours[p + 'attn.c_proj.weight'] = w['attn_bank'][a].split([3 * D, D])
            ours[p + 'attn.lambdas'] = scalars[L + 2 * i:L + 2 * i + 2]
            ours[p + 'attn.gate.weight'] = w['attn_gate_bank'][a]
        if i in R.VE_GATE_LAYERS:
            ours[p + 'attn.value_gate.weight'] = w['ve_gate_bank'][R.VE_GATE_LAYERS.index(i)]
    return ours


def record_from_ours(ours, cfg):
    """ours_from_record's inverse: zero where the port has no tensor; the embedding left out where `ours` has none
    (the port's, tied)."""
    record = {name: torch.zeros(shape, dtype=torch.float64) for name, shape in R.record_shapes(cfg).items()}
    targets = ours_from_record(record, cfg)  # views of the record's tensors: writing them fills the record's
    for name, t in ours.items():
        if name != 'lm_head.weight':
            targets[name].copy_(t)
    record['lm_head.weight'] = ours['lm_head.weight'].T
    if 'transformer.wte.weight' not in ours:
        del record['embed.weight']
    return record


def record_source(name):
    """The record's tensor that the port's parameter `name` is, or is part of."""
    if name == 'transformer.wte.weight':
        return 'embed.weight'
    if name.startswith(('transformer.value_embeds.', 'transformer.bigram_embed.')):
        return name[len('transformer.'):]
    if name in ('lm_head.weight', 'smear_gate.weight', 'skip_gate.weight', 'x0_lambdas'):
        return name
    if name.endswith('.attn.gate.weight'):
        return 'attn_gate_bank'
    if name.endswith('.attn.value_gate.weight'):
        return 've_gate_bank'
    if '.attn.c_' in name:
        return 'attn_bank'
    return 'mlp_bank' if '.mlp.' in name else 'scalars'


def ours_from_record_state(state, cfg):
    """The record's optimizer state (R.init_optimizer_state's layout) as the port's, {parameter name: state}: Adam's
    moments through ours_from_record, its step count the record tensor's; NorMuon's momentum through it too (the
    banks' matrices are the layers'), its second moment per matrix: a layer's q, k, v as c_attn's 3, o as
    c_proj's, the MLP's c_proj transposed (its rows the record's columns)."""
    shapes = R.record_shapes(cfg)

    def full(key, as_bank=False):  # {record name: that state tensor, zeros where the tensor has none}
        return {n: (state[n][key].view(shape) if as_bank else state[n][key]) if key in state[n]
                else torch.zeros(shape, dtype=torch.float64) for n, shape in shapes.items()}
    exp_avg, exp_avg_sq = ours_from_record(full('exp_avg'), cfg), ours_from_record(full('exp_avg_sq'), cfg)
    momentum = ours_from_record(full('momentum_buffer', as_bank=True), cfg)
    attn_second, mlp_second = state['attn_bank']['second_momentum_buffer'], state['mlp_bank']['second_momentum_buffer']
    ours = {}
    for name in exp_avg:
        source = record_source(name)
        if source not in ('attn_bank', 'mlp_bank'):
            ours[name] = {'step': state[source]['step'], 'exp_avg': exp_avg[name], 'exp_avg_sq': exp_avg_sq[name]}
            continue
        i = int(name.split('.')[2])
        if source == 'attn_bank':
            a = 4 * R.ATTN_LAYERS.index(i)
            second = attn_second[a:a + 3] if name.endswith('c_attn.weight') else attn_second[a + 3:a + 4]
        else:
            second = mlp_second[2 * i:2 * i + 1] if name.endswith('c_fc.weight') else mlp_second[2 * i + 1:2 * i + 2].mT
        ours[name] = {'momentum_buffer': momentum[name], 'second_momentum': second}
    return ours
