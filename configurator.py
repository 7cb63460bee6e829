"""
nanoGPT's configurator, as a function with clear errors. For example:
$ python train.py config/override_file.py --batch_size=32
runs config/override_file.py (plain Python: its assignments override the defaults), then sets batch_size to 32.

Same semantics as nanoGPT: arguments without `--` are config files, executed in order; `--key=value` arguments are
parsed with ast.literal_eval (a value that is not a Python literal stays a string) and must keep the default's type.
Differences, all about errors: each is a ConfigError whose message is one line naming the key, the value and the fix.
An int is accepted for a float key; a key whose default is None accepts anything; a str key takes the text as given
(--wandb_run_name=123 is the string '123'). Config files may define helper variables of their own, as in nanoGPT,
but a name that is a near miss of a key (learning_rat = 1e-3) is reported as the typo it probably is.
"""
import ast
import difflib
import io
import os
import sys
import tokenize

from training.errors import ConfigError

TRAIN_PY = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'train.py')
DEFAULTS_BEGIN = '# --- config defaults ---'
DEFAULTS_END = '# --- end config defaults ---'
CONFIG_TYPES = (int, float, bool, str, type(None))
# nanoGPT's train.py leaves these keys without a comment, or with one that describes no key (wandb_run_name's);
# train.py keeps those lines as nanoGPT wrote them, so that its diff stays readable, and --help takes these
NANOGPT_KEY_DESCRIPTIONS = {
    'out_dir': "ckpt.pt is written here, and read from here with init_from='resume'",
    'eval_interval': 'evaluate the train and val loss (and save a checkpoint) every this many iterations',
    'log_interval': 'print the loss every this many iterations',
    'eval_iters': "micro-batches averaged for each split's loss at an evaluation",
    'wandb_log': 'log losses, learning rates, speed and memory to Weights & Biases (docs/wandb.md; pip install wandb)',
    'wandb_project': 'the wandb project the run is logged to',
    'wandb_run_name': "the run's name in wandb",
    'dataset': 'the directory under data_dir, prepared by prepare/<dataset>.py',
    'block_size': 'context length in tokens: each sample is this many tokens',
    'n_layer': 'transformer blocks',
    'n_head': 'attention heads per block; n_embd must be divisible by it',
    'n_embd': 'width of the residual stream',
    'weight_decay': 'on the 2-D parameters (matrices, embeddings); biases and LayerNorms get none',
    'beta1': "AdamW's first-moment decay",
    'beta2': "AdamW's second-moment decay",
}


def train_defaults():
    """train.py's config keys and defaults, for the tools that take its configs (estimate_memory.py): the block of
    train.py between DEFAULTS_BEGIN and DEFAULTS_END, run on its own. train.py keeps its defaults in place, as in
    nanoGPT, where a researcher edits them; the block holds assignments and the one import they need."""
    with open(TRAIN_PY, encoding='utf-8') as f:
        source = f.read()
    block = source[source.index(DEFAULTS_BEGIN):source.index(DEFAULTS_END)]
    namespace = {}
    exec(block, namespace)
    return {k: v for k, v in namespace.items() if not k.startswith('_') and isinstance(v, CONFIG_TYPES)}


