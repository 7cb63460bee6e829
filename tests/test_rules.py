"""training/: train.py's checks and model_args (rules.py), the learning rate schedule, the out_dir check, the GPUs'
peak FLOPS, the message of a collective that timed out, and fail()'s one line under torchrun. Pure functions, no
training."""
import math
import os
import pickle
import subprocess
import sys

import pytest
import torch

import configurator
from helpers import ROOT
from training import rules
from training.device import peak_flops
from training.errors import ConfigError, fail
from training.parallel import collective_failure
from training.paths import check_writable_dir
from training.schedule import cosine_lr, wsd_lr


@pytest.fixture
def config(tmp_path):
    """train.py's defaults, a 2-layer model on a dataset in tmp_path with a 40-token meta.pkl."""
    (tmp_path / 'tiny').mkdir()
    with open(tmp_path / 'tiny' / 'meta.pkl', 'wb') as f:
        pickle.dump({'vocab_size': 40}, f)
    return {**configurator.train_defaults(), 'data_dir': str(tmp_path), 'dataset': 'tiny', 'n_layer': 2,
            'n_head': 2, 'n_embd': 32, 'block_size': 16, 'device': 'cpu', 'dtype': 'float32', 'backend': 'gloo'}


@pytest.mark.parametrize('overrides, message', [
    ({'n_head': 0}, 'n_head must be at least 1, got 0'),
    ({'n_embd': 0}, 'n_embd must be at least 1, got 0'),
    ({'n_layer': -1}, 'n_layer must be at least 1, got -1'),
    ({'dropout': 2.0}, 'dropout is a probability in [0, 1), got 2.0'),
    ({'n_embd': 30, 'n_head': 4}, 'n_embd=30 must be divisible by n_head=4'),
    ({'parallelism': 'zero3'}, "unknown parallelism 'zero3': use one of ddp, zero1, fsdp (docs/parallel.md)"),
    ({'fsdp_mixed_precision': True}, "applies to parallelism='fsdp'"),
    ({'timeout': 0}, 'timeout=0 must be positive'),
    ({'backend': 'nccl'}, "backend='nccl' needs CUDA"),
    ({'init_from': 'gpt3'}, "unknown init_from 'gpt3'"),
    ({'auto_batch_size': True}, 'auto_batch_size=True sizes the batch'),
    ({'optim': 'adam8'}, "unknown optim 'adam8'"),
    ({'hellaswag_examples': -1}, 'hellaswag_examples must be at least 1, or 0 for all; got -1'),
    ({'gpu_headroom_gb': -0.5}, 'gpu_headroom_gb=-0.5 must be 0 or more'),
    ({'learning_rate': -1}, 'learning_rate must be positive, got -1'),
    ({'beta2': 1.5}, 'beta2 is a moment'),
    ({'weight_decay': -1}, 'weight_decay must be 0 or more'),
    ({'warmup_iters': -1}, 'warmup_iters must be 0 or more, got -1'),
    ({'min_lr': -1.0}, 'min_lr must be 0 or more, got -1.0'),
    ({'learning_rate': 1e-5}, 'min_lr=6e-05 is above learning_rate=1e-05: the decay would raise the rate after '
                              'warmup; use --min_lr=1e-06 (learning_rate/10) or --decay_lr=False'),
])
def test_check_config_names_the_key(config, overrides, message):
    with pytest.raises(ConfigError) as e:
        rules.check_config({**config, **overrides}, 1, 'cpu')
    assert message in str(e.value) and '\n' not in str(e.value)


def test_check_config_accepts_the_defaults_and_splits_accumulation_over_processes(config):
    rules.check_config(config, 1, 'cpu')
    rules.check_config({**config, 'gradient_accumulation_steps': 4}, 4, 'cpu')
    with pytest.raises(ConfigError, match='gradient_accumulation_steps=4 is not divisible by the 3 processes'):
        rules.check_config({**config, 'gradient_accumulation_steps': 4}, 3, 'cpu')


def test_optimizer_in_backward_under_torchrun_says_one_process_not_divisibility(config):
    """With 2 processes, the accumulation of 1 does not divide over them, but one process is the fix that explains."""
    in_backward = {**config, 'optimizer_in_backward': True, 'grad_clip': 0.0, 'gradient_accumulation_steps': 1}
    with pytest.raises(ConfigError, match='optimizer_in_backward=True conflicts with 2 processes'):
        rules.check_config(in_backward, 2, 'cpu')


