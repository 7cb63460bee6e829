"""The recipes as train.py keys (docs/recipe.md): the one tuned on a CPU, modded-nanogpt's record of 4 Jan 2025 that
the speedrun presets port (docs/record.md) and its record of 24 Nov 2024 that they ported before; nanoGPT's
baseline, the CPU-tuned recipe's ablations, and the measure bench_optim.py compares them by: the step at which a run
first reaches a loss."""
from training.errors import ConfigError
from training.rules import MODERN_DEFAULTS, inert_defaults

# nanoGPT's run: GPT-2's architecture (model.py's defaults), AdamW at learning_rate, cosine schedule
BASELINE = {'optim': 'adamw', 'lr_schedule': 'cosine'}
# 'cpu_tuned': modded-nanogpt's architecture, Muon for the blocks' matrices, warmup-stable-decay; the learning rates
# of its AdamW groups as tuned on character-level Tiny Shakespeare (docs/recipe.md). Without modded-nanogpt's
# zero-initialized projections, which cost loss in bench_optim.py's ablation, and its embedding shortcut, which
# changed nothing measurable there (DROPPED). One value-embedding table: the most the ablation's 2-layer model
# takes. U-net skips: neutral at 2 and 4 layers, paying at 8 (docs/recipe.md).
# 'record': the 4 Jan 2025 record's model, initialization, optimizer groups, hyperparameters and schedule's shape,
# which config/speedrun_gpt2_*.py set at GPT-2's size (with its 6 heads of 128, its layout and schedule lengths);
# the lengths (warmups, max_iters) and the shape are a run's own, and its blocks' pattern is at RECORD_DEPTH's scale
# (run_keys). 'record_2024_11_24': the record the presets ported before, every key where the two differ.
RECORD_DEPTH = 12
RECIPES = {
    'cpu_tuned': {'pos_emb': 'rope', 'norm': 'rmsnorm', 'qk_norm': True, 'mlp': 'relu2', 'tie_weights': False,
                  'logit_softcap': 15.0, 'value_embeds': 1, 'unet_skips': True, 'optim': 'muon', 'lr_schedule': 'wsd',
                  'muon_learning_rate': 0.02, 'embedding_learning_rate': 0.01, 'head_learning_rate': 0.004},
    'record': {'pos_emb': 'rope', 'rope_truncated': True, 'norm': 'rmsnorm', 'norm_gain': False, 'qk_norm': True,
               'mlp': 'relu2', 'tie_weights': False, 'zero_init_proj': True, 'logit_softcap': 15.0,
               'unet_skips': True, 'x0_shortcut': True, 'embed_norm': True, 'value_residual': False,
               'value_embeds': 3, 'value_scale': True, 'no_attn_layer': 7, 'weight_init': 'pytorch',
               'optim': 'muon', 'muon_split_qkv': True, 'muon_momentum_form': 'ema_eps', 'muon_learning_rate': 0.05,
               'muon_momentum': 0.95, 'embedding_learning_rate': 0.6, 'head_learning_rate': 0.008,
               'scalar_learning_rate': 0.04, 'beta1': 0.8, 'beta2': 0.95, 'weight_decay': 0.0, 'grad_clip': 0.0,
               'lr_schedule': 'wsd', 'warmup_iters': 0, 'cooldown_frac': 0.4, 'min_lr': 0.0},
}
RECIPES['record_2024_11_24'] = {**RECIPES['record'], 'rope_truncated': False, 'logit_softcap': 30.0,
                                'value_residual': True, 'value_embeds': 0, 'value_scale': False, 'no_attn_layer': -1,
                                'muon_momentum_form': 'sum', 'cooldown_frac': 640 / 1750}
RECIPE = RECIPES['cpu_tuned']  # the one the ablations below take apart
# component: what the recipe without it has instead (GPT-2's or nanoGPT's choice)
ABLATIONS = {'rope': {'pos_emb': 'learned'}, 'rmsnorm': {'norm': 'layernorm'}, 'qk_norm': {'qk_norm': False},
             'relu2': {'mlp': 'gelu'}, 'untied_head': {'tie_weights': True}, 'softcap': {'logit_softcap': 0.0},
             'value_embeds': {'value_embeds': 0}, 'unet_skips': {'unet_skips': False}, 'muon': {'optim': 'adamw'},
             'wsd': {'lr_schedule': 'cosine'}}
