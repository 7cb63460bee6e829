"""Every config/ file loads through training/configurator.py with train.py's keys and passes train.py's checks; the
presets for a card train what nanoGPT's presets train (that they fit their card: e2e/test_estimate_memory.py)."""
import ast

import pytest

from training import configurator
from helpers import ROOT
from training import rules


CONFIG_FILES = sorted((ROOT / 'config').glob('*.py'))


def load(path):
    return configurator.load_config(configurator.train_keys(), [str(path)])


def test_config_directory_has_the_presets():
    names = {path.name for path in CONFIG_FILES}
    assert {'train_gpt2.py', 'train_shakespeare_char.py', 'finetune_shakespeare.py', 'eval_gpt2.py',
            'train_openwebtext_12gb.py', 'train_shakespeare_char_12gb.py', 'finetune_shakespeare_12gb.py'} <= names


def assigned_names(path):
    return {target.id for node in ast.parse(path.read_text()).body if isinstance(node, ast.Assign)
            for target in node.targets if isinstance(target, ast.Name)}


@pytest.mark.parametrize('path', CONFIG_FILES, ids=lambda path: path.name)
def test_config_sets_only_train_keys(path):
    """Every name a preset assigns is a train.py key: a misspelt key would be a helper variable, silently ignored."""
    assert assigned_names(path) <= set(configurator.train_defaults())
    config = load(path)  # and each value has its key's type: a ConfigError otherwise
    rules.check_config(config, 1, 'cuda')  # and train.py accepts it on a GPU


def tokens_per_step(config):
    return config['batch_size'] * config['gradient_accumulation_steps'] * config['block_size']


TRAINING_RUN = ('dataset', 'n_layer', 'n_head', 'n_embd', 'max_iters', 'lr_decay_iters', 'weight_decay')


def test_openwebtext_12gb_trains_nanogpts_gpt2_run_at_no_smaller_a_batch():
    """train_gpt2.py's model, data and schedule, in micro-batches a 12 GB card holds and at least its tokens a step."""
    ours, nanogpts = load(ROOT / 'config' / 'train_openwebtext_12gb.py'), load(ROOT / 'config' / 'train_gpt2.py')
    assert {key: ours[key] for key in TRAINING_RUN} == {key: nanogpts[key] for key in TRAINING_RUN}
    assert tokens_per_step(ours) >= tokens_per_step(nanogpts) and ours['batch_size'] < nanogpts['batch_size']


FINETUNING = ('dataset', 'max_iters', 'learning_rate', 'decay_lr', 'eval_interval', 'eval_iters')


@pytest.mark.parametrize('name', ['finetune_shakespeare_12gb.py', 'finetune_shakespeare_24gb.py'])
def test_finetune_presets_are_nanogpts_finetuning_of_a_gpt2(name):
    """finetune_shakespeare.py's run (data, steps, learning rate, tokens a step) from a GPT-2 its card holds."""
    ours, nanogpts = load(ROOT / 'config' / name), load(ROOT / 'config' / 'finetune_shakespeare.py')
    assert {key: ours[key] for key in FINETUNING} == {key: nanogpts[key] for key in FINETUNING}
    assert tokens_per_step(ours) == tokens_per_step(nanogpts)
    assert ours['init_from'] in {'gpt2', 'gpt2-medium', 'gpt2-large', 'gpt2-xl'}


@pytest.mark.parametrize('name', ['speedrun_gpt2_12gb.py', 'speedrun_gpt2_8gb.py'])
def test_speedrun_presets_are_the_record(name):
    """The speedrun presets set training/recipe.py's RECIPES['record'] (the 4 Jan 2025 record) key by key, at GPT-2
    124M's width and depth with the record's 6 heads of 128; its layout (documents read in order, a window of blocks
    of 128 growing from 1 block towards 1,856 positions, at most 1,792, over the 1,390 steps), 524,288 tokens a step,
    Muon's momentum warmup, an evaluation at the end; HellaSwag besides."""
    from training.recipe import RECIPES
    config = load(ROOT / 'config' / name)
    assert {k: config[k] for k in RECIPES['record']} == RECIPES['record']
    assert (config['n_layer'], config['n_head'], config['n_embd']) == (12, 6, 768)
    assert (config['attn_window'], config['attn_window_block'], config['attn_window_warmup_start'],
            config['attn_window_warmup_end']) == (1792, 128, 128, 1856) and config['doc_token'] == 50256
    assert config['attn_window_warmup_iters'] == config['max_iters'] == config['lr_decay_iters'] == 1390
    assert config['batch_order'] == 'sequential' and config['muon_momentum_warmup_iters'] == 300
    assert config['batch_size'] * config['gradient_accumulation_steps'] * config['block_size'] == 524_288
    assert config['eval_interval'] == 139 and config['max_iters'] % 139 == 0  # the last evaluation at the end
    assert config['dataset'] == 'fineweb' and config['hellaswag']