def test_finetuning_at_a_constant_rate_below_min_lr_is_accepted(config):
    rules.check_config({**config, 'learning_rate': 3e-5, 'decay_lr': False}, 1, 'cpu')  # nanoGPT's finetune configs


def test_model_args_for_scratch_resume_and_gpt2(config):
    args, crop = rules.model_args(config, rules.meta_vocab_size(config))
    assert (args['vocab_size'], args['n_layer'], args['block_size'], crop) == (40, 2, 16, None)
    assert rules.model_args(config, None)[0]['vocab_size'] == rules.DEFAULT_VOCAB_SIZE
    resumed = dict(n_layer=3, n_head=2, n_embd=32, block_size=32, bias=True, vocab_size=64, dropout=0.0)
    args, crop = rules.model_args({**config, 'init_from': 'resume', 'dropout': 0.1}, 40, resumed)
    assert (args['n_layer'], args['block_size'], args['vocab_size'], args['dropout']) == (3, 32, 64, 0.1)
    args, crop = rules.model_args({**config, 'init_from': 'gpt2-medium', 'block_size': 256}, None)
    assert (args['n_layer'], args['n_embd'], args['vocab_size'], args['block_size'], crop) == (24, 1024, 50257, 256,
                                                                                                256)


def test_model_args_refuse_what_does_not_fit(config):
    resumed = dict(n_layer=3, n_head=2, n_embd=32, block_size=8, bias=True, vocab_size=64, dropout=0.0)
    with pytest.raises(ConfigError, match="block_size=16 is larger than the resumed model's 8"):
        rules.model_args({**config, 'init_from': 'resume'}, None, resumed)
    with pytest.raises(ConfigError, match="meta.pkl has vocab_size 100 but the model's is 64"):
        rules.model_args({**config, 'init_from': 'resume', 'block_size': 8}, 100, resumed)
    with pytest.raises(ConfigError, match="hellaswag=True scores GPT-2 tokens, but the model's vocab_size is 40"):
        rules.model_args({**config, 'hellaswag': True}, 40)
    assert rules.model_args({**config, 'hellaswag': True}, None)[0]['vocab_size'] == rules.DEFAULT_VOCAB_SIZE


def test_model_args_of_a_gpt2_architecture_are_nanogpts_and_modern_keys_are_recorded(config):
    nanogpt_keys = {'n_layer', 'n_head', 'n_embd', 'block_size', 'bias', 'vocab_size', 'dropout'}
    assert set(rules.model_args(config, None)[0]) == nanogpt_keys  # nanoGPT's GPTConfig(**model_args) takes them
    modern = {'pos_emb': 'rope', 'mlp': 'relu2', 'logit_softcap': 15.0}
    args = rules.model_args({**config, **modern}, None)[0]
    assert set(args) == nanogpt_keys | set(modern) and all(args[k] == v for k, v in modern.items())
    resumed = dict(n_layer=3, n_head=2, n_embd=32, block_size=32, bias=True, vocab_size=64, dropout=0.0)
    # a checkpoint without the keys (nanoGPT's) is GPT-2's architecture, whatever the config says; one with them
    # keeps them
    assert set(rules.model_args({**config, **modern, 'init_from': 'resume'}, None, resumed)[0]) == nanogpt_keys
    args = rules.model_args({**config, 'init_from': 'resume'}, None, {**resumed, 'norm': 'rmsnorm'})[0]
    assert args['norm'] == 'rmsnorm'


@pytest.mark.parametrize('overrides, message', [
    ({'pos_emb': 'alibi'}, "unknown pos_emb 'alibi': use one of 'learned', 'rope'"),
    ({'norm': 'batchnorm'}, "unknown norm 'batchnorm'"),
    ({'mlp': 'swiglu'}, "unknown mlp 'swiglu'"),
    ({'logit_softcap': -1.0}, 'logit_softcap must be 0 (off) or positive'),
    ({'init_from': 'gpt2', 'pos_emb': 'rope'}, "init_from='gpt2' loads GPT-2 weights, trained with GPT-2's "
                                               "architecture, which pos_emb='rope' changes: drop --pos_emb"),
    ({'pos_emb': 'rope', 'n_embd': 30, 'n_head': 2}, 'n_embd / n_head = 15 is odd'),
    ({'embedding_learning_rate': 0.3}, "embedding_learning_rate=0.3 sets a parameter group of optim='muon'"),
    ({'optim': 'muon', 'muon_momentum_warmup_iters': -1}, 'muon_momentum_warmup_iters must be 0 or more'),
    ({'lr_schedule': 'linear'}, "unknown lr_schedule 'linear': use 'cosine' or 'wsd'"),
    ({'lr_schedule': 'wsd', 'cooldown_frac': 0.0}, 'cooldown_frac must be in (0, 1]'),
])
def test_modern_keys_out_of_range_are_one_line(config, overrides, message):
    with pytest.raises(ConfigError) as e:
        rules.check_config({**config, **overrides}, 1, 'cpu')
    assert message in str(e.value) and '\n' not in str(e.value)


