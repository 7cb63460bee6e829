"""training/rules.py: train.py's checks of its config and dataset, and model_args."""
import os
import pickle

import pytest

from training import configurator
from helpers import ROOT
from training import rules
from training.errors import ConfigError


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
    ({'max_iters': -5}, 'max_iters must be 0 or more, got -5'),
    ({'lr_decay_iters': -3}, 'lr_decay_iters must be 0 or more, got -3'),
    ({'seed': -1}, 'seed must be 0 or more, got -1'),
    ({'dropout': 2.0}, 'dropout is a probability in [0, 1), got 2.0'),
    ({'n_embd': 30, 'n_head': 4}, 'n_embd=30 must be divisible by n_head=4'),
    ({'parallelism': 'zero3'}, "unknown parallelism 'zero3': use one of ddp, zero1, fsdp (docs/parallel.md)"),
    ({'fsdp_mixed_precision': True}, "applies to parallelism='fsdp'"),
    ({'timeout': 0}, 'timeout=0 must be positive'),
    ({'backend': 'nccl'}, "backend='nccl' needs CUDA"),
    ({'backend': 'foo'}, "unknown backend 'foo': use one of gloo, nccl, "),
    ({'init_from': 'gpt3'}, "unknown init_from 'gpt3'"),
    ({'auto_batch_size': True}, 'auto_batch_size=True sizes the batch'),
    ({'optim': 'adam8'}, "unknown optim 'adam8'"),
    ({'attention_kernel': 'sparse'}, "unknown attention_kernel 'sparse': use one of 'auto', 'flex', 'masked'"),
    ({'attention_kernel': 'flex'}, "attention_kernel='flex' runs windows in blocks of a multiple of 128 positions"),
    ({'attention_kernel': 'flex', 'attn_window': 256, 'attn_window_block': 128},
     "attention_kernel='flex' trains in FlexAttention's CUDA kernels: on device='cpu' use --attention_kernel=auto"),
    ({'hellaswag_examples': -1}, 'hellaswag_examples must be at least 1, or 0 for all; got -1'),
    ({'hellaswag_examples': 5}, "hellaswag_examples=5 acts only with hellaswag=True, which this config does not have: "
                                "add --hellaswag=True, or --hellaswag_examples=0 (its default)"),
    ({'muon_learning_rate': 0.1}, "muon_learning_rate=0.1 acts only with optim='muon'"),
    ({'muon_momentum': 0.9}, "muon_momentum=0.9 acts only with optim='muon'"),
    ({'muon_momentum_form': 'sum'}, "muon_momentum_form='sum' acts only with optim='muon'"),
    ({'cooldown_frac': 0.5}, "cooldown_frac=0.5 acts only with lr_schedule='wsd'"),
    ({'attn_window_warmup_start': 128}, 'attn_window_warmup_start=128 acts only with a window warmup, which this '
                                        'config does not have: add --attn_window_warmup_iters=N (e.g. max_iters)'),
    ({'decay_lr': False, 'lr_schedule': 'wsd', 'cooldown_frac': 0.4},
     "lr_schedule='wsd', cooldown_frac=0.4 act only with decay_lr=True, which this config does not have: add "
     "--decay_lr=True, or --lr_schedule=cosine --cooldown_frac=0.2 (defaults)"),
    ({'optim': 'muon', 'head_learning_rate': 0.008}, "head_learning_rate=0.008 acts only with tie_weights=False (a "
                                                     "head of its own)"),
    ({'gpu_headroom_gb': -0.5}, 'gpu_headroom_gb=-0.5 must be 0 or more'),
    ({'loss_chunk_mib': 0}, 'loss_chunk_mib=0 must be positive'),
    ({'memory_cap_gb': -1.0}, 'memory_cap_gb=-1.0 must be 0 (no cap) or positive'),
    ({'memory_cap_gb': 11.0}, "memory_cap_gb caps CUDA's caching allocator: on device='cpu' use --memory_cap_gb=0"),
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
    rules.check_config({**config, 'value_embeds': 1, 'unet_skips': True}, 1, 'cpu')  # the most 2 layers take
    rules.check_config({**config, 'max_iters': 0, 'seed': 0}, 1, 'cpu')  # one iteration, as nanoGPT; seed 0
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
    args, crop = rules.model_args({**config, 'init_from': 'resume', 'dropout': 0.1, 'n_layer': 12}, 40, resumed)
    assert (args['n_layer'], args['block_size'], args['vocab_size'], args['dropout']) == (3, 32, 64, 0.1)
    args, crop = rules.model_args({**config, 'init_from': 'gpt2-medium', 'block_size': 256}, None)
    assert (args['n_layer'], args['n_embd'], args['vocab_size'], args['block_size'], crop) == (24, 1024, 50257, 256,
                                                                                                256)


