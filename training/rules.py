"""What train.py accepts and which model a config builds: the rules that train.py and estimate_memory.py share, so the
estimate is always of the run train.py would make. Each check raises a ConfigError whose one line names the key and
the fix, before anything is created or written."""
import dataclasses
import os

import torch.distributed as dist

import gpt2026
from training.configurator import train_defaults
from model import GPT2_VOCAB_SIZE, GPTConfig
from training import hf, optim, parallel, runs, step
from training.device import DTYPES
from training.checkpoint import LOAD_CHOICES, checkpoint_path
from training.errors import ConfigError
from training.meta import META_NAME, load_meta, vocab_size_of
from training.paths import ROOT
from training.record2026 import NUM_ITERATIONS

DEFAULT_VOCAB_SIZE = GPTConfig.vocab_size  # GPT-2's padded up to a multiple of 64, as nanoGPT does
ARCHITECTURE_KEYS = ('n_layer', 'n_head', 'n_embd', 'block_size', 'bias', 'vocab_size')
# GPTConfig's modern options, train.py keys of the same names, and their GPT-2 defaults. model_args holds one only
# where it differs from its default: a GPT-2 model's model_args are nanoGPT's, which nanoGPT's GPTConfig(**) takes
MODERN_DEFAULTS = {field.name: field.default for field in dataclasses.fields(GPTConfig)
                   if field.name not in (*ARCHITECTURE_KEYS, 'dropout')}
MODERN_CHOICES = {'pos_emb': ('learned', 'rope'), 'norm': ('layernorm', 'rmsnorm'), 'mlp': ('gelu', 'relu2'),
                  'weight_init': ('gpt2', 'pytorch')}
AT_LEAST_ONE = ('batch_size', 'block_size', 'gradient_accumulation_steps', 'eval_iters', 'eval_interval',
                'log_interval', 'n_layer', 'n_head', 'n_embd')
AT_LEAST_ZERO = ('max_iters', 'lr_decay_iters', 'seed')  # 0 means something (one iteration; no decay; a seed)
# the values train.py takes for these keys, for the checks and --help: each tuple written once, where its key acts,
# or here for the model's options and the schedule
CHOICES = {'init_from': ('scratch', *LOAD_CHOICES),
           'optim': optim.OPTIMS, 'weight_dtype': optim.WEIGHT_DTYPES, 'dtype': DTYPES,
           'parallelism': parallel.PARALLELISMS, 'lr_schedule': ('cosine', 'wsd'),
           'batch_order': ('random', 'sequential'), 'muon_momentum_form': optim.MUON_MOMENTUM_FORMS,
           'attention_kernel': tuple(step.ATTENTION_KERNELS), 'model_file': runs.MODEL_FILES, **MODERN_CHOICES}
# gpt2026.py's model and training are the record's: train.py's keys for model.py's architecture, optimizers and
# schedules do nothing there, so a value other than train.py's default is refused rather than ignored
MODEL_PY_KEYS = ('bias', 'dropout', *(key for key in MODERN_DEFAULTS if key != 'doc_token'), 'attn_window_warmup_iters',
                 'activation_checkpointing', 'optim', 'optimizer_in_backward', 'weight_dtype', 'learning_rate',
                 'min_lr', 'decay_lr', 'lr_schedule', 'cooldown_frac', 'warmup_iters', 'lr_decay_iters', 'weight_decay',
                 'beta1', 'beta2', 'muon_learning_rate', 'muon_momentum', 'muon_momentum_form', *optim.MUON_ONLY_KEYS,
                 'attn_window_warmup_start')


def turned_on_by(what, fix, turned_on):
    """A key's off(config): (what turns the key on, the fix) where turned_on(config) is false, else None."""
    return lambda config: None if turned_on(config) else (what, fix)


# keys that act only where other keys turn them on, {key: off}: one set to other than train.py's default while off is
# refused rather than ignored (check_turned_on). A key of two levers names the first that is off, so that the keys of
# one lever come together.
MUON = turned_on_by("optim='muon'", '--optim=muon', lambda config: config['optim'] == 'muon')
DECAY = turned_on_by('decay_lr=True', '--decay_lr=True', lambda config: config['decay_lr'])
WSD = turned_on_by("lr_schedule='wsd'", '--lr_schedule=wsd', lambda config: config['lr_schedule'] == 'wsd')
UNTIED = turned_on_by('tie_weights=False (a head of its own)', '--tie_weights=False',
                      lambda config: not config['tie_weights'])