def key_comments(source):
    """{key: comment} of the lines of Python `source` that assign a key and end in a comment: `key = value  # text`
    (train.py's defaults block) or `key=value,  # text` (a `defaults = dict(...)`). The first assignment of a key is
    the one read: the defaults come before anything else that assigns the name."""
    comments, lines = {}, {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        lines.setdefault(token.start[0], []).append(token)
    for tokens in lines.values():
        tokens = [t for t in tokens if t.type not in (tokenize.INDENT, tokenize.DEDENT, tokenize.NL, tokenize.NEWLINE)]
        if len(tokens) < 3 or tokens[0].type != tokenize.NAME or tokens[1].string != '=':
            continue
        name = tokens[0].string
        if name not in comments:
            comments[name] = tokens[-1].string.lstrip('#').strip() if tokens[-1].type == tokenize.COMMENT else ''
    return {name: comment for name, comment in comments.items() if comment}


def script_comments(path):
    """key_comments of the Python file at `path`; for train.py, with NANOGPT_KEY_DESCRIPTIONS."""
    with open(path, encoding='utf-8') as f:
        comments = key_comments(f.read())
    if os.path.abspath(path) == TRAIN_PY:
        comments.update(NANOGPT_KEY_DESCRIPTIONS)
    return comments


def closest_keys(key, keys):
    matches = difflib.get_close_matches(key, keys, n=3, cutoff=0.6)
    return f"did you mean {' or '.join('--' + m for m in matches)}?" if matches else 'see --help for the keys'


def checked_value(key, value, default, source):
    """`value` if its type suits `default`'s, else a ConfigError. `source` says where the value came from."""
    if default is None or type(value) is type(default):
        return value
    if isinstance(default, float) and type(value) is int:
        return float(value)
    raise ConfigError(f'{source}: {key} must be {type(default).__name__}, got {type(value).__name__} {value!r}')


def parse_override(arg, config):
    """('key', value) of one `--key=value` argument, checked against `config`."""
    if '=' not in arg:
        raise ConfigError(f'{arg}: expected --key=value (or a config file path without --)')
    key, text = arg[2:].split('=', 1)
    if key not in config:
        raise ConfigError(f'unknown config key --{key}: {closest_keys(key, config)}')
    try:
        value = ast.literal_eval(text)
    except (SyntaxError, ValueError):
        value = text  # not a Python literal: nanoGPT keeps it as a string
    if isinstance(config[key], str) and not isinstance(value, str):
        value = text  # a str key takes the text as typed: --wandb_run_name=123 is '123'
    return key, checked_value(key, value, config[key], f'--{key}={text}')


def run_config_file(path, config):
    """Execute config file `path` on top of `config` (as nanoGPT: its names see the current values); return the keys
    it set, type-checked. Its own helper variables are ignored, except near misses of a key (typos)."""
    if not os.path.isfile(path):
        raise ConfigError(f'config file {path} not found')
    with open(path, encoding='utf-8') as f:
        source = f.read()
    print(source)
    namespace = dict(config, __file__=path)
    try:
        exec(compile(source, path, 'exec'), namespace)
    except Exception as e:
        line = f' line {e.lineno}' if isinstance(e, SyntaxError) else ''
        raise ConfigError(f'config file {path}{line}: {type(e).__name__}: {e}') from None
    updates = {}
    for name, value in namespace.items():
        if name in config:
            updates[name] = checked_value(name, value, config[name], f'config file {path}')
        elif (not name.startswith('_') and isinstance(value, CONFIG_TYPES)
              and difflib.get_close_matches(name, config, n=1, cutoff=0.85)):
            raise ConfigError(f'config file {path}: unknown config key {name}: {closest_keys(name, config)}')
    return updates


def help_text(defaults, descriptions=None, choices=None):
    """--help: each key with its default, its description (descriptions: {key: text}, from key_comments) and its
    allowed values (choices: {key: values}; True or False for a bool)."""
    descriptions, choices = descriptions or {}, choices or {}
    script = os.path.basename(sys.argv[0]) if sys.argv[0].endswith('.py') else 'SCRIPT.py'
    lines = [f'usage: python {script} [config_file.py ...] [--key=value ...]',
             'config files (Python) run in order, then --key=value overrides; the keys, their defaults and values:']
    for key, value in defaults.items():
        allowed = ('one of: ' + ', '.join(map(str, choices[key])) if key in choices else
                   'True or False' if isinstance(value, bool) else '')
        text = '; '.join(filter(None, (descriptions.get(key, ''), allowed)))
        lines.append(f'  --{key}={value!r}' + (f'  {text}' if text else ''))
    return '\n'.join(lines)


def load_config(defaults, argv, help_source=None, choices=None):
    """A new dict of `defaults`' keys with the config files and --key=value overrides of `argv` applied in order.
    `--help` (or -h) prints help_text, with the keys described by the comments of the file `help_source` where they
    are assigned (the calling script; a tuple of files: the last one's comment wins), and exits 0."""
    if '--help' in argv or '-h' in argv:
        sources = help_source if isinstance(help_source, tuple) else (help_source,) if help_source else ()
        descriptions = {key: text for source in sources for key, text in script_comments(source).items()}
        print(help_text(defaults, descriptions, choices))
        sys.exit(0)
    config = dict(defaults)
    for arg in argv:
        if arg.startswith('--'):
            key, value = parse_override(arg, config)
            print(f'Overriding: {key} = {value}')
            config[key] = value
        elif arg.startswith('-'):
            raise ConfigError(f'{arg}: expected --key=value (or a config file path)')
        else:
            print(f'Overriding config with {arg}:')
            config.update(run_config_file(arg, config))
    return config