@pytest.mark.parametrize('key, value, saved', [('n_layer', 4, 3), ('bias', True, False), ('n_embd', 64, 32),
                                               ('pos_emb', 'rope', "'learned'"), ('qk_norm', True, False)])
def test_a_resume_refuses_a_shape_set_to_other_than_the_checkpoints(config, key, value, saved):
    """Set off its default (in a config file or on the command line): a resume takes the checkpoint's shape, so the
    setting would go unread. At its default (train.py's n_layer=12) or at the checkpoint's, it is accepted; a
    nanoGPT checkpoint's model_args have no modern keys: GPT-2's architecture."""
    resumed = dict(n_layer=3, n_head=2, n_embd=32, block_size=32, bias=False, vocab_size=64, dropout=0.0)
    config = {**config, 'init_from': 'resume', 'out_dir': 'out', 'n_layer': 3}
    with pytest.raises(ConfigError, match=f"{key}={value!r}, but out/ckpt.pt holds a model with {key}={saved}, the "
                                          f"shape a resume takes: drop --{key}"):
        rules.model_args({**config, key: value}, 40, resumed)
    rules.model_args({**config, key: resumed.get(key, rules.MODERN_DEFAULTS.get(key))}, 40, resumed)


def test_model_args_refuse_what_does_not_fit(config):
    resumed = dict(n_layer=3, n_head=2, n_embd=32, block_size=8, bias=True, vocab_size=64, dropout=0.0)
    config_resumed = {**config, 'init_from': 'resume', 'n_layer': 3}
    with pytest.raises(ConfigError, match="block_size=16 is larger than the resumed model's 8"):
        rules.model_args(config_resumed, None, resumed)
    with pytest.raises(ConfigError, match="meta.pkl has vocab_size 100 but the model's is 64"):
        rules.model_args({**config_resumed, 'block_size': 8}, 100, resumed)
    with pytest.raises(ConfigError, match="hellaswag=True scores GPT-2 tokens, but the model's vocab_size is 40"):
        rules.model_args({**config, 'hellaswag': True}, 40)
    assert rules.model_args({**config, 'hellaswag': True}, None)[0]['vocab_size'] == rules.DEFAULT_VOCAB_SIZE
    # GPT-2's <|endoftext|> on the 40-token dataset: no position would ever start a document
    with pytest.raises(ConfigError, match=r"doc_token=50256 is not a token of the model's vocabulary \(0 to 39\)"):
        rules.model_args({**config, 'doc_token': 50256}, 40)
    assert rules.model_args({**config, 'doc_token': 50256}, None)[0]['doc_token'] == 50256


def test_model_args_of_a_gpt2_architecture_are_nanogpts_and_modern_keys_are_recorded(config):
    nanogpt_keys = {'n_layer', 'n_head', 'n_embd', 'block_size', 'bias', 'vocab_size', 'dropout'}
    assert set(rules.model_args(config, None)[0]) == nanogpt_keys  # nanoGPT's GPTConfig(**model_args) takes them
    modern = {'pos_emb': 'rope', 'mlp': 'relu2', 'logit_softcap': 15.0, 'value_embeds': 1, 'unet_skips': True,
              'x0_shortcut': True}
    args = rules.model_args({**config, **modern}, None)[0]
    assert set(args) == nanogpt_keys | set(modern) and all(args[k] == v for k, v in modern.items())
    resumed = dict(n_layer=3, n_head=2, n_embd=32, block_size=32, bias=True, vocab_size=64, dropout=0.0)
    # a checkpoint without the keys (nanoGPT's) is GPT-2's architecture (a config of other keys is refused:
    # test_a_resume_refuses_a_shape_set_to_other_than_the_checkpoints); one with them keeps them
    config = {**config, 'init_from': 'resume', 'n_layer': 3}
    assert set(rules.model_args(config, None, resumed)[0]) == nanogpt_keys
    args = rules.model_args(config, None, {**resumed, 'norm': 'rmsnorm'})[0]
    assert args['norm'] == 'rmsnorm'


