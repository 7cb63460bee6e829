"""training/step.py's choice of FlexAttention's kernel options on a GPU (set_flex_options): the first whose probe
runs, else, under attention_kernel='auto', the masked attention with a line that says so, and under 'flex' a
ConfigError. The probe and the GPU are simulated: FlexAttention's kernel is the CPU stand-in (tests/flex_on_a_cpu.py)
and the GPU's properties an RTX 3060's."""
import types

import pytest
import torch

import flex_on_a_cpu
from training.chunked_loss import chunked_cross_entropy
from helpers import tokens_with_documents
from model import GPT, GPTConfig
from training import attention, configurator, runs, step
from training.attention import Kernels
from training.errors import ConfigError

RTX_3060 = types.SimpleNamespace(shared_memory_per_block_optin=101376)
WINDOWED = dict(n_layer=2, n_head=2, n_embd=32, vocab_size=64, block_size=384, pos_emb='rope', attn_window=256,
                attn_window_block=128, doc_token=3)


def config(attention_kernel):
    return {**configurator.train_defaults(), 'dtype': 'float32', 'attention_kernel': attention_kernel}


def attention_kinds(model):
    kinds = []
    x = tokens_with_documents((1, 384), 0, every=90)
    with torch.no_grad():
        kinds.append(attention.kind(model.attention(x, torch.arange(384), None, 256)))
    return kinds


@pytest.fixture
def probes(monkeypatch):
    """The kernel options each probe was given, with the CPU stand-in as the compiled kernel."""
    monkeypatch.setattr(attention, 'compiled_flex_attention', lambda: flex_on_a_cpu.flex_attention)
    given = []
    probe = step.flex_probe
    monkeypatch.setattr(step, 'flex_probe', lambda *args: given.append(args[-1]) or probe(*args))
    return given


def test_the_first_options_whose_probe_runs_are_the_models(probes, capsys):
    model = GPT(GPTConfig(**WINDOWED), kernels=Kernels(flex=True))
    step.set_flex_options(model, config('auto'), 'cpu', RTX_3060)
    assert probes == [attention.flex_kernel_options(RTX_3060, 16)[0]] and model.kernels.flex_options == probes[0]
    assert 'attention: FlexAttention for the windows in blocks, kernel options: fwd_BLOCK_M=' in capsys.readouterr().out
    assert attention_kinds(model) == ['flex']


def test_auto_falls_back_to_the_next_options_then_to_the_masked_attention_with_a_line(probes, monkeypatch, capsys):
    def out_of_resources(*args, **kwargs):
        raise RuntimeError('out of resource: shared memory, Required: 131074, Hardware limit: 101376')
    monkeypatch.setattr(attention, 'compiled_flex_attention', lambda: out_of_resources)
    model = GPT(GPTConfig(**WINDOWED), kernels=Kernels())  # attention_kernel='auto'
    step.set_flex_options(model, config('auto'), 'cpu', RTX_3060)
    assert probes == list(attention.flex_kernel_options(RTX_3060, 16))  # each tried, fastest first
    out = capsys.readouterr().out
    assert out == ("attention: FlexAttention does not run on this GPU (RuntimeError: out of resource: shared memory, "
                   "Required: 131074, Hardware limit: 101376): the windows in blocks run the masked attention "
                   "(attention_kernel='masked'), slower\n")
    assert model.kernels.flex is False and attention_kinds(model) == ['window']
    x = tokens_with_documents((1, 384), 0, every=90)
    _, loss = model(x, x)
    loss.backward()  # and it trains
    assert torch.isfinite(loss)


def test_flex_asked_for_where_it_does_not_run_is_one_line(probes, monkeypatch):
    monkeypatch.setattr(attention, 'compiled_flex_attention', lambda: None)  # calling it: a TypeError
    model = GPT(GPTConfig(**WINDOWED), kernels=Kernels(flex=True))
    with pytest.raises(ConfigError, match=r"^attention_kernel='flex': FlexAttention does not run on this GPU "
                                          r"\(TypeError: 'NoneType' object is not callable\): use "
                                          r"--attention_kernel=auto or masked$"):
        step.set_flex_options(model, config('flex'), 'cpu', RTX_3060)


def test_attention_kernel_sets_the_models_flex_kernel():
    for key, flex_kernel in (('auto', None), ('flex', True), ('masked', False)):
        built = step.build_model({**config(key), 'n_layer': 2, 'n_head': 2, 'n_embd': 32}, WINDOWED)
        assert (built.kernels.flash, built.kernels.flex) == (None, flex_kernel)
        assert built.loss_fn is chunked_cross_entropy  # train.py's loss, not model.py's own


def test_the_line_on_windows_by_position_and_documents_says_which_attention_runs_and_why(monkeypatch):
    """attention_by_position, train.py's line on CUDA (flash_kernel=True: as on an Ampere GPU): FlashAttention's
    variable-length kernel for gpt2026.py's model and model.py's windows by position or documents, else the masked
    attention with what the kernel lacks; nothing for windows in blocks (set_flex_options' line) or plain attention."""
    kernel = "attention: FlashAttention's variable-length kernel for the windows by position and the documents"
    masked = 'attention: the masked attention for the windows by position and the documents, slower and larger ('
    record = {**configurator.train_defaults(), 'model_file': 'gpt2026.py', 'n_layer': 11, 'n_head': 6,
              'n_embd': 768, 'doc_token': 50256, 'dtype': 'bfloat16', 'device': 'cuda'}
    record_args = runs.record_model_args(record, 64)
    by_position = dict(WINDOWED, attn_window_block=0)
    gpt = {**configurator.train_defaults(), 'dtype': 'bfloat16', 'dropout': 0.0, 'device': 'cuda'}
    line = step.attention_by_position
    assert line(record, record_args, flash_kernel=True) == kernel
    assert line(gpt, by_position, flash_kernel=True) == kernel
    assert line(gpt, dict(by_position, attn_window=0), flash_kernel=True) == kernel  # documents alone
    assert line(gpt, WINDOWED, flash_kernel=True) is None
    assert line(gpt, dict(by_position, attn_window=0, doc_token=-1), flash_kernel=True) is None
    assert line({**record, 'attention_kernel': 'masked'}, record_args, flash_kernel=True) == \
        masked + "attention_kernel='masked')"
    needs = masked + "FlashAttention's variable-length kernel needs "
    assert line({**record, 'dtype': 'float32'}, record_args, flash_kernel=True) == \
        needs + 'bf16 or fp16 (--dtype=bfloat16))'
    assert line({**gpt, 'dropout': 0.1}, by_position, flash_kernel=True) == needs + 'no dropout (--dropout=0))'
    assert line(record, record_args, flash_kernel=False) == needs + 'an Ampere or later GPU)'
    monkeypatch.setattr(attention, 'flash_varlen_attn', lambda: None)  # torch before 2.12: no window in varlen_attn
    torch_needed = f'torch 2.12 or later (this one is {torch.__version__}))'
    assert line(record, record_args, flash_kernel=True) == needs + torch_needed
