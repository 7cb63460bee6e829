"""training/memory/floor.py: the least memory a run's sizes certainly take, and the one line where the machine has
less."""
import pytest

from training.errors import ConfigError
from training.memory import floor

GIB = 2 ** 30


def test_the_floor_counts_weights_gradients_and_block_inputs_in_their_dtypes():
    model_args = dict(n_layer=2, n_embd=64, vocab_size=100, block_size=32)
    params = 100 * 64 + 2 * 12 * 64 * 64
    fp32 = floor.training_floor(dict(weight_dtype='float32', dtype='float32', batch_size=3), model_args)
    assert fp32 == {'weights and gradients': 8 * params, 'block inputs': 2 * 3 * 32 * 64 * 4}
    bf16 = floor.training_floor(dict(weight_dtype='bfloat16', dtype='bfloat16', batch_size=3), model_args)
    assert bf16 == {'weights and gradients': 4 * params, 'block inputs': 2 * 3 * 32 * 64 * 2}


def test_a_floor_over_the_machine_is_one_line_naming_it_and_the_fixes(monkeypatch):
    monkeypatch.setattr(floor, 'machine_bytes', lambda device: (8 * GIB, "this machine's RAM"))
    floor.check_floor({'a': 4 * GIB, 'b': 4 * GIB}, 'cpu', 'fix it')  # exactly fits
    with pytest.raises(ConfigError) as error:
        floor.check_floor({'a': 6 * GIB, 'b': 3 * GIB}, 'cpu', 'lower batch_size (12)')
    assert str(error.value) == ("this run needs at least 9.0 GiB (a 6.0, b 3.0), more than this machine's RAM "
                                "(8.0 GiB): lower batch_size (12)")


def test_this_machines_ram_is_the_cpus_limit():
    available, what = floor.machine_bytes('cpu')
    assert what == "this machine's RAM" and 2 ** 28 < available < 2 ** 50
