"""The scripts' --help, in subprocesses: train.py's lists the keys of its declaration (configurator.train_keys),
nanoGPT's among them, each described; the tools' describe every key."""
import pytest
import torch

from training import configurator
from helpers import run_script


# nanoGPT's train.py keys: its config files and checkpoints' config set them, so each must exist here
NANOGPT_KEYS = {'out_dir', 'eval_interval', 'log_interval', 'eval_iters', 'eval_only', 'always_save_checkpoint',
                'init_from', 'wandb_log', 'wandb_project', 'wandb_run_name', 'dataset', 'gradient_accumulation_steps',
                'batch_size', 'block_size', 'n_layer', 'n_head', 'n_embd', 'dropout', 'bias', 'learning_rate',
                'max_iters', 'weight_decay', 'beta1', 'beta2', 'grad_clip', 'decay_lr', 'warmup_iters',
                'lr_decay_iters', 'min_lr', 'backend', 'device', 'dtype', 'compile'}


def help_lines(script):
    """{key: (default, description)} of `python script --help`, in the order listed, and the whole text."""
    listed = run_script(script, '--help', timeout=120)
    assert listed.returncode == 0, listed.stderr
    keys = {}
    for line in listed.stdout.splitlines():
        if line.startswith('  --'):
            key_value, _, description = line.strip()[2:].partition('  ')
            key, value = key_value.split('=', 1)
            keys[key] = (value, description)
    return keys, listed.stdout


def test_train_defaults_are_the_keys_train_py_runs_with():
    """train_defaults() reads train.py's declaration without running it; `train.py --help` lists what train.py's
    configurator takes, each with a description."""
    keys, _ = help_lines('train.py')
    defaults = configurator.train_defaults()
    assert {key: value for key, (value, _) in keys.items()} == {key: repr(value) for key, value in defaults.items()}
    assert [key for key, (_, description) in keys.items() if not description] == []
    assert keys['optim'][1].endswith('one of: adamw, adamw_bf16, adamw_8bit, muon')
    assert keys['compile'][1].endswith('; True or False')
    assert NANOGPT_KEYS <= set(defaults)
    assert defaults['gpu_headroom_gb'] > 0  # a desktop or a browser holds some of the card
    if not torch.cuda.is_available():  # the defaults run on this machine
        assert (defaults['device'], defaults['dtype'], defaults['compile'], defaults['backend']) == \
            ('cpu', 'float32', False, 'gloo')


@pytest.mark.parametrize('script', ['sample.py', 'hellaswag.py', 'estimate_memory.py', 'bench.py', 'bench_optim.py'])
def test_every_key_of_the_tools_help_has_a_description(script):
    keys, text = help_lines(script)
    assert [key for key, (_, description) in keys.items() if not description] == []
    assert keys['dtype'][1].endswith('one of: float32, bfloat16, float16')
    if script == 'bench.py':  # its own keys first, a description of two lines whole, then train.py's, as train.py's
        assert list(keys)[0] == 'mode'
        assert keys['mode'][1].endswith('the presets on this card; one of: train, loss, sample, card')
        train = configurator.train_keys()
        assert {key: keys[key][1] for key in ('n_layer', 'seed')} == {key: train[key].description
                                                                      for key in ('n_layer', 'seed')}
        assert set(train) < set(keys)
    if script == 'estimate_memory.py':  # its own keys first, then train.py's
        import estimate_memory
        from training.memory.estimate import ESTIMATOR_DEFAULTS
        own = list(ESTIMATOR_DEFAULTS)
        assert list(keys)[:len(own)] == own
        assert set(keys) == set(estimate_memory.estimator_defaults())
        assert 'exit status: 0 the config fits, 1 it does not (training or evaluation), 2 bad input' in text
