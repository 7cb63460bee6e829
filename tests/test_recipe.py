"""training/recipe.py: the runs bench_optim.py compares the recipe by, and its steps-to-a-loss measure."""
import json

import pytest

from helpers import run_script
from training import recipe
from training.optim import MUON_ONLY_KEYS
from training.rules import MODERN_DEFAULTS

CONFIG = {'optim': 'adamw', 'lr_schedule': 'cosine', 'learning_rate': 1e-3, 'muon_learning_rate': 0.02,
          'muon_momentum_warmup_iters': 50, 'embedding_learning_rate': 0.0, 'head_learning_rate': 0.0}


def test_the_baseline_is_gpt2s_architecture_with_adamw_and_cosine():
    keys = recipe.run_keys(recipe.RUNS['baseline'], CONFIG)
    assert {k: keys[k] for k in MODERN_DEFAULTS} == MODERN_DEFAULTS
    assert keys['optim'] == 'adamw' and keys['lr_schedule'] == 'cosine'
    assert keys['muon_momentum_warmup_iters'] == 0  # a key only Muon reads, which train.py refuses with AdamW


def test_each_ablation_changes_only_its_component_back():
    full = recipe.run_keys(recipe.RUNS['recipe'], CONFIG)
    assert full['optim'] == 'muon' and full['lr_schedule'] == 'wsd' and full['muon_momentum_warmup_iters'] == 50
    dropped = {k for change in recipe.DROPPED.values() for k in change}
    assert all(full[k] != v for k, v in MODERN_DEFAULTS.items() if k not in dropped)  # every kept option is on
    for component, change in recipe.ABLATIONS.items():
        keys = recipe.run_keys(recipe.RUNS[f'recipe-{component}'], CONFIG)
        differ = {k for k in full if keys[k] != full[k]}
        if component == 'muon':  # and the keys only Muon reads go with it: AdamW at learning_rate throughout
            assert differ == {'optim', *MUON_ONLY_KEYS}
        else:
            assert differ == set(change)
        assert all(keys[k] == MODERN_DEFAULTS.get(k, CONFIG.get(k)) for k in change)


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


@pytest.mark.slow
def test_bench_optim_summarizes_the_runs_over_seeds(data_dir, tmp_path):
    """Two seeds, two steps: each run's curve is the mean of its seeds' curves, and the baseline reaches its own
    final loss no later than its last step; a run name out of RUNS is one line."""
    args = [f'--data_dir={data_dir}', '--dataset=tiny_char', '--n_layer=1', '--n_head=2', '--n_embd=32',
            '--block_size=16', '--batch_size=4', '--max_iters=2', '--eval_interval=1', '--eval_iters=2',
            '--lr_decay_iters=2', '--warmup_iters=1', '--seeds=1,2']
    out = tmp_path / 'bench.json'
    result = run_script('bench_optim.py', *args, '--runs=baseline,recipe,recipe-muon', f'--json_path={out}')
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())
    for name in ('baseline', 'recipe', 'recipe-muon'):
        by_seed = report['seeds'][name]
        assert report['curves'][name] == {step: pytest.approx((by_seed['1'][step] + by_seed['2'][step]) / 2)
                                          for step in ('0', '1', '2')}
        assert report['summary'][name]['final_mean'] == pytest.approx(report['curves'][name]['2'])
    assert report['seeds']['recipe']['1'] != report['seeds']['recipe-muon']['1']
    assert all(step is not None and step <= 2 for step in report['summary']['baseline']['reached'])
    assert 'step reaching baseline\'s final' in result.stdout
    result = run_script('bench_optim.py', *args, '--runs=baseline,recipe-nothing')
    assert result.returncode == 2 and "unknown run 'recipe-nothing'" in result.stderr