WINDOW_WARMUP = turned_on_by('a window warmup', '--attn_window_warmup_iters=N (e.g. max_iters)',
                             lambda config: config['attn_window_warmup_iters'] > 0)
TURNED_ON_BY = {**dict.fromkeys(('muon_learning_rate', 'muon_momentum', 'muon_momentum_form', *optim.MUON_ONLY_KEYS),
                                MUON),
                'head_learning_rate': lambda config: MUON(config) or UNTIED(config),
                'lr_schedule': DECAY,
                'cooldown_frac': lambda config: DECAY(config) or WSD(config),
                **dict.fromkeys(('attn_window_warmup_start', 'attn_window_warmup_end'), WINDOW_WARMUP),
                'hellaswag_examples': turned_on_by('hellaswag=True', '--hellaswag=True',
                                                   lambda config: config['hellaswag'])}


def check_config(config, world_size, device_type):
    """ConfigError for a config that train.py cannot run with `world_size` processes on a `device_type` device."""
    for key in AT_LEAST_ONE:
        if config[key] < 1:
            raise ConfigError(f'{key} must be at least 1, got {config[key]}')
    for key in AT_LEAST_ZERO:
        if config[key] < 0:
            raise ConfigError(f'{key} must be 0 or more, got {config[key]}')
    if config['eval_batch_size'] < 0:
        raise ConfigError(f"eval_batch_size must be at least 1, or 0 for batch_size; got {config['eval_batch_size']}")
    if config['gpu_headroom_gb'] < 0:
        raise ConfigError(f"gpu_headroom_gb={config['gpu_headroom_gb']} must be 0 or more: the GiB of the card to "
                          f"leave free for other programs, e.g. --gpu_headroom_gb=0.5")
    if config['memory_cap_gb'] < 0:
        raise ConfigError(f"memory_cap_gb={config['memory_cap_gb']} must be 0 (no cap) or positive: the GiB of the "
                          f"card to hold the run to, e.g. --memory_cap_gb=11")
    if config['memory_cap_gb'] and device_type != 'cuda':
        raise ConfigError(f"memory_cap_gb caps CUDA's caching allocator: on device={config['device']!r} use "
                          f"--memory_cap_gb=0")
    if config['loss_chunk_mib'] <= 0:
        raise ConfigError(f"loss_chunk_mib={config['loss_chunk_mib']} must be positive: the MiB one chunk of the loss "
                          f"may take, e.g. --loss_chunk_mib=128 on a tight card")
    if config['hellaswag_examples'] < 0:
        raise ConfigError(f"hellaswag_examples must be at least 1, or 0 for all; got {config['hellaswag_examples']}")
    if not 0.0 <= config['dropout'] < 1.0:
        raise ConfigError(f"dropout is a probability in [0, 1), got {config['dropout']}: e.g. --dropout=0.1")
    check_choices(config, ('batch_order', 'muon_momentum_form', 'attention_kernel', 'model_file'))
    if config['model_file'] == runs.RECORD_2026_FILE:
        check_record_2026(config, world_size)
    check_turned_on(config)
    check_attention_kernel(config, device_type)
    optim.check_config(config, world_size)  # before the split over processes: optimizer_in_backward's explains it
    check_schedule(config)
    check_window_warmup(config)
    if config['gradient_accumulation_steps'] % world_size != 0:
        raise ConfigError(f"gradient_accumulation_steps={config['gradient_accumulation_steps']} is not divisible by "
                          f"the {world_size} processes (each runs an equal share): use a multiple of {world_size}")
    if config['parallelism'] not in parallel.PARALLELISMS:
        raise ConfigError(f"unknown parallelism {config['parallelism']!r}: use one of "
                          f"{', '.join(parallel.PARALLELISMS)} (docs/parallel.md)")
    parallel.fsdp_param_dtype(config)  # raises for a fsdp_mixed_precision that cannot apply
    if config['timeout'] <= 0:
        raise ConfigError(f"timeout={config['timeout']} must be positive: the seconds a process waits for the others "
                          f"in a collective, e.g. --timeout=600")
    backends = [name for name in dist.Backend.backend_list if name not in ('undefined', 'fake')]  # with plugins'
    if config['backend'] not in backends:
        raise ConfigError(f"unknown backend {config['backend']!r}: use one of {', '.join(backends)} (nccl on CUDA, "
                          f"gloo on a CPU)")
    if config['backend'] == 'nccl' and device_type != 'cuda':
        raise ConfigError(f"backend='nccl' needs CUDA: use --backend=gloo with device={config['device']!r}")
    init_from = config['init_from']
    if hf.is_folder(init_from):
        hf.pretrained_config(init_from)  # an unknown name, or a folder that is not a GPT-2, is one line
    if config['auto_batch_size'] and device_type != 'cuda':
        raise ConfigError(f"auto_batch_size=True sizes the batch for a CUDA card's memory: on {config['device']} set "
                          f"--batch_size yourself")
    if config['auto_batch_size'] and config['eval_only']:
        raise ConfigError('auto_batch_size=True sizes the training step, which eval_only=True never runs: set '
                          '--eval_batch_size for the evaluation instead')
    if init_from == 'scratch' and config['n_embd'] % config['n_head'] != 0:
        raise ConfigError(f"n_embd={config['n_embd']} must be divisible by n_head={config['n_head']}")
    check_architecture(config)