# component tried and left out: what the recipe with it has
DROPPED = {'zero_init': {'zero_init_proj': True}, 'x0_shortcut': {'x0_shortcut': True}}
# Attention over packed documents, as modded-nanogpt's 64K-token records: 'documents' keeps each position within its
# document (config's eot_token starts one: doc_token); 'packed' also makes the sequences PACK blocks long, with rows
# PACK times fewer (the same tokens a step) and attention windowed at the block: every position sees a whole window;
# 'window_warmup' grows that window over the whole run from a sixteenth of the block, in steps of that size, and
# 'window_warmup_long' to 7/4 of the block, as modded-nanogpt's record of 24 Nov 2024 grew its window from 64 to 1,792
# tokens where the record before it had 1,024 throughout
PACK = 4
LAYOUTS = {'documents': {'documents': True}, 'packed': {'documents': True, 'pack': PACK},
           'window_warmup': {'documents': True, 'pack': PACK, 'window_warmup': 1},
           'window_warmup_long': {'documents': True, 'pack': PACK, 'window_warmup': 7 / 4}}
RECORDS = ('record', 'record_2024_11_24')
RUNS = {'baseline': BASELINE, 'recipe': RECIPE, **{name: RECIPES[name] for name in RECORDS},
        **{f'recipe-{component}': {**RECIPE, **change} for component, change in ABLATIONS.items()},
        **{f'recipe+{component}': {**RECIPE, **change} for component, change in {**DROPPED, **LAYOUTS}.items()}}


def at_depth(keys):
    """keys whose value_embeds and no_attn_layer, set for a record's RECORD_DEPTH blocks, are scaled to keys' n_layer,
    the block without attention kept only where it has no table (the 4 Jan 2025 record's 3 tables and attention-less
    block 7: 1 table and block 2 of 4 blocks; 1 table and attention in both of 2)."""
    if keys['n_layer'] == RECORD_DEPTH:
        return keys
    scale, tables = keys['n_layer'] / RECORD_DEPTH, keys['value_embeds']
    tables = max(1, round(tables * scale)) if tables else 0
    layer = int(keys['no_attn_layer'] * scale)
    kept = keys['no_attn_layer'] >= 0 and tables <= layer < keys['n_layer'] - tables
    return dict(keys, value_embeds=tables, no_attn_layer=layer if kept else -1)


def run_keys(run, config):
    """train.py's keys of `run` (a dict of keys that differ from config's): config's, with GPT-2's architecture
    where neither sets a modern key; a run drops the keys that only what it turned off reads (Muon's on AdamW). A
    run of LAYOUTS attends within the documents that config's eot_token separates, and its 'pack' multiplies
    block_size and divides batch_size by it, with attn_window the config's block_size; 'window_warmup' makes that
    window grow from block_size // 16 over max_iters to its multiple of block_size. A record's layers scale with
    n_layer (at_depth)."""
    keys = {**MODERN_DEFAULTS, **config, **run}
    if any(run is RECIPES[name] for name in RECORDS):
        keys = at_depth(keys)
    keys.update(inert_defaults(keys))  # the keys of what an ablation turned off (Muon's, wsd's cooldown)
    if keys.pop('documents', False):
        keys['doc_token'] = config['eot_token']
    window_warmup = keys.pop('window_warmup', 0)
    if window_warmup:
        keys.update(attn_window_warmup_iters=config['max_iters'], attn_window_warmup_start=config['block_size'] // 16)
    pack = keys.pop('pack', 1)
    if pack > 1:
        keys.update(block_size=pack * config['block_size'], batch_size=config['batch_size'] // pack,
                    attn_window=round((window_warmup or 1) * config['block_size']))
    return keys


def first_step_reaching(curve, target):
    """The first step of `curve` ({step: val loss}, in step order) whose loss is at most `target`; None if none is."""
    return next((step for step, loss in curve.items() if loss <= target), None)


def baseline_sweep(learning_rates, config):
    """'baseline' at each of `learning_rates` (comma-separated): {'baseline@LR': its run keys}, min_lr in proportion
    to config's min_lr / learning_rate, so that every run's schedule has the same shape; {} for ''."""
    sweep = {}
    for text in filter(None, (part.strip() for part in learning_rates.split(','))):
        try:
            lr = float(text)
        except ValueError:
            lr = 0.0
        if not lr > 0:
            raise ConfigError(f"baseline_lrs: {text!r} is not a positive learning rate: e.g. "
                              f"--baseline_lrs=1e-3,2e-3,4e-3")
        sweep[f'baseline@{text}'] = {**BASELINE, 'learning_rate': lr,
                                     'min_lr': config['min_lr'] * lr / config['learning_rate']}
    return sweep
