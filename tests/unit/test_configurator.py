"""training/configurator.py: nanoGPT's config files and --key=value overrides, --help, one-line errors, and
read_keys, the reader of the scripts' declarations of their keys (train.py's block at its top) that runs none of their
text."""
import inspect
import re

import pytest

from training import configurator
from training.configurator import Key, load_config, read_keys
from helpers import ROOT
from training import device, rules
from training.errors import ConfigError
from training.memory import estimate


DEFAULTS = {'batch_size': 12, 'learning_rate': 6e-4, 'compile': True, 'dataset': 'openwebtext',
            'wandb_run_name': 'gpt2', 'top_k': None}
KEYS = {key: Key(value, f'what {key} does') for key, value in DEFAULTS.items()}


def write(tmp_path, text, name='cfg.py'):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_files_then_overrides_in_order(tmp_path):
    path = write(tmp_path, "batch_size = 32\ndataset = 'shakespeare_char'\nlearning_rate = batch_size * 1e-5\n")
    config = load_config(KEYS, [path, '--batch_size=64', '--compile=False'])
    assert config == {**DEFAULTS, 'batch_size': 64, 'learning_rate': 32e-5, 'compile': False,
                      'dataset': 'shakespeare_char'}
    assert DEFAULTS['batch_size'] == 12  # a new dict: the defaults are untouched


def test_override_values_parse_as_nanogpt():
    config = load_config(KEYS, ['--learning_rate=1', '--dataset=shakespeare_char', '--wandb_run_name=123',
                                    '--top_k=[1, 2]', "--dataset='quoted'"])
    assert config['learning_rate'] == 1.0 and type(config['learning_rate']) is float  # an int for a float key
    assert config['dataset'] == 'quoted'  # literal_eval of a quoted string
    assert config['wandb_run_name'] == '123'  # a str key keeps the text
    assert config['top_k'] == [1, 2]  # a None default accepts anything


def test_config_file_sees_current_values_and_keeps_helpers(tmp_path):
    path = write(tmp_path, "import time\ntokens_per_step = batch_size * 1024\nbatch_size = batch_size * 2\n")
    config = load_config(KEYS, ['--batch_size=3', path])
    assert config['batch_size'] == 6 and set(config) == set(DEFAULTS)


def test_unknown_key_names_the_closest(tmp_path):
    with pytest.raises(ConfigError) as e:
        load_config(KEYS, ['--batch_sise=8'])
    assert '--batch_sise' in str(e.value) and '--batch_size' in str(e.value)
    with pytest.raises(ConfigError, match='learning_rat.*--learning_rate'):
        load_config(KEYS, [write(tmp_path, 'learning_rat = 1e-3\n')])


def test_wrong_type_names_key_type_and_value(tmp_path):
    with pytest.raises(ConfigError) as e:
        load_config(KEYS, ['--batch_size=big'])
    message = str(e.value)
    assert 'batch_size' in message and 'int' in message and "'big'" in message and '\n' not in message
    with pytest.raises(ConfigError, match="compile must be bool.*got int 1"):
        load_config(KEYS, ['--compile=1'])
    with pytest.raises(ConfigError, match=r'cfg.py.*batch_size must be int.*got float 8\.5'):
        load_config(KEYS, [write(tmp_path, 'batch_size = 8.5\n')])


def test_missing_or_broken_config_file(tmp_path):
    with pytest.raises(ConfigError, match=r'config file .*nope.py not found: give the path of a config file, e\.g\. '):
        load_config(KEYS, [str(tmp_path / 'nope.py')])
    write(tmp_path, 'batch_size = 8\n', 'train_small.py')
    with pytest.raises(ConfigError, match=f"config file .*train_smal.py not found: did you mean "
                                          f"{re.escape(str(tmp_path / 'train_small.py'))}\\?"):
        load_config(KEYS, [str(tmp_path / 'train_smal.py')])
    with pytest.raises(ConfigError, match='bad.py.*NameError'):
        load_config(KEYS, [write(tmp_path, 'batch_size = undefined_name\n', 'bad.py')])
    with pytest.raises(ConfigError, match='expected --key=value'):
        load_config(KEYS, ['--batch_size'])
    with pytest.raises(ConfigError, match='unknown config key --batch_sizes: did you mean --batch_size'):
        load_config(KEYS, ['--batch_sizes'])  # a bare flag with a typo: the typo is the likelier mistake


