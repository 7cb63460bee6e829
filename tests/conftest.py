"""Fixtures shared by the tests of several folders: a tiny character dataset, one thread, the estimator's configs of
two small models and its trace made once per set of arguments, torch's FlashAttention kernel on a CPU; the `cuda`
marker's skip without a GPU. Helpers that tests import live in helpers.py."""
import copy
import inspect
import json
import pickle

import pytest
import torch

import estimate_memory
import flash_varlen_on_a_cpu
from helpers import write_char_dataset
from training.memory import estimate as em, fit


def pytest_collection_modifyitems(items):
    """Tests marked `cuda` (the GPU suite, `-m cuda`) skip where torch sees no CUDA GPU."""
    if not torch.cuda.is_available():
        for item in items:
            if item.get_closest_marker('cuda'):
                item.add_marker(pytest.mark.skip(reason='needs a CUDA GPU (the GPU suite: python -m pytest -m cuda)'))


@pytest.fixture
def data_dir(tmp_path):
    """tmp_path/data holding the tiny character dataset DATASET."""
    write_char_dataset(tmp_path / 'data')
    return tmp_path / 'data'


@pytest.fixture(autouse=True)
def one_thread():
    """One thread in this process, as in the subprocesses the tests start (OMP_NUM_THREADS=1): two threads on the two
    cores the tests share can be a hundred times slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def estimator_config(data_dir, vocab_size, **keys):
    """estimate_memory.py's config of a model from scratch on a dataset in data_dir whose meta.pkl has vocab_size."""
    (data_dir / 'tiny').mkdir()
    with open(data_dir / 'tiny' / 'meta.pkl', 'wb') as f:
        pickle.dump({'vocab_size': vocab_size}, f)
    return {**estimate_memory.estimator_defaults(), 'data_dir': str(data_dir), 'dataset': 'tiny',
            'init_from': 'scratch', 'bias': False, 'dropout': 0.0, 'eval_batch_size': 0, 'dtype': 'float32',
            'activation_checkpointing': False, **keys}


@pytest.fixture
def tiny(tmp_path):
    """A 2-layer GPT with a 96-token vocabulary, fp32, 2 micro-steps, clipping on."""
    return estimator_config(tmp_path, 96, n_layer=2, n_head=2, n_embd=64, block_size=32, bias=True, batch_size=4,
                            gradient_accumulation_steps=2, grad_clip=1.0)


@pytest.fixture
def weighty(tmp_path):
    """A model whose memory is mostly the weights' training state, the blocks' matrices most of it, as in
    finetuning."""
    return estimator_config(tmp_path, 256, n_layer=2, n_head=4, n_embd=256, block_size=32, batch_size=1,
                            gradient_accumulation_steps=1, grad_clip=0.0)


@pytest.fixture
def trace_once(monkeypatch):
    """estimate.trace, for this test and for the searches and ladders it runs, traced once per set of arguments: a
    trace is a pure function of them, and a batch search retraces the configs that its test traces to check it."""
    traces, trace = {}, em.trace
    signature = inspect.signature(trace)

    def traced_once(*args, **kwargs):
        arguments = signature.bind(*args, **kwargs)
        arguments.apply_defaults()  # the same call, whether an argument is given or left to its default
        key = json.dumps({k: v for k, v in arguments.arguments.items() if k != 'progress'}, sort_keys=True)
        if key not in traces:
            traces[key] = trace(*args, **kwargs)
        return copy.deepcopy(traces[key])  # estimate() adds to the dict it gets

    monkeypatch.setattr(em, 'trace', traced_once)
    monkeypatch.setattr(fit, 'trace', traced_once)  # the searches' and ladders' own name for it
    return traced_once


@pytest.fixture
def flash_kernel():
    """torch's varlen_attn, FlashAttention's variable-length kernel, running on CPU kernels that check and compute what
    the CUDA one does (flash_varlen_on_a_cpu.py); skipped where this torch has no varlen_attn with a sliding window."""
    kernel = flash_varlen_on_a_cpu.varlen_attn()
    if kernel is None:
        pytest.skip(f"needs torch.nn.attention.varlen's varlen_attn with window_size (torch 2.12 and later); this is "
                    f"torch {torch.__version__}")
    return kernel