@pytest.mark.parametrize('overrides, message', [
    ({'pos_emb': 'alibi'}, "unknown pos_emb 'alibi': use one of 'learned', 'rope'"),
    ({'norm': 'batchnorm'}, "unknown norm 'batchnorm'"),
    ({'mlp': 'swiglu'}, "unknown mlp 'swiglu'"),
    ({'weight_init': 'xavier'}, "unknown weight_init 'xavier': use one of 'gpt2', 'pytorch'"),
    ({'batch_order': 'shuffled'}, "unknown batch_order 'shuffled': use one of 'random', 'sequential'"),
    ({'muon_momentum_form': 'nesterov'}, "unknown muon_momentum_form 'nesterov': use one of 'ema', 'sum', 'ema_eps'"),
    ({'scalar_learning_rate': 0.04}, "scalar_learning_rate=0.04 acts only with optim='muon'"),
    ({'init_from': 'gpt2', 'embed_norm': True}, "which embed_norm=True changes: drop --embed_norm"),
    ({'logit_softcap': -1.0}, 'logit_softcap must be 0 (off) or positive'),
    ({'init_from': 'gpt2', 'pos_emb': 'rope'}, "init_from='gpt2' loads GPT-2 weights, trained with GPT-2's "
                                               "architecture, which pos_emb='rope' changes: drop --pos_emb"),
    ({'pos_emb': 'rope', 'n_embd': 30, 'n_head': 2}, 'n_embd / n_head = 15 is odd'),
    ({'value_embeds': -1}, 'value_embeds is a number of tables, 0 (off) or more, got -1'),
    ({'value_embeds': 2}, 'more than n_layer=2 blocks: use --value_embeds=1 or less'),
    ({'unet_skips': True, 'n_layer': 1}, 'n_layer=1 has no pair: use --n_layer=2 or more, or --unet_skips=False'),
    ({'init_from': 'gpt2', 'x0_shortcut': True}, "which x0_shortcut=True changes: drop --x0_shortcut"),
    ({'attn_window': -1}, 'attn_window is a number of positions, 0 (the whole block) or more, got -1'),
    ({'attn_window': 8, 'attn_window_warmup_iters': -1}, 'attn_window_warmup_iters must be 0 (off) or more, got -1'),
    ({'attn_window_warmup_iters': 100}, 'attn_window_warmup_iters=100 grows the sliding window to attn_window, but '
                                        'attn_window=0 has none: set --attn_window'),
    ({'attn_window': 8, 'attn_window_warmup_iters': 100}, 'attn_window_warmup_start=64 must be from 1 to '
                                                          'attn_window=8: the window\'s first size and its step, '
                                                          'e.g. --attn_window_warmup_start=1'),
    ({'attn_window': 8, 'attn_window_warmup_iters': 100, 'attn_window_warmup_start': 0}, 'must be from 1 to'),
    ({'attn_window': 8, 'attn_window_warmup_iters': 100, 'attn_window_warmup_start': 2, 'attn_window_warmup_end': 6},
     'attn_window_warmup_end=6 is below attn_window=8: the warmup would never reach the window'),
    ({'attn_window': 8, 'attn_window_block': 3}, 'attn_window_block=3 must be 0 (a window by position) or a positive '
                                                 'divisor of attn_window=8'),
    ({'attn_window': 8, 'attn_window_block': -4}, 'attn_window_block=-4 must be 0'),
    ({'attn_window_block': 8}, 'attn_window_block=8 counts the sliding window in blocks, but attn_window=0 has none'),
    ({'attn_window': 16, 'attn_window_warmup_end': 32}, "attn_window_warmup_end=32 acts only with a window warmup"),
    ({'attn_window': 8, 'attn_window_block': 4, 'attn_window_warmup_iters': 100, 'attn_window_warmup_start': 2},
     'attn_window_warmup_start=2 is not a whole number of attn_window_block=4 positions'),
    ({'rope_truncated': True}, "rope_truncated=True changes rotary embeddings, but pos_emb='learned' has none"),
    ({'no_attn_layer': 2}, 'no_attn_layer=2 is not a block of n_layer=2: use 0 to 1, or -1'),
    ({'no_attn_layer': 1, 'value_embeds': 1}, 'no_attn_layer=1 takes the attention of a block whose values '
                                              'value_embeds=1 mixes a table into: every block of n_layer=2 has a '
                                              'table: use a smaller --value_embeds or a larger --n_layer'),
    ({'no_attn_layer': 0, 'value_embeds': 1, 'n_layer': 4}, 'mixes a table into: pick a block from 1 to 2'),
    ({'embedding_learning_rate': 0.3}, "embedding_learning_rate=0.3 acts only with optim='muon'"),
    ({'optim': 'muon', 'muon_momentum_warmup_iters': -1}, 'muon_momentum_warmup_iters must be 0 or more'),
    ({'lr_schedule': 'linear'}, "unknown lr_schedule 'linear': use one of 'cosine', 'wsd'"),
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
    (tmp_path / 'tiny' / 'val.bin').write_bytes(bytes(201))
    with pytest.raises(ConfigError, match=r'val.bin has 201 bytes, an odd number, so it is not uint16 tokens'):
        rules.check_dataset({**config, 'block_size': 8})
    (tmp_path / 'tiny' / 'val.bin').write_bytes(bytes(200))
    rules.check_dataset({**config, 'block_size': 8})


def test_prepare_hint_names_the_script_relative_to_the_current_directory(config, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    hint = rules.prepare_hint({**config, 'dataset': 'shakespeare_char', 'data_dir': 'data'})
    assert hint == f"run `python {os.path.relpath(ROOT / 'prepare' / 'shakespeare_char.py')}`"
    assert rules.prepare_hint({**config, 'dataset': 'shakespeare_char', 'data_dir': 'elsewhere'}).endswith(
        f" --out_dir {os.path.join('elsewhere', 'shakespeare_char')}`")
    assert 'data/README.md' in rules.prepare_hint({**config, 'dataset': 'mine'})


# -----------------------------------------------------------------------------
# model_file='gpt2026.py': the record's model and training

@pytest.fixture
def record(config):
    """The config at the record's shape (11 layers, heads in pairs), documents starting at token 0."""
    return {**config, 'model_file': 'gpt2026.py', 'n_layer': 11, 'doc_token': 0, 'max_iters': 1600}


@pytest.mark.parametrize('overrides, message', [
    ({'learning_rate': 1e-3}, "learning_rate=0.001 is a key of model.py's model or training, which "
                              "model_file='gpt2026.py' does not read (its training is the record's: "
                              "training/record2026.py): drop --learning_rate"),
    ({'optim': 'muon'}, "optim='muon' is a key of model.py's model or training"),
    ({'pos_emb': 'rope'}, "pos_emb='rope' is a key of model.py's model"),
    ({'activation_checkpointing': True}, 'activation_checkpointing=True is a key of'),
    ({'n_layer': 12}, "n_layer=12: model_file='gpt2026.py' has the record's 11 layers: use --n_layer=11"),
    ({'n_head': 3, 'n_embd': 24}, 'n_head=3, n_embd=24: model_file=\'gpt2026.py\' pairs its heads'),
    ({'n_head': 4, 'n_embd': 24}, 'each a multiple of 4 wide'),
    ({'n_head': 2, 'n_embd': 8}, "n_embd=8: the gates of model_file='gpt2026.py' read 12 channels"),
    ({'doc_token': -1}, "doc_token=-1: model_file='gpt2026.py' reads rows that start at documents"),
    ({'dtype': 'float16'}, "dtype='float16': its GradScaler would unscale twice"),
    ({'max_iters': 1601}, "max_iters=1601 runs past the 1600 steps of the record's schedules"),
    ({'init_from': 'gpt2'}, "init_from='gpt2' loads GPT-2 weights"),
    ({'model_file': 'gpt2027.py'}, "unknown model_file 'gpt2027.py': use one of 'model.py', 'gpt2026.py'"),
    ({'attn_window_warmup_start': 128}, "attn_window_warmup_start=128 is a key of model.py's model or training"),
])
def test_a_record_run_refuses_what_its_model_and_training_cannot_take(record, overrides, message):
    with pytest.raises(ConfigError) as e:
        rules.check_config({**record, **overrides}, 1, 'cpu')
    assert message in str(e.value) and '\n' not in str(e.value)


def test_a_record_run_under_torchrun_takes_ddp_or_zero1_without_clipping(record):
    """Its optimizer, whole on each process or each its share, sums the gradients in its step: parallelism 'ddp' or
    'zero1', not fsdp's sharded weights, and no grad_clip, which would clip each process's share before the sum (one
    process clips the whole)."""
    torchrun = {**record, 'gradient_accumulation_steps': 2, 'grad_clip': 0.0}
    for parallelism in ('ddp', 'zero1'):
        rules.check_config({**torchrun, 'parallelism': parallelism}, 2, 'cpu')
    rules.check_config({**record, 'grad_clip': 1.0}, 1, 'cpu')
    with pytest.raises(ConfigError, match=r"^grad_clip=1.0 under torchrun would clip each process's share of the "
                                          r"gradients, which the optimizer of model_file='gpt2026.py' sums only"):
        rules.check_config({**torchrun, 'grad_clip': 1.0}, 2, 'cpu')
    with pytest.raises(ConfigError, match="^parallelism='fsdp' shards model.py's weights; model_file='gpt2026.py' "
                                          "keeps the whole model on each process: use --parallelism=zero1"):
        rules.check_config({**torchrun, 'parallelism': 'fsdp'}, 2, 'cpu')


def test_the_model_file_is_in_a_record_models_args_and_resume_takes_the_checkpoints(record):
    """GPT2026Config's arguments, the bigram table 5 rows a token, and the model file; model.py's keep nanoGPT's
    model_args (no model_file); a checkpoint of the other model file is refused on resume."""
    rules.check_config(record, 1, 'cpu')
    args, crop = rules.model_args(record, 40)
    assert args == dict(model_file='gpt2026.py', vocab_size=40, bigram_vocab_size=200, n_head=2, n_embd=32,
                        doc_token=0) and crop is None
    resumed = {**record, 'init_from': 'resume', 'n_embd': 64}
    assert rules.model_args(resumed, 40, args)[0] == args  # the checkpoint's shape
    gpt_args, _ = rules.model_args({**record, 'model_file': 'model.py'}, 40)
    assert 'model_file' not in gpt_args
    with pytest.raises(ConfigError, match=r"ckpt.pt holds a model of model.py, not of model_file='gpt2026.py': "
                                          r"resume with --model_file=model.py"):
        rules.model_args(resumed, 40, gpt_args)
    with pytest.raises(ConfigError, match=r"holds a model of gpt2026.py, not of model_file='model.py'"):
        rules.model_args({**resumed, 'model_file': 'model.py'}, 40, args)


def test_auto_batch_size_has_no_training_step_to_size_under_eval_only(config):
    cuda = {**config, 'device': 'cuda', 'dtype': 'bfloat16', 'backend': 'nccl', 'auto_batch_size': True}
    rules.check_config(cuda, 1, 'cuda')
    with pytest.raises(ConfigError, match='auto_batch_size=True sizes the training step, which eval_only=True never '
                                          'runs: set --eval_batch_size'):
        rules.check_config({**cuda, 'eval_only': True}, 1, 'cuda')


def test_a_lever_turned_off_names_all_its_keys_and_their_defaults_in_one_line():
    """The speedrun preset with --optim=adamw: every key only Muon reads, in one line with the fix; the next run with
    those defaults passes that check (the preset's other levers stay as they are)."""
    preset = configurator.load_config(configurator.train_keys(), ['config/speedrun_gpt2_12gb.py', '--optim=adamw',
                                                                   '--device=cpu', '--dtype=float32'])
    with pytest.raises(ConfigError) as e:
        rules.check_turned_on(preset)
    assert str(e.value) == (
        "muon_learning_rate=0.05, muon_momentum_form='ema_eps', muon_momentum_warmup_iters=300, "
        "embedding_learning_rate=0.6, head_learning_rate=0.008, scalar_learning_rate=0.04, muon_split_qkv=True act "
        "only with optim='muon', which this config does not have: add --optim=muon, or --muon_learning_rate=0.02 "
        "--muon_momentum_form=ema --muon_momentum_warmup_iters=0 --embedding_learning_rate=0.0 "
        "--head_learning_rate=0.0 --scalar_learning_rate=0.0 --muon_split_qkv=False (defaults)")
    rules.check_turned_on({**preset, **rules.inert_defaults(preset)})