def test_a_config_file_is_read_as_python_reads_source(tmp_path):
    """UTF-8, or the coding its first lines declare; bytes of neither are one line naming the file."""
    (tmp_path / 'latin.py').write_bytes(b'# -*- coding: latin-1 -*-\nbatch_size = 3  # caf\xe9\n')
    assert load_config(KEYS, [str(tmp_path / 'latin.py')])['batch_size'] == 3
    (tmp_path / 'binary.py').write_bytes(b'batch_size = 3\n\xff\n')
    with pytest.raises(ConfigError, match=r"^config file .*binary.py is not text Python can read \('utf-8' codec "
                                          r"can't decode byte 0xff in position 15: .*\): save it as UTF-8$"):
        load_config(KEYS, [str(tmp_path / 'binary.py')])


def test_help_lists_keys_with_defaults_descriptions_and_values(capsys):
    with pytest.raises(SystemExit) as e:
        load_config(KEYS, ['--help'], choices={'dataset': ('openwebtext', 'shakespeare')})
    assert e.value.code == 0
    lines = capsys.readouterr().out.splitlines()
    assert '  --batch_size=12  what batch_size does' in lines
    assert '  --compile=True  what compile does; True or False' in lines
    assert "  --dataset='openwebtext'  what dataset does; one of: openwebtext, shakespeare" in lines
    assert '  --top_k=None  what top_k does' in lines


def declaration(tmp_path, block, name='script.py', before='', after=''):
    """The path of a script whose keys are `block`, between the two separator lines nanoGPT's train.py has."""
    return write(tmp_path, f'{before}{configurator.SEPARATOR}\n{block}{configurator.SEPARATOR}\n{after}', name)


def test_read_keys_computes_defaults_without_running_the_file(tmp_path):
    path = declaration(tmp_path, "# I/O\n"
                                 "out_dir = 'out' # where ckpt.pt goes\n"
                                 "gradient_accumulation_steps = 5 * 8 # nanoGPT's arithmetic\n"
                                 "min_lr = -6e-4 / 10 # a negative float\n"
                                 "eval_iters = gradient_accumulation_steps # an earlier key\n"
                                 "device = default_device() # the machine's\n"
                                 "dtype = default_dtype(device) # of the device above\n"
                                 "compile = default_compile(device) # on CUDA\n"
                                 "backend = default_backend() # nccl or gloo\n",
                       before='raise SystemExit("the file ran")\n', after='raise SystemExit("the file ran")\n')
    keys = read_keys(path)
    assert configurator.defaults(keys) == {
        'out_dir': 'out', 'gradient_accumulation_steps': 40, 'min_lr': -6e-4 / 10, 'eval_iters': 40,
        'device': device.default_device(), 'dtype': device.default_dtype(device.default_device()),
        'compile': device.default_compile(device.default_device()), 'backend': device.default_backend()}
    assert keys['out_dir'] == Key('out', 'where ckpt.pt goes')
    assert type(keys['min_lr'].default) is float and type(keys['eval_iters'].default) is int


def test_read_keys_takes_long_descriptions_and_the_lines_above_nanogpts_keys(tmp_path):
    path = declaration(tmp_path, "# model\n"
                                 "n_layer = 12 # transformer blocks\n"
                                 "#: the width of the residual stream,\n"
                                 "#: in channels\n"
                                 "n_embd = 768\n"
                                 "wandb_log = False # disabled by default\n"
                                 "mode = 'train' # what to time: training iterations,\n"
                                 "               # or the loss path\n"
                                 "# a section comment, not a description\n"
                                 "#: a run's name\n"
                                 "wandb_run_name = 'gpt2' # 'run' + str(time.time())\n")
    descriptions = {key: k.description for key, k in read_keys(path).items()}
    assert descriptions == {'n_layer': 'transformer blocks', 'n_embd': 'the width of the residual stream, in channels',
                            'wandb_log': 'disabled by default',
                            'mode': 'what to time: training iterations, or the loss path',
                            'wandb_run_name': "a run's name"}


