"""training/recipe.py: the runs bench_optim.py compares the recipe by, and its steps-to-a-loss measure."""
import pytest

from training import configurator
from training import recipe, rules
from training.errors import ConfigError
from training.optim import MUON_ONLY_KEYS
from training.rules import MODERN_DEFAULTS

CONFIG = {'optim': 'adamw', 'lr_schedule': 'cosine', 'learning_rate': 1e-3, 'muon_learning_rate': 0.02,
          'muon_momentum_warmup_iters': 50, 'embedding_learning_rate': 0.0, 'head_learning_rate': 0.0}
TRAIN_KEYS = configurator.load_config(configurator.train_keys(), [])  # the rest of a config train.py checks


def test_the_baseline_is_gpt2s_architecture_with_adamw_and_cosine():
    keys = recipe.run_keys(recipe.RUNS['baseline'], CONFIG)
    assert {k: keys[k] for k in MODERN_DEFAULTS} == MODERN_DEFAULTS
    assert keys['optim'] == 'adamw' and keys['lr_schedule'] == 'cosine'
    assert keys['muon_momentum_warmup_iters'] == 0  # a key only Muon reads, which train.py refuses with AdamW


def test_each_ablation_changes_only_its_component_back():
    full = recipe.run_keys(recipe.RUNS['recipe'], CONFIG)
    assert full['optim'] == 'muon' and full['lr_schedule'] == 'wsd' and full['muon_momentum_warmup_iters'] == 50
    dropped = {k for change in recipe.DROPPED.values() for k in change}
    layout = {'attn_window', 'attn_window_block', 'doc_token'}  # recipe.LAYOUTS' runs: compared on their own
    record_only = {'embed_norm', 'norm_gain', 'value_residual', 'weight_init', 'value_scale', 'no_attn_layer',
                   'rope_truncated'}  # the records', not tried on this one
    assert all(full[k] != v for k, v in MODERN_DEFAULTS.items()
               if k not in dropped | layout | record_only)  # every kept option is on
    defaults = configurator.train_defaults()
    for component, change in recipe.ABLATIONS.items():
        keys = recipe.run_keys(recipe.RUNS[f'recipe-{component}'], CONFIG)
        differ = {k for k in full if keys[k] != full[k]}
        # and the keys that only what it turned off reads go with it, at train.py's defaults: Muon's with Muon (AdamW
        # at learning_rate throughout)
        gone = differ - set(change)
        assert gone <= {*rules.TURNED_ON_BY, *MUON_ONLY_KEYS} and all(keys[k] == defaults[k] for k in gone)
        assert component != 'muon' or 'muon_momentum_warmup_iters' in gone
        assert all(keys[k] == MODERN_DEFAULTS.get(k, CONFIG.get(k)) for k in change)
        assert not rules.inert_keys({**defaults, **keys})


def test_first_step_reaching_a_loss():
    curve = {0: 4.0, 25: 2.5, 50: 2.1, 75: 2.2, 100: 2.0}
    assert recipe.first_step_reaching(curve, 2.2) == 50
    assert recipe.first_step_reaching(curve, 2.5) == 25
    assert recipe.first_step_reaching(curve, 1.9) is None


def test_a_dropped_component_is_the_recipe_with_it_back():
    full = recipe.run_keys(recipe.RUNS['recipe'], CONFIG)
    for component, change in recipe.DROPPED.items():
        keys = recipe.run_keys(recipe.RUNS[f'recipe+{component}'], CONFIG)
        assert {k for k in full if keys[k] != full[k]} == set(change)
        assert all(full[k] == MODERN_DEFAULTS[k] != keys[k] for k in change)  # the recipe has GPT-2's choice