def check_turned_on(config):
    """ConfigError naming at once every key that config sets without what turns it on (the first such lever's): a
    preset's lever turned off from the command line leaves its keys set, which the fix sets back to their defaults."""
    defaults = train_defaults()
    inert = inert_keys(config, defaults)
    if not inert:
        return
    what, fix = TURNED_ON_BY[inert[0]](config)
    keys = [key for key in inert if TURNED_ON_BY[key](config)[0] == what]
    one = len(keys) == 1
    raise ConfigError(f"{', '.join(f'{key}={config[key]!r}' for key in keys)} {'acts' if one else 'act'} only with "
                      f"{what}, which this config does not have: add {fix}, or "
                      f"{' '.join(f'--{key}={defaults[key]}' for key in keys)} "
                      f"({'its default' if one else 'defaults'})")


def inert_keys(config, defaults=None):
    """The keys of TURNED_ON_BY that config sets to other than train.py's default (`defaults`, read from train.py
    where not given), without what turns them on."""
    defaults = train_defaults() if defaults is None else defaults
    return [key for key, off in TURNED_ON_BY.items() if config[key] != defaults[key] and off(config)]


def inert_defaults(config):
    """train.py's defaults of the keys that config (train.py's keys, or some of them) leaves inert: what a tool that
    turns a preset's lever off (hellaswag, optim='muon', a window warmup) sets with it."""
    defaults = train_defaults()
    return {key: defaults[key] for key in inert_keys({**defaults, **config}, defaults)}