def test_read_keys_of_a_dict_and_a_base_whose_descriptions_it_keeps(tmp_path):
    path = write(tmp_path, "import torch\ndefaults = dict(\n    top_k=200, # keep the top_k tokens\n"
                           "    dtype=default_dtype(default_device()), # autocast's\n    n_layer=4,\n)\n")
    base = {'n_layer': Key(12, 'transformer blocks')}
    keys = read_keys(path, 'defaults', base=base)
    assert keys == {'top_k': Key(200, 'keep the top_k tokens'),
                    'dtype': Key(device.default_dtype(device.default_device()), "autocast's"),
                    'n_layer': Key(4, 'transformer blocks')}
    with pytest.raises(ConfigError, match='no description'):
        read_keys(path, 'defaults')
    with pytest.raises(ConfigError, match=r'cfg.py: no declaration of keys `settings = dict'):
        read_keys(path, 'settings')


@pytest.mark.parametrize('line, message', [
    ("log = open(MARKER, 'w').write('ran') # a side effect", r"line 4: a default is a literal, arithmetic, an earlier "
                                                            r"key or a call of default_device, .*; got \"open\("),
    ("import os # an import", r"line 4: only `key = default # what it does` lines declare keys, got 'import os'"),
    ("print('ran') # a call",
     r"line 4: only `key = default # what it does` lines declare keys, got \"print\('ran'\)\""),
    ("seed = default_device(os.system('true')) # a table function, an argument that is not",
     r'line 4: a default is .*; got "os.system\(.true.\)"'),
    ("steps = later + 1 # a key declared further down", "line 4: .*got 'later'"),
    ("batch_size = 8 # again", 'line 4: batch_size is declared twice'),
    ("sizes = [1, 2] # a list", r"line 4: a default is .*; got '\[1, 2\]'"),
    ("data = b'text' # bytes", 'line 4: the default of data is a bytes: use an int, float, bool or str'),
    ("n_head = 12", r'line 4: n_head has no description: end its line with `# what it does`'),
])
def test_read_keys_refuses_anything_but_a_described_declaration(tmp_path, line, message):
    """A block that would run code, or a key with no description, is one line naming the file and line; the text
    never runs (the side effect's file is not written)."""
    marker = tmp_path / 'ran'
    path = declaration(tmp_path, f"batch_size = 12 # a key\n{line.replace('MARKER', repr(str(marker)))}\n",
                       before='import os\n')
    with pytest.raises(ConfigError, match=r'script.py ' + message) as e:
        read_keys(path)
    assert '\n' not in str(e.value) and not marker.exists()


def test_read_keys_needs_a_declaration(tmp_path):
    with pytest.raises(ConfigError, match='script.py: no declaration of keys between two'):
        read_keys(write(tmp_path, "batch_size = 12 # a key\n", 'script.py'))


def train_block_run_as_python():
    """What train.py's globals hold after its block runs, as it does when train.py starts."""
    source = (ROOT / 'train.py').read_text()
    block = source.split(configurator.SEPARATOR + '\n')[1]
    namespace = {name: getattr(device, name) for name in configurator.DEFAULT_FUNCTIONS}
    exec(block, namespace)
    return {key: value for key, value in namespace.items() if key not in configurator.DEFAULT_FUNCTIONS
            and not key.startswith('_')}


def test_train_py_declares_each_key_once_with_its_description_and_the_default_it_runs_with():
    keys = configurator.train_keys()
    assert configurator.train_defaults() == train_block_run_as_python()
    assert all(key.description for key in keys.values())
    assert {'out_dir', 'batch_size', 'n_layer', 'device', 'dtype', 'compile', 'backend'} <= set(keys)
    assert not hasattr(configurator, 'NANOGPT_KEY_DESCRIPTIONS')  # one place for a description: the key's line


def test_train_help_shows_each_key_with_its_description_and_values():
    lines = configurator.help_text(configurator.train_keys(), rules.CHOICES).splitlines()
    for name, key in configurator.train_keys().items():
        line = next(line for line in lines if line.startswith(f'  --{name}='))
        assert line.startswith(f'  --{name}={key.default!r}  {key.description}')
        if name in rules.CHOICES:
            assert line.endswith('; one of: ' + ', '.join(map(str, rules.CHOICES[name])))
    assert set(rules.CHOICES) <= set(configurator.train_keys())


def test_tools_declare_their_own_keys_only():
    """bench.py and estimate_memory.py take train.py's keys from train.py's declaration: none is declared again, and
    the estimator's own keys read as Python holds them."""
    train = set(configurator.train_keys())
    assert set(read_keys(ROOT / 'bench.py')) & train == set()
    own = read_keys(inspect.getfile(estimate), 'ESTIMATOR_DEFAULTS')
    assert configurator.defaults(own) == estimate.ESTIMATOR_DEFAULTS and set(own) & train == set()