def test_check_dataset(config, tmp_path):
    with pytest.raises(ConfigError, match=r"dataset 'tiny' is not prepared: .*train.bin not found"):
        rules.check_dataset(config)
    (tmp_path / 'tiny' / 'train.bin').write_bytes(bytes(200))
    (tmp_path / 'tiny' / 'val.bin').write_bytes(b'')
    with pytest.raises(ConfigError, match='val.bin is empty: prepare the dataset again'):
        rules.check_dataset(config)
    (tmp_path / 'tiny' / 'val.bin').write_bytes(bytes(20))  # 10 tokens, fewer than block_size + 1
    with pytest.raises(ConfigError, match=r'the val split, .*val.bin, has 10 tokens but block_size=16 needs at least '
                                          r'17: use a smaller --block_size, or prepare a larger validation split '
                                          r'\(prepare/openwebtext.py: a larger --test_size\)'):
        rules.check_dataset(config)
    (tmp_path / 'tiny' / 'train.bin').write_bytes(bytes(20))
    with pytest.raises(ConfigError, match=r'the train split, .*train.bin, has 10 tokens .* a larger --max_tokens'):
        rules.check_dataset(config)
    rules.check_dataset({**config, 'block_size': 8})


def test_prepare_hint_names_the_script_relative_to_the_current_directory(config, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    hint = rules.prepare_hint({**config, 'dataset': 'shakespeare_char', 'data_dir': 'data'})
    assert hint == f"run `python {os.path.relpath(ROOT / 'prepare' / 'shakespeare_char.py')}`"
    assert rules.prepare_hint({**config, 'dataset': 'shakespeare_char', 'data_dir': 'elsewhere'}).endswith(
        f" --out_dir {os.path.join('elsewhere', 'shakespeare_char')}`")
    assert 'data/README.md' in rules.prepare_hint({**config, 'dataset': 'mine'})


def nanogpt_get_lr(it, learning_rate, min_lr, warmup_iters, lr_decay_iters):
    """nanoGPT's train.py get_lr, as it is (it divides by zero where warmup_iters == lr_decay_iters == it)."""
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it > lr_decay_iters:
        return min_lr
    decay_ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))
    return min_lr + coeff * (learning_rate - min_lr)


def test_schedule_is_nanogpts_and_defined_where_nanogpts_divides_by_zero():
    for it in range(0, 120):
        assert cosine_lr(it, 6e-4, 6e-5, 10, 100) == pytest.approx(nanogpt_get_lr(it, 6e-4, 6e-5, 10, 100), abs=1e-15)
    assert [cosine_lr(it, 1.0, 0.1, 1, 1) for it in range(3)] == [0.5, 0.1, 0.1]  # nanoGPT: ZeroDivisionError at 1
    assert [cosine_lr(it, 1.0, 0.1, 4, 2) for it in (3, 4, 5)] == [0.8, 0.1, 0.1]  # decay ends before warmup does


def test_wsd_warms_up_as_cosine_holds_then_decays_linearly_to_min_lr():
    lrs = [wsd_lr(it, 1.0, 0.1, 2, 10, 0.3) for it in range(12)]
    assert lrs[:2] == [cosine_lr(it, 1.0, 0.1, 2, 10) for it in range(2)]  # the same warmup
    assert lrs[2:7] == [1.0] * 5  # stable until the last 30% of lr_decay_iters
    assert lrs[7:] == pytest.approx([1.0, 0.7, 0.4, 0.1, 0.1])  # linear from iter 7 to min_lr at 10, then held
    # a cooldown longer than what follows the warmup starts right after it
    assert [wsd_lr(it, 1.0, 0.0, 4, 8, 1.0) for it in (3, 4, 6, 8)] == pytest.approx([0.8, 1.0, 0.5, 0.0])


