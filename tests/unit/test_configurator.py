"""configurator.py: nanoGPT's config files and --key=value overrides, --help, and one-line errors."""
import pytest

import configurator
from configurator import load_config
from training.errors import ConfigError


DEFAULTS = {'batch_size': 12, 'learning_rate': 6e-4, 'compile': True, 'dataset': 'openwebtext',
            'wandb_run_name': 'gpt2', 'top_k': None}


def write(tmp_path, text, name='cfg.py'):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_files_then_overrides_in_order(tmp_path):
    path = write(tmp_path, "batch_size = 32\ndataset = 'shakespeare_char'\nlearning_rate = batch_size * 1e-5\n")
    config = load_config(DEFAULTS, [path, '--batch_size=64', '--compile=False'])
    assert config == {**DEFAULTS, 'batch_size': 64, 'learning_rate': 32e-5, 'compile': False,
                      'dataset': 'shakespeare_char'}
    assert DEFAULTS['batch_size'] == 12  # a new dict: the defaults are untouched


def test_override_values_parse_as_nanogpt():
    config = load_config(DEFAULTS, ['--learning_rate=1', '--dataset=shakespeare_char', '--wandb_run_name=123',
                                    '--top_k=[1, 2]', "--dataset='quoted'"])
    assert config['learning_rate'] == 1.0 and type(config['learning_rate']) is float  # an int for a float key
    assert config['dataset'] == 'quoted'  # literal_eval of a quoted string
    assert config['wandb_run_name'] == '123'  # a str key keeps the text
    assert config['top_k'] == [1, 2]  # a None default accepts anything


def test_config_file_sees_current_values_and_keeps_helpers(tmp_path):
    path = write(tmp_path, "import time\ntokens_per_step = batch_size * 1024\nbatch_size = batch_size * 2\n")
    config = load_config(DEFAULTS, ['--batch_size=3', path])
    assert config['batch_size'] == 6 and set(config) == set(DEFAULTS)


def test_unknown_key_names_the_closest(tmp_path):
    with pytest.raises(ConfigError) as e:
        load_config(DEFAULTS, ['--batch_sise=8'])
    assert '--batch_sise' in str(e.value) and '--batch_size' in str(e.value)
    with pytest.raises(ConfigError, match='learning_rat.*--learning_rate'):
        load_config(DEFAULTS, [write(tmp_path, 'learning_rat = 1e-3\n')])


def test_wrong_type_names_key_type_and_value(tmp_path):
    with pytest.raises(ConfigError) as e:
        load_config(DEFAULTS, ['--batch_size=big'])
    message = str(e.value)
    assert 'batch_size' in message and 'int' in message and "'big'" in message and '\n' not in message
    with pytest.raises(ConfigError, match="compile must be bool.*got int 1"):
        load_config(DEFAULTS, ['--compile=1'])
    with pytest.raises(ConfigError, match=r'cfg.py.*batch_size must be int.*got float 8\.5'):
        load_config(DEFAULTS, [write(tmp_path, 'batch_size = 8.5\n')])


def test_missing_or_broken_config_file(tmp_path):
    with pytest.raises(ConfigError, match='config file .*nope.py not found'):
        load_config(DEFAULTS, [str(tmp_path / 'nope.py')])
    with pytest.raises(ConfigError, match='bad.py.*NameError'):
        load_config(DEFAULTS, [write(tmp_path, 'batch_size = undefined_name\n', 'bad.py')])
    with pytest.raises(ConfigError, match='expected --key=value'):
        load_config(DEFAULTS, ['--batch_size'])


def test_help_lists_keys_with_defaults_descriptions_and_values(tmp_path, capsys):
    script = write(tmp_path, "defaults = dict(\n    batch_size=12, # samples a micro-step\n    learning_rate=6e-4,\n)\n"
                             "compile = True # use torch.compile\nbatch_size = 3 # not the default: read once\n")
    with pytest.raises(SystemExit) as e:
        load_config(DEFAULTS, ['--help'], help_source=script, choices={'dataset': ('openwebtext', 'shakespeare')})
    assert e.value.code == 0
    lines = capsys.readouterr().out.splitlines()
    assert '  --batch_size=12  samples a micro-step' in lines
    assert '  --learning_rate=0.0006' in lines  # no comment, no description
    assert '  --compile=True  use torch.compile; True or False' in lines
    assert "  --dataset='openwebtext'  one of: openwebtext, shakespeare" in lines
    assert '  --top_k=None' in lines



def test_help_reads_descriptions_from_several_scripts_the_last_winning(tmp_path, capsys):
    base = write(tmp_path, "batch_size = 12 # from the base\ncompile = True # use torch.compile\n", 'base.py')
    tool = write(tmp_path, "batch_size = 12 # from the tool\n", 'tool.py')
    with pytest.raises(SystemExit):
        load_config(DEFAULTS, ['--help'], help_source=(base, tool))
    lines = capsys.readouterr().out.splitlines()
    assert '  --batch_size=12  from the tool' in lines
    assert '  --compile=True  use torch.compile; True or False' in lines


def test_key_comments_reads_the_first_assignment_of_each_key():
    source = ("x = 1 # the first\nx = 2 # the second\ndefaults = dict(\n    y='a', # a keyword\n    z=3,\n)\n"
              "w = 4\nw = 5 # after an uncommented first\nprint(x) # not an assignment\n")
    assert configurator.key_comments(source) == {'x': 'the first', 'y': 'a keyword'}
