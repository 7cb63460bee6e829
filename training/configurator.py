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

A script declares each of its keys once, in one line: `key = default # what it does`, the lines between the first two
SEPARATOR lines at its top, as nanoGPT's train.py shows its keys (or the items `key=default, # what it does` of a
`name = dict(...)`). read_keys reads a declaration without running it. A description that needs more room goes on
comment lines below, starting in its comment's column; `#:` lines right above a key describe it instead of its own
comment (train.py keeps nanoGPT's lines as nanoGPT wrote them, some with no comment). The values a key takes are
written once, as a tuple where the key acts (optim.OPTIMS, device.DTYPES, ... gathered in rules.CHOICES), and passed
to load_config as `choices`: --help lists the same tuple the checks test.
"""
import ast
import collections
import difflib
import io
import operator
import os
import sys
import tokenize

from training.device import default_backend, default_compile, default_device, default_dtype
from training.errors import ConfigError
from training.paths import ROOT

TRAIN_PY = os.path.join(ROOT, 'train.py')
SEPARATOR = '# ' + '-' * 77  # nanoGPT's line around train.py's keys
CONFIG_TYPES = (int, float, bool, str, type(None))
# the calls a default may make: what the machine has, so that the defaults suit it (training/device.py)
DEFAULT_FUNCTIONS = {f.__name__: f for f in (default_device, default_dtype, default_compile, default_backend)}
# the arithmetic a default may do on literals and earlier keys (nanoGPT's gradient_accumulation_steps = 5 * 8)
OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
             ast.FloorDiv: operator.floordiv, ast.Pow: operator.pow, ast.USub: operator.neg, ast.UAdd: operator.pos}
Key = collections.namedtuple('Key', 'default description')


def read_keys(path, name=None, base=None):
    """{key: Key(default, description)} of the declaration in the Python file `path`, in its order: the lines between
    its first two SEPARATOR lines, or with `name`, the items of its `name = dict(...)`. Nothing of the file runs: a
    default is computed from its expression (value_of), and anything that is not a described declaration is a
    ConfigError naming the file and line, for the developer who wrote it. `base`: the keys (train.py's) whose default
    the file may set again, a key of them without a comment keeping base's description."""
    with open(path, encoding='utf-8') as f:
        source = f.read()
    tree = ast.parse(source, path)
    comments = comment_lines(source)
    keys = {}
    for key, node, first, last in (dict_items(tree, name, path) if name else block_items(tree, comments, path)):
        where = f'{os.path.relpath(path)} line {first}'
        if key in keys:
            raise ConfigError(f'{where}: {key} is declared twice')
        default = value_of(node, keys, where)
        if not isinstance(default, CONFIG_TYPES):
            raise ConfigError(f'{where}: the default of {key} is a {type(default).__name__}: use an int, float, bool '
                              f'or str')
        description = describe(comments, first, last) or (base[key].description if key in (base or {}) else '')
        if not description:
            raise ConfigError(f'{where}: {key} has no description: end its line with `# what it does`')
        keys[key] = Key(default, description)
    return keys


def comment_lines(source):
    """{line number: (column, text, alone)} of the comments of `source`; alone: nothing but the comment on its line."""
    return {token.start[0]: (token.start[1], token.string, not token.line[:token.start[1]].strip())
            for token in tokenize.generate_tokens(io.StringIO(source).readline) if token.type == tokenize.COMMENT}


def block_items(tree, comments, path):
    """(key, value node, first line, last line) of each assignment between the first two SEPARATOR lines of the
    module `tree`; ConfigError for any other statement there."""
    separators = [line for line, (column, text, _) in sorted(comments.items()) if column == 0 and text == SEPARATOR]
    if len(separators) < 2:
        raise ConfigError(f'{os.path.relpath(path)}: no declaration of keys between two {SEPARATOR[:12]}... lines')
    for statement in tree.body:
        if not separators[0] < statement.lineno < separators[1]:
            continue
        if not (isinstance(statement, ast.Assign) and len(statement.targets) == 1
                and isinstance(statement.targets[0], ast.Name)):
            raise ConfigError(f'{os.path.relpath(path)} line {statement.lineno}: only `key = default # what it does` '
                              f'lines declare keys, got {ast.unparse(statement).splitlines()[0]!r}')
        yield statement.targets[0].id, statement.value, statement.lineno, statement.end_lineno


def dict_items(tree, name, path):
    """(key, value node, first line, last line) of each item of the module-level `name = dict(key=default, ...)`."""
    for statement in tree.body:
        if (isinstance(statement, ast.Assign) and [ast.unparse(t) for t in statement.targets] == [name]
                and isinstance(statement.value, ast.Call) and ast.unparse(statement.value.func) == 'dict'
                and not statement.value.args and all(item.arg for item in statement.value.keywords)):
            return [(item.arg, item.value, item.lineno, item.end_lineno) for item in statement.value.keywords]
    raise ConfigError(f'{os.path.relpath(path)}: no declaration of keys `{name} = dict(key=default, ...)`')


def value_of(node, keys, where):
    """The value of a default's expression, computed from its parts: a literal, arithmetic (OPERATORS), an earlier
    key of `keys`, or a call of DEFAULT_FUNCTIONS with such arguments. ConfigError for anything else."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name) and node.id in keys:
        return keys[node.id].default
    if isinstance(node, ast.UnaryOp) and type(node.op) in OPERATORS:
        return OPERATORS[type(node.op)](value_of(node.operand, keys, where))
    if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
        return OPERATORS[type(node.op)](value_of(node.left, keys, where), value_of(node.right, keys, where))
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in DEFAULT_FUNCTIONS
            and not node.keywords):
        return DEFAULT_FUNCTIONS[node.func.id](*(value_of(arg, keys, where) for arg in node.args))
    raise ConfigError(f"{where}: a default is a literal, arithmetic, an earlier key or a call of "
                      f"{', '.join(DEFAULT_FUNCTIONS)}; got {ast.unparse(node)!r}")


def describe(comments, first, last):
    """The description of the key declared on lines first..last: the `#:` lines right above it, else the comment that
    ends its last line and the comment lines below that start in the same column."""
    above = []
    while first - 1 in comments and comments[first - 1][2] and comments[first - 1][1].startswith('#:'):
        first -= 1
        above.insert(0, comments[first][1][2:].strip())
    if above:
        return ' '.join(above)
    if last not in comments or comments[last][2]:
        return ''
    column = comments[last][0]
    lines = [comments[last][1]]
    while last + 1 in comments and comments[last + 1][2] and comments[last + 1][0] == column:
        last += 1
        lines.append(comments[last][1])
    return ' '.join(line.lstrip('#').strip() for line in lines)


def defaults(keys):
    """{key: default} of read_keys' `keys`."""
    return {name: key.default for name, key in keys.items()}


def train_keys():
    """train.py's keys, for the tools that take its configs (bench.py, estimate_memory.py) and the tests."""
    return read_keys(TRAIN_PY)


def train_defaults():
    return defaults(train_keys())


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
    key = arg[2:].split('=', 1)[0]
    if key not in config:  # a typo first: --ladderr is more likely a near miss than a missing value
        raise ConfigError(f'unknown config key --{key}: {closest_keys(key, config)}')
    if '=' not in arg:
        raise ConfigError(f'{arg}: expected --key=value (or a config file path without --)')
    text = arg[2:].split('=', 1)[1]
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
        folder = os.path.dirname(path)
        stems = [f[:-3] for f in os.listdir(folder or '.') if f.endswith('.py')] if os.path.isdir(folder or '.') else []
        near = difflib.get_close_matches(os.path.basename(path).removesuffix('.py'), stems, n=1)  # not by '.py'
        raise ConfigError(f'config file {path} not found: ' + (f'did you mean {os.path.join(folder, near[0])}.py?'
                          if near else 'give the path of a config file, e.g. config/train_shakespeare_char.py'))
    try:
        with tokenize.open(path) as f:  # as Python reads a source file: UTF-8, or the coding its first lines declare
            source = f.read()
    except (UnicodeDecodeError, SyntaxError) as e:  # SyntaxError: a coding declared that Python does not know
        raise ConfigError(f'config file {path} is not text Python can read ({e}): save it as UTF-8') from None
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


def help_text(keys, choices=None):
    """--help: each of read_keys' `keys` with its default, its description and the values it takes (choices:
    {key: values}; True or False for a bool)."""
    choices = choices or {}
    script = os.path.basename(sys.argv[0]) if sys.argv[0].endswith('.py') else 'SCRIPT.py'
    lines = [f'usage: python {script} [config_file.py ...] [--key=value ...]',
             'config files (Python) run in order, then --key=value overrides; the keys, their defaults and values:']
    for name, (default, description) in keys.items():
        allowed = ('one of: ' + ', '.join(map(str, choices[name])) if name in choices else
                   'True or False' if isinstance(default, bool) else '')
        lines.append(f"  --{name}={default!r}  {'; '.join(filter(None, (description, allowed)))}".rstrip())
    return '\n'.join(lines)


def load_config(keys, argv, choices=None):
    """A new dict of read_keys' `keys` and their defaults, with the config files and --key=value overrides of `argv`
    applied in order. `--help` (or -h) prints help_text and exits 0."""
    if '--help' in argv or '-h' in argv:
        print(help_text(keys, choices))
        sys.exit(0)
    config = defaults(keys)
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