def test_writable_dir_check_leaves_nothing_behind(tmp_path):
    check_writable_dir(str(tmp_path / 'new' / 'deeper'))
    check_writable_dir(str(tmp_path))
    assert list(tmp_path.iterdir()) == []
    (tmp_path / 'file').write_text('x')
    with pytest.raises(ConfigError, match=f"out_dir='{tmp_path / 'file' / 'out'}' cannot be a directory: "
                                          f"{tmp_path / 'file'} is a file"):
        check_writable_dir(str(tmp_path / 'file' / 'out'))
    with pytest.raises(ConfigError, match='out_dir is empty'):
        check_writable_dir('')


@pytest.mark.skipif(not os.path.isdir('/proc/self'), reason='needs Linux /proc, where nobody, root included, writes')
def test_unwritable_dir_is_refused_even_as_root():
    with pytest.raises(ConfigError, match="cannot write in out_dir='/proc/nanogpt_out'"):
        check_writable_dir('/proc/nanogpt_out')


def test_peak_flops_by_device_name(monkeypatch):
    assert peak_flops('cpu') is None
    names = {'NVIDIA GeForce RTX 3060': 25.5e12, 'NVIDIA GeForce RTX 3060 Ti': 32.4e12,
             'NVIDIA A100-SXM4-80GB': 312e12, 'NVIDIA A10G': 70e12, 'NVIDIA H100 PCIe': 756e12,
             'NVIDIA H100 80GB HBM3': 989e12, 'NVIDIA L40S': 362e12, 'NVIDIA L4': 121e12}
    for name, flops in names.items():
        monkeypatch.setattr(torch.cuda, 'get_device_name', lambda device, name=name: name)
        assert peak_flops('cuda:0') == (flops, name)
    for name in ('NVIDIA GeForce RTX 3060 Laptop GPU', 'Some Future GPU'):
        monkeypatch.setattr(torch.cuda, 'get_device_name', lambda device, name=name: name)
        assert peak_flops('cuda') is None


def all_reduce_in_estimate_loss():
    """A RuntimeError raised as gloo raises a timeout, from a frame of torch/distributed called from train.py."""
    namespace = {}
    distributed_file = os.path.join(os.path.dirname(torch.__file__), 'distributed', 'distributed_c10d.py')
    exec(compile('def all_reduce():\n    raise RuntimeError("[../gloo/transport/tcp/unbound_buffer.cc:78] Timed out '
                 'waiting 5000ms for recv operation to complete")\n', distributed_file, 'exec'), namespace)
    exec(compile('def estimate_loss():\n    all_reduce()\n', str(ROOT / 'train.py'), 'exec'), namespace)
    try:
        namespace['estimate_loss']()
    except RuntimeError as e:
        return e


def test_collective_failure_names_the_collective_and_what_to_check():
    message, secondary = collective_failure(all_reduce_in_estimate_loss(), 5)
    assert message.startswith('all_reduce at train.py line 2 (') and not secondary
    assert 'within timeout=5s (' in message and 'Timed out waiting 5000ms' in message and '--timeout' in message
    assert '\n' not in message
    assert collective_failure(RuntimeError('mat1 and mat2 shapes cannot be multiplied'), 5) is None
    try:
        raise RuntimeError('[../gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:43719')
    except RuntimeError as gone:
        assert collective_failure(gone, 5)[1]  # secondary: the rank that is gone reports why


@pytest.mark.parametrize('rank, every_rank, printed', [('0', False, 'error: bad\n'), ('1', False, 'error: rank 1: bad\n'),
                                                        ('1', True, 'error: rank 1: bad\n')])
def test_fail_names_the_rank_where_the_error_is_the_ranks_own(rank, every_rank, printed):
    """Rank 1 waits for torchrun to stop it once rank 0 has printed the same error (not waited for here)."""
    code = f'from training import errors; errors.OTHER_RANKS_WAIT = 0; errors.fail("bad", every_rank={every_rank})'
    result = subprocess.run([sys.executable, '-c', code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                            env={**os.environ, 'RANK': rank, 'WORLD_SIZE': '2'})
    assert (result.returncode, result.stderr) == (2, printed)


def test_an_error_line_is_one_write_so_ranks_sharing_stderr_do_not_interleave(monkeypatch):
    """Unbuffered (PYTHONUNBUFFERED=1), each write of stderr is a write to the file torchrun's ranks share: print's
    text and newline are two, and another rank's line could land between them ('error: rank 0: ...error: rank 1:')."""
    writes = []
    monkeypatch.setattr(sys, 'stderr', type('Unbuffered', (), {'write': lambda self, text: writes.append(text),
                                                              'flush': lambda self: None})())
    with pytest.raises(SystemExit):
        fail('bad')
    assert writes == ['error: bad\n']
