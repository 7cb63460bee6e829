"""training/parallel.py's pure functions: the message of a collective that timed out. Runs under torchrun are
in e2e/test_torchrun.py."""
import os

import torch

from helpers import ROOT
from training.parallel import collective_failure


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
    message, options = collective_failure(all_reduce_in_estimate_loss(), 5)
    assert message.startswith('all_reduce at train.py line 2 (') and options == dict(every_rank=True, secondary=False)
    assert 'within timeout=5s (' in message and 'Timed out waiting 5000ms' in message and '--timeout' in message
    assert '\n' not in message
    assert collective_failure(RuntimeError('mat1 and mat2 shapes cannot be multiplied'), 5) is None
    try:
        raise RuntimeError('[../gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:43719')
    except RuntimeError as gone:
        assert collective_failure(gone, 5)[1] == dict(every_rank=True, secondary=True)  # the rank gone says why