def check_record_2026(config, world_size):
    """ConfigError for a model_file='gpt2026.py' run that the record's model and training cannot take: under
    torchrun parallelism 'ddp' or 'zero1' (its optimizer whole on each process, or each its share; no fsdp) and no
    grad_clip (it would clip each process's share of the gradients, which the optimizer sums in its step), the
    record's 11 layers, heads that pair, documents to read, bf16 or fp32 (fp16's GradScaler would unscale the
    gradients Adam keeps between steps twice), at most the record's 1,600 steps (its schedules end there), and no key
    of model.py's model or training."""
    record = f"model_file='{runs.RECORD_2026_FILE}'"
    defaults = train_defaults()
    changed = [key for key in MODEL_PY_KEYS if config[key] != defaults[key]]
    if changed:
        key = changed[0]
        raise ConfigError(f"{key}={config[key]!r} is a key of model.py's model or training, which {record} does not "
                          f"read (its training is the record's: training/record2026.py): drop --{key}")
    n_layer, head_size = len(gpt2026.RECORD_LAYERS), config['n_embd'] // config['n_head']
    gates = gpt2026.GPT2026Config.gate_inputs
    checks = [
        (world_size == 1 or config['parallelism'] != 'fsdp',
         f"parallelism='fsdp' shards model.py's weights; {record} keeps the whole model on each process: use "
         f"--parallelism=zero1 (each process the optimizer state of its share) or ddp"),
        (world_size == 1 or not config['grad_clip'],
         f"grad_clip={config['grad_clip']} under torchrun would clip each process's share of the gradients, which "
         f"the optimizer of {record} sums only in its step: use --grad_clip=0.0 (the record's) or one process"),
        (config['n_layer'] == n_layer, f"n_layer={config['n_layer']}: {record} has the record's {n_layer} layers: "
                                       f"use --n_layer={n_layer}"),
        (config['n_head'] % 2 == 0 and config['n_embd'] == config['n_head'] * head_size and head_size % 4 == 0,
         f"n_head={config['n_head']}, n_embd={config['n_embd']}: {record} pairs its heads, each a multiple of 4 wide: "
         f"e.g. --n_head=6 --n_embd=768"),
        (config['n_embd'] >= gates, f"n_embd={config['n_embd']}: the gates of {record} read {gates} channels: use "
                                    f"--n_embd={gates} or more"),
        (config['doc_token'] >= 0, f"doc_token={config['doc_token']}: {record} reads rows that start at documents: "
                                   f"set --doc_token (GPT-2's <|endoftext|>: 50256)"),
        (config['dtype'] != 'float16', f"dtype='float16': its GradScaler would unscale twice the gradients that "
                                       f"the Adam of {record} keeps between steps: use --dtype=bfloat16 (or float32)"),
        (config['max_iters'] <= NUM_ITERATIONS, f"max_iters={config['max_iters']} runs past the {NUM_ITERATIONS} "
                                                f"steps of the record's schedules ({record}): use "
                                                f"--max_iters={NUM_ITERATIONS} or less"),
        (config['init_from'] in ('scratch', 'resume'), f"init_from={config['init_from']!r} loads GPT-2 weights, a "
                                                       f"model of model.py, not of {record}: use --init_from=scratch"),
        (config['attention_kernel'] != 'flex', f"attention_kernel='flex' runs windows in blocks, those of {record} "
                                               f"are by position: use --attention_kernel=auto")]
    for fits, message in checks:
        if not fits:
            raise ConfigError(message)


def check_schedule(config):
    """ConfigError for a learning rate schedule (lr_schedule, training.schedule) that would not warm up or decay."""
    if config['lr_schedule'] not in CHOICES['lr_schedule']:
        raise ConfigError(f"unknown lr_schedule {config['lr_schedule']!r}: use one of "
                          f"{', '.join(map(repr, CHOICES['lr_schedule']))}")
    if config['lr_schedule'] == 'wsd' and not 0.0 < config['cooldown_frac'] <= 1.0:
        raise ConfigError(f"cooldown_frac must be in (0, 1], got {config['cooldown_frac']}: the fraction of "
                          f"lr_decay_iters the lr decays over, e.g. --cooldown_frac=0.2")
    if config['warmup_iters'] < 0:
        raise ConfigError(f"warmup_iters must be 0 or more, got {config['warmup_iters']}: e.g. --warmup_iters=2000")
    if not config['decay_lr']:
        return  # a constant learning_rate: nanoGPT's finetuning configs leave min_lr above it
    if config['min_lr'] < 0:
        raise ConfigError(f"min_lr must be 0 or more, got {config['min_lr']}: e.g. --min_lr=6e-5 (learning_rate/10)")
    if config['min_lr'] > config['learning_rate']:
        raise ConfigError(f"min_lr={config['min_lr']} is above learning_rate={config['learning_rate']}: the decay "
                          f"would raise the rate after warmup; use --min_lr={config['learning_rate'] / 10:g} "
                          f"(learning_rate/10) or --decay_lr=False")