def test_the_packed_layout_keeps_a_steps_tokens_and_windows_attention_at_the_block():
    config = {**CONFIG, 'block_size': 64, 'batch_size': 16, 'eot_token': 7}
    full = recipe.run_keys(recipe.RUNS['recipe'], config)
    documents = recipe.run_keys(recipe.RUNS['recipe+documents'], config)
    assert {k for k in documents if documents[k] != full[k]} == {'doc_token'} and documents['doc_token'] == 7
    packed = recipe.run_keys(recipe.RUNS['recipe+packed'], config)
    assert {k for k in packed if packed[k] != full[k]} == {'doc_token', 'block_size', 'batch_size', 'attn_window'}
    assert (packed['block_size'], packed['batch_size'], packed['attn_window']) == (4 * 64, 16 // 4, 64)


def test_the_window_warmup_grows_the_packed_layouts_window_over_the_run():
    config = {**CONFIG, 'block_size': 64, 'batch_size': 16, 'eot_token': 7, 'max_iters': 300}
    packed = recipe.run_keys(recipe.RUNS['recipe+packed'], config)
    warmup = recipe.run_keys(recipe.RUNS['recipe+window_warmup'], config)
    assert {k for k in warmup if warmup.get(k) != packed.get(k)} == {'attn_window_warmup_iters',
                                                                      'attn_window_warmup_start'}
    assert (warmup['attn_window_warmup_iters'], warmup['attn_window_warmup_start']) == (300, 4)
    assert warmup['attn_window'] == 64
    long = recipe.run_keys(recipe.RUNS['recipe+window_warmup_long'], config)  # the record's 1,792 of 1,024
    assert {k for k in long if long.get(k) != warmup.get(k)} == {'attn_window'} and long['attn_window'] == 112


@pytest.mark.parametrize('name', recipe.RECORDS)
def test_each_record_sets_its_own_hyperparameters_over_the_runs_and_keeps_its_lengths(name):
    """A record's run has every value of its RECIPES entry whatever the config says, and the config's lengths; at
    the record's depth its blocks' pattern too (the 4 Jan 2025 record's: 3 value tables, no attention in block 7)."""
    config = {**CONFIG, 'beta1': 0.9, 'weight_decay': 0.1, 'grad_clip': 1.0, 'max_iters': 100,
              'n_layer': recipe.RECORD_DEPTH}
    keys = recipe.run_keys(recipe.RUNS[name], config)
    assert {k: keys[k] for k in recipe.RECIPES[name]} == recipe.RECIPES[name]
    assert (keys['beta1'], keys['weight_decay'], keys['grad_clip'], keys['muon_split_qkv']) == (0.8, 0.0, 0.0, True)
    assert keys['max_iters'] == 100 and keys['muon_momentum_warmup_iters'] == 50
    assert set(recipe.RECIPES[name]) - set(MODERN_DEFAULTS) >= {'optim', 'scalar_learning_rate'}
    rules.check_config({**TRAIN_KEYS, **keys}, 1, 'cpu')


def test_the_records_blocks_pattern_scales_with_the_depth():
    """At 4 layers the 4 Jan 2025 record's 3 tables of 12 blocks are 1 (blocks 0 and 3), its attention-less block 7
    is block 2; at 2 layers every block has the table and attention; the 24 Nov 2024 record has neither."""
    keys = recipe.run_keys(recipe.RUNS['record'], {**CONFIG, 'n_layer': 4})
    assert (keys['value_embeds'], keys['no_attn_layer']) == (1, 2)
    rules.check_config({**TRAIN_KEYS, **keys}, 1, 'cpu')
    before = recipe.run_keys(recipe.RUNS['record_2024_11_24'], {**CONFIG, 'n_layer': 4})
    assert (before['value_embeds'], before['no_attn_layer']) == (0, -1)
    two = recipe.run_keys(recipe.RUNS['record'], {**CONFIG, 'n_layer': 2})  # both blocks have the table
    assert (two['value_embeds'], two['no_attn_layer']) == (1, -1)
    rules.check_config({**TRAIN_KEYS, **two}, 1, 'cpu')


def test_the_baseline_sweep_keeps_the_schedules_shape():
    """Each learning rate of the sweep is a baseline run whose min_lr keeps config's ratio to learning_rate."""
    sweep = recipe.baseline_sweep('1e-3, 4e-3', {**CONFIG, 'min_lr': 1e-4})
    assert list(sweep) == ['baseline@1e-3', 'baseline@4e-3']
    assert sweep['baseline@4e-3'] == {**recipe.BASELINE, 'learning_rate': 4e-3, 'min_lr': pytest.approx(4e-4)}
    assert recipe.baseline_sweep('', CONFIG) == {}
    for bad in ('0', '-1e-3', 'fast'):
        with pytest.raises(ConfigError, match=f"baseline_lrs: '{bad}' is not a positive learning rate"):
            recipe.baseline_sweep(bad, CONFIG)
