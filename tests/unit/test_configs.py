"""Every config/ file loads through configurator.py with train.py's keys; the 12 GB OpenWebText preset's batch shape."""
import ast

import pytest

import configurator
from helpers import ROOT
from training import rules


CONFIG_FILES = sorted((ROOT / 'config').glob('*.py'))


def load(path):
    return configurator.load_config(configurator.train_defaults(), [str(path)])


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


def test_openwebtext_12gb_batch_shape():
    path = ROOT / 'config' / 'train_openwebtext_12gb.py'
    config = load(path)
    assert config['dataset'] == 'openwebtext'
    assert (config['batch_size'], config['gradient_accumulation_steps'], config['block_size']) == (8, 64, 1024)
    assert config['batch_size'] * config['gradient_accumulation_steps'] * config['block_size'] == 524_288
    assert config['eval_iters'] == 50


@pytest.mark.parametrize('name, model', [('finetune_shakespeare_12gb.py', 'gpt2-large'),
                                         ('finetune_shakespeare_24gb.py', 'gpt2-xl')])
def test_finetune_presets_use_8bit_adamw_with_checkpointing(name, model):
    config = load(ROOT / 'config' / name)
    assert config['init_from'] == model and config['activation_checkpointing'] is True
    assert config['optim'] == 'adamw_8bit' and config['optimizer_in_backward'] is False
    assert (config['batch_size'], config['block_size'], config['gradient_accumulation_steps']) == (1, 1024, 32)