def check_window_warmup(config):
    """ConfigError for a sliding window warmup (training.schedule.attn_window_at) that has no window to grow to."""
    iters, start, window = config['attn_window_warmup_iters'], config['attn_window_warmup_start'], config['attn_window']
    if iters < 0:
        raise ConfigError(f"attn_window_warmup_iters must be 0 (off) or more, got {iters}: e.g. "
                          f"--attn_window_warmup_iters={config['max_iters']} (the whole run)")
    if iters and window <= 0:
        raise ConfigError(f"attn_window_warmup_iters={iters} grows the sliding window to attn_window, but "
                          f"attn_window={window} has none: set --attn_window (e.g. 1024), or "
                          f"--attn_window_warmup_iters=0")
    if iters and not 1 <= start <= window:
        raise ConfigError(f"attn_window_warmup_start={start} must be from 1 to attn_window={window}: the window's "
                          f"first size and its step, e.g. --attn_window_warmup_start={max(1, window // 16)}")
    end = config['attn_window_warmup_end']
    if iters and end and end < window:
        raise ConfigError(f"attn_window_warmup_end={end} is below attn_window={window}: the warmup would never reach "
                          f"the window; use 0 (attn_window) or more, e.g. --attn_window_warmup_end={window}")
    block = config['attn_window_block']
    if block and iters and start % block:
        raise ConfigError(f"attn_window_warmup_start={start} is not a whole number of attn_window_block={block} "
                          f"positions, as every window must be: e.g. --attn_window_warmup_start={block}")


def check_attention_kernel(config, device_type):
    """ConfigError for attention_kernel='flex' where FlexAttention cannot run the windows in blocks."""
    if config['attention_kernel'] != 'flex':
        return
    block = config['attn_window_block']
    if not block or block % 128:
        raise ConfigError(f"attention_kernel='flex' runs windows in blocks of a multiple of 128 positions (its tiles), "
                          f"got attn_window_block={block}: e.g. --attn_window_block=128, or --attention_kernel=auto")
    if device_type != 'cuda':
        raise ConfigError(f"attention_kernel='flex' trains in FlexAttention's CUDA kernels: on device="
                          f"{config['device']!r} use --attention_kernel=auto (the masked attention)")


def check_choices(config, keys):
    """ConfigError for a value of `keys` that is not one of its CHOICES."""
    for key in keys:
        if config[key] not in CHOICES[key]:
            raise ConfigError(f"unknown {key} {config[key]!r}: use one of {', '.join(map(repr, CHOICES[key]))}")


def check_architecture(config):
    """ConfigError for a modern architecture key (MODERN_DEFAULTS) out of its range, or given to a model whose
    architecture it cannot change."""
    check_choices(config, MODERN_CHOICES)
    if config['logit_softcap'] < 0:
        raise ConfigError(f"logit_softcap must be 0 (off) or positive, got {config['logit_softcap']}: e.g. "
                          f"--logit_softcap=15")
    changed = [key for key, default in MODERN_DEFAULTS.items() if config[key] != default]
    if changed and config['init_from'] not in ('scratch', 'resume'):
        raise ConfigError(f"init_from={config['init_from']!r} loads GPT-2 weights, trained with GPT-2's "
                          f"architecture, which {changed[0]}={config[changed[0]]!r} changes: drop --{changed[0]}, "
                          f"or train from scratch")
    if config['value_embeds'] < 0:
        raise ConfigError(f"value_embeds is a number of tables, 0 (off) or more, got {config['value_embeds']}: e.g. "
                          f"--value_embeds=3")
    if config['attn_window'] < 0:
        raise ConfigError(f"attn_window is a number of positions, 0 (the whole block) or more, got "
                          f"{config['attn_window']}: e.g. --attn_window=1024")
    block = config['attn_window_block']
    if block > 0 and config['attn_window'] == 0:
        raise ConfigError(f"attn_window_block={block} counts the sliding window in blocks, but attn_window=0 has none: "
                          f"set --attn_window (a multiple of {block}), or --attn_window_block=0")
    if block < 0 or (block and config['attn_window'] % block):
        raise ConfigError(f"attn_window_block={block} must be 0 (a window by position) or a positive divisor of "
                          f"attn_window={config['attn_window']}: e.g. --attn_window_block=128 with --attn_window=1792")
    if config['rope_truncated'] and config['pos_emb'] != 'rope':
        raise ConfigError(f"rope_truncated=True changes rotary embeddings, but pos_emb={config['pos_emb']!r} has "
                          f"none: add --pos_emb=rope, or --rope_truncated=False")
    if config['init_from'] != 'scratch':
        return  # the rest are of the shape a new model is built with; a resumed one keeps its checkpoint's
    head_size = config['n_embd'] // config['n_head']
    if config['pos_emb'] == 'rope' and head_size % 2:
        raise ConfigError(f"pos_emb='rope' rotates pairs of each head's dimensions, but n_embd / n_head = "
                          f"{head_size} is odd: pick n_embd and n_head whose quotient is even")
    if 2 * config['value_embeds'] > config['n_layer']:
        raise ConfigError(f"value_embeds={config['value_embeds']} gives each table to a block of the first "
                          f"{config['value_embeds']} and one of the last {config['value_embeds']}, more than "
                          f"n_layer={config['n_layer']} blocks: use --value_embeds={config['n_layer'] // 2} or less")
    layer, tables = config['no_attn_layer'], config['value_embeds']
    if not -1 <= layer < config['n_layer']:
        raise ConfigError(f"no_attn_layer={layer} is not a block of n_layer={config['n_layer']}: use 0 to "
                          f"{config['n_layer'] - 1}, or -1 for attention in every block")
    if layer >= 0 and tables and not tables <= layer < config['n_layer'] - tables:
        free = (f"pick a block from {tables} to {config['n_layer'] - tables - 1}" if 2 * tables < config['n_layer'] else
                f"every block of n_layer={config['n_layer']} has a table: use a smaller --value_embeds or a larger "
                f"--n_layer, or --no_attn_layer=-1")
        raise ConfigError(f"no_attn_layer={layer} takes the attention of a block whose values value_embeds={tables} "
                          f"mixes a table into: {free}")
    if config['unet_skips'] and config['n_layer'] < 2:
        raise ConfigError("unet_skips=True connects the first half of the blocks to the second, but n_layer=1 has "
                          "no pair: use --n_layer=2 or more, or --unet_skips=False")


def dataset_path(config):
    return os.path.join(config['data_dir'], config['dataset'])


def check_dataset(config):
    """ConfigError unless data_dir/dataset holds train.bin and val.bin with more than block_size tokens each."""
    data_path, block_size = dataset_path(config), config['block_size']
    for split in ('train', 'val'):
        split_path = os.path.join(data_path, f'{split}.bin')
        if not os.path.isfile(split_path):
            raise ConfigError(f"dataset {config['dataset']!r} is not prepared: {split_path} not found; "
                              f"{prepare_hint(config)}")
        split_bytes = os.path.getsize(split_path)
        split_tokens = split_bytes // 2  # uint16 tokens
        if split_bytes % 2:
            raise ConfigError(f'{split_path} has {split_bytes:,} bytes, an odd number, so it is not uint16 tokens (a '
                              f'copy cut short?): prepare the dataset again ({prepare_hint(config)})')
        if split_tokens == 0:
            raise ConfigError(f'{split_path} is empty: prepare the dataset again ({prepare_hint(config)})')
        if split_tokens <= block_size:
            more = ('a larger validation split (prepare/openwebtext.py: a larger --test_size)' if split == 'val' else
                    'more text (prepare/openwebtext.py: a larger --max_tokens)')
            raise ConfigError(f'the {split} split, {split_path}, has {split_tokens} tokens but block_size={block_size} '
                              f'needs at least {block_size + 1}: use a smaller --block_size, or prepare {more}')


def prepare_hint(config):
    """The command that prepares config's dataset where train.py reads it (paths relative to the current directory,
    like every path here), or where such files come from."""
    script = os.path.join(ROOT, 'prepare', f"{config['dataset']}.py")
    if not os.path.isfile(script):
        return 'put nanoGPT-format train.bin and val.bin there (see data/README.md)'
    out_dir = '' if config['data_dir'] == 'data' else f' --out_dir {dataset_path(config)}'
    return f'run `python {os.path.relpath(script)}{out_dir}`'


def meta_vocab_size(config):
    """vocab_size from data_dir/dataset/meta.pkl, or None without one (GPT-2's tokens)."""
    meta_path = os.path.join(dataset_path(config), META_NAME)
    if not os.path.exists(meta_path):
        return None
    return vocab_size_of(meta_path, load_meta(meta_path))


def check_resumed_shape(config, resumed):
    """ConfigError where config sets a key of the model's shape (off train.py's default: a config file or --key) to
    other than the resumed model's `resumed` args: resume takes the checkpoint's shape, so it would go unread."""
    defaults = train_defaults()
    for key in ('n_layer', 'n_head', 'n_embd', 'bias', *MODERN_DEFAULTS):
        if config[key] != defaults[key] and config[key] != resumed[key]:
            raise ConfigError(f"{key}={config[key]!r}, but {checkpoint_path(config['out_dir'])} holds a model with "
                              f"{key}={resumed[key]!r}, the shape a resume takes: drop --{key} (or the config file's "
                              f"line), or start a new run in another --out_dir")


def model_args(config, meta_vocab, resumed_model_args=None):
    """(model_args, crop): the arguments of the model train.py builds for config['init_from'] (scratch: the config's
    shape with meta_vocab or the padded GPT-2 vocabulary; resume: the checkpoint's shape; gpt2* or a Hugging Face
    folder: its config's shape and options): GPTConfig's, or for model_file='gpt2026.py' GPT2026Config's and the
    model file (training.runs.record_model_args); and the block_size to crop a pretrained model to, or None.
    ConfigError where the checkpoint's model file is not config's, block_size or the dataset's vocabulary do not fit
    the model, or HellaSwag cannot be scored with it."""
    init_from, block_size = config['init_from'], config['block_size']
    if init_from == 'resume' and runs.model_file(resumed_model_args) != config['model_file']:
        saved = runs.model_file(resumed_model_args)
        raise ConfigError(f"{checkpoint_path(config['out_dir'])} holds a model of {saved}, not of "
                          f"model_file={config['model_file']!r}: resume with --model_file={saved}")
    args = dict(n_layer=config['n_layer'], n_head=config['n_head'], n_embd=config['n_embd'], block_size=block_size,
                bias=config['bias'], vocab_size=None, dropout=config['dropout'])
    crop = None
    if config['model_file'] == runs.RECORD_2026_FILE:  # no block size: its windows bound what a position sees
        vocab_size = meta_vocab if meta_vocab is not None else DEFAULT_VOCAB_SIZE
        args = dict(resumed_model_args) if init_from == 'resume' else runs.record_model_args(config, vocab_size)
    elif init_from == 'scratch':
        args['vocab_size'] = meta_vocab if meta_vocab is not None else DEFAULT_VOCAB_SIZE
        args.update({k: config[k] for k, default in MODERN_DEFAULTS.items() if config[k] != default})
    elif init_from == 'resume':
        args.update({k: resumed_model_args[k] for k in ARCHITECTURE_KEYS})  # the rest (dropout) as configured
        # the modern options it was trained with; a checkpoint without them (nanoGPT's) is GPT-2's architecture
        args.update({k: resumed_model_args[k] for k in MODERN_DEFAULTS if k in resumed_model_args})
        check_resumed_shape(config, {**MODERN_DEFAULTS, **args})
    else:
        pretrained = hf.pretrained_config(init_from)
        args.update({k: getattr(pretrained, k) for k in ARCHITECTURE_KEYS})
        # an export's modern options (GPT-2's architecture has none)
        args.update({k: getattr(pretrained, k) for k, default in MODERN_DEFAULTS.items()
                     if getattr(pretrained, k) != default})
        if block_size < pretrained.block_size:
            args['block_size'] = crop = block_size  # the checkpoint records the cropped size
    if runs.model_file(args) == runs.GPT_FILE and block_size > args['block_size']:
        whose = "the resumed model's" if init_from == 'resume' else f"{init_from}'s"
        raise ConfigError(f"block_size={block_size} is larger than {whose} {args['block_size']}: "
                          f"use --block_size={args['block_size']} or less")
    if config['hellaswag'] and args['vocab_size'] < GPT2_VOCAB_SIZE:
        raise ConfigError(f"hellaswag=True scores GPT-2 tokens, but the model's vocab_size is {args['vocab_size']}: "
                          f"train on a GPT-2 BPE dataset, or --hellaswag=False")
    if not -1 <= args.get('doc_token', -1) < args['vocab_size']:
        raise ConfigError(f"doc_token={args['doc_token']} is not a token of the model's vocabulary (0 to "
                          f"{args['vocab_size'] - 1}): use the token that starts each document (GPT-2's "
                          f"<|endoftext|> is 50256), or -1 for none")
    if meta_vocab is not None and meta_vocab > args['vocab_size']:
        raise ConfigError(f"{os.path.join(dataset_path(config), 'meta.pkl')} has vocab_size {meta_vocab} but the "
                          f"model's is {args['vocab_size']}: its tokens would index past the embedding; use the "
                          f"dataset the model was trained on")
    return args, crop
