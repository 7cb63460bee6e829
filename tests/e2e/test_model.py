"""model.py in subprocesses and under torch.compile: copied alone it trains (gpt2026.py too), and compiled it computes
what eager does, through torch's FlashAttention kernel too (on CPU kernels) without compiling anew for each window,
and FlexAttention's forward in its graph; on a CUDA GPU (the GPU suite, `-m cuda`), FlashAttention's variable-length
kernel and FlexAttention's kernels (torch's tiles and a consumer card's) compute what the masked attention does, on
the speedrun preset's model with random weights within the masked attention's own bf16 error."""
import contextlib
import io
import math
import os
import shutil
import subprocess
import sys

import pytest
import torch

from training import chunked_loss
import flash_varlen_on_a_cpu
from training.chunked_loss import chunked_cross_entropy
from model import GPT, GPTConfig
from training import attention, card_checks, configurator, rules
from training.attention import Kernels
from training.recipe import at_depth
from helpers import (ROOT, loss_and_gradients, loss_and_grads, loss_inputs, softcap_inputs, tiny_gpt,
                     tokens_with_documents)


@pytest.mark.parametrize('options', [{}, dict(pos_emb='rope', norm='rmsnorm', qk_norm=True, mlp='relu2',
                                               tie_weights=False, logit_softcap=3.0, value_embeds=1, unet_skips=True,
                                               x0_shortcut=True)], ids=['gpt2', 'modern'])
@pytest.mark.parametrize('loss_chunk_mib', [None, 2 ** -10], ids=['one piece', 'chunks'])
def test_compiled_model_matches_eager_and_runs_the_compiled_chunks(monkeypatch, options, loss_chunk_mib):
    """Compiled, train.py's loss (training/chunked_loss.py's) runs nanoGPT's one piece compiled where the budget holds
    it (the default, for 32 rows of a 50-token vocabulary), else chunks whose softmax is compiled (1 KiB: a few rows a
    chunk)."""
    torch.manual_seed(0)
    model = GPT(tiny_gpt(**options).config, loss_fn=chunked_cross_entropy, loss_chunk_mib=loss_chunk_mib)
    x = torch.randint(0, 50, (2, 16))
    fused_calls = []
    compiled_chunk = chunked_loss._compiled_softmax_chunk
    monkeypatch.setattr(chunked_loss, '_compiled_softmax_chunk', lambda *a: fused_calls.append(1) or compiled_chunk(*a))
    _, eager = model(x, x)
    eager_grads = torch.autograd.grad(eager, list(model.parameters()))
    assert not fused_calls  # eager: the eager chunk path
    compiled = torch.compile(model)
    _, loss = compiled(x, x)
    assert bool(fused_calls) == (loss_chunk_mib is not None)
    grads = torch.autograd.grad(loss, list(model.parameters()))
    torch.testing.assert_close(loss, eager, rtol=1e-5, atol=1e-5)
    for a, b in zip(grads, eager_grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_compiled_model_on_its_own_loss_matches_eager():
    """model.py alone, compiled: its own loss (linear_cross_entropy, a few rows a chunk) runs eagerly between the
    compiled graphs and gives the eager loss and gradients, with windows and documents under their masks."""
    torch.manual_seed(0)
    model = GPT(tiny_gpt(pos_emb='rope', logit_softcap=3.0, attn_window=6, doc_token=3).config, loss_chunk_mib=2 ** -10)
    x, y = tokens_with_documents((2, 16), 1), torch.randint(0, 50, (2, 16))
    eager = loss_and_gradients(model, x, y)
    compiled = loss_and_gradients(torch.compile(model), x, y)
    torch.testing.assert_close(compiled[0], eager[0], rtol=1e-5, atol=1e-5)
    for a, b in zip(compiled[1], eager[1]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def chunks(h, w, t, chunk_size, fused, softcap=0.0):
    """chunked_cross_entropy's mean in chunks of chunk_size rows, fp32, each chunk's softmax compiled if fused."""
    return chunked_loss._chunked_cross_entropy(h, w, t, -1, chunk_size, 'mean', fused, softcap,
                                               chunked_loss.DEFAULT_CHUNK_BYTES, torch.float32, True)


def test_softcap_compiled_chunks_match_eager():
    h, w, t = softcap_inputs(torch.float32)
    results = []
    for fused in (False, True):
        loss = chunks(h, w, t, 16, fused, softcap=5.0)
        results.append((loss, *torch.autograd.grad(loss, (h, w))))
    for eager, compiled in zip(*results):
        torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-6)


def test_model_files_copied_alone_train(tmp_path):
    """nanoGPT's habit: copy model.py into another project. It needs torch and nothing else of this repository, to
    train or to generate, with windows and documents too (its own masked attention and loss); so does gpt2026.py."""
    for name in ('model.py', 'gpt2026.py'):
        shutil.copy(ROOT / name, tmp_path)
    code = ("import torch, model, gpt2026\n"
            "windowed = model.GPT(model.GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=32,\n"
            "                                     attn_window=3, doc_token=5))\n"
            "windowed(torch.randint(32, (2, 8)), torch.randint(32, (2, 8)))[1].backward()\n"
            "record = gpt2026.GPT2026(gpt2026.GPT2026Config(vocab_size=32, bigram_vocab_size=160, n_head=2,\n"
            "                                               n_embd=32, doc_token=5))\n"
            "record(torch.randint(32, (1, 16)), torch.randint(32, (1, 16)))[1].backward()\n"
            "gpt = model.GPT(model.GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=32))\n"
            "optimizer = gpt.configure_optimizers(0.1, 1e-2, (0.9, 0.95), 'cpu')\n"
            "x = torch.randint(32, (2, 8))\n"
            "_, loss = gpt(x, x)\n"
            "loss.backward()\n"
            "optimizer.step()\n"
            "print(loss.item(), gpt(x, x)[1].item())\n"
            "assert gpt.eval().generate(x[:, :2], 10).shape == (2, 12)\n")  # with its KV cache, past block_size
    env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}
    result = subprocess.run([sys.executable, '-s', '-c', code], cwd=tmp_path, capture_output=True, text=True,
                            timeout=120, env=env)
    assert result.returncode == 0, result.stderr
    before, after = map(float, result.stdout.split()[-2:])
    assert after < before  # one step of AdamW on the same batch lowers its loss


def test_compiled_chunks_match_eager_in_fp32_with_a_short_last_chunk():
    compiled_loss = torch.compile(chunked_cross_entropy)  # its chunks' softmax runs compiled: _compiled_softmax_chunk
    h, w, t = loss_inputs()
    t[::5] = -1
    eager = loss_and_grads(lambda *a: chunked_cross_entropy(*a, chunk_size=7), h, w, t)  # 300 % 7 != 0
    compiled = loss_and_grads(lambda *a: compiled_loss(*a, chunk_size=7), h, w, t)
    for a, b in zip(eager, compiled):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
    with torch.no_grad():
        eager = chunked_cross_entropy(h, w, t, chunk_size=7, reduction='none')
        compiled = compiled_loss(h, w, t, chunk_size=7, reduction='none')
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-6)


def test_compiled_chunks_match_eager_under_bf16_and_fp16_autocast():
    """bf16 logits go into the compiled kernel as they are (upcast inside it); fp16 keeps the unfolded scales."""
    compiled_loss = torch.compile(chunked_cross_entropy)
    h, w, t = loss_inputs(n=512, d=32, v=4096)
    t[::7] = -1
    for dtype in (torch.bfloat16, torch.float16):
        with torch.autocast("cpu", dtype=dtype):
            eager = loss_and_grads(lambda *a: chunked_cross_entropy(*a, chunk_size=96), h, w, t)
            compiled = loss_and_grads(lambda *a: compiled_loss(*a, chunk_size=96), h, w, t)
        for a, b in zip(eager, compiled):
            assert b.dtype == a.dtype
            assert ((b.double() - a.double()).norm() / a.double().norm()).item() < 1e-3


def test_compiled_chunk_body_has_no_graph_breaks_and_one_graph_serves_every_chunk_size():
    h, w, t = loss_inputs()
    logits = (h @ w.t()).detach()
    targets = t.unsqueeze(1)
    factors = torch.full_like(targets, 1 / 300, dtype=torch.float32)
    explanation = torch._dynamo.explain(chunked_loss._softmax_chunk)(logits, targets, factors, True, True,
                                                                    torch.float32)
    assert explanation.graph_count == 1 and explanation.graph_break_count == 0
    compiled = lambda n, chunk: chunks(h[:n], w, t[:n], chunk, fused=True)
    compiled(300, 64).backward()  # compiles (or reuses) the graph for fp32 with gradients
    with torch.compiler.set_stance('fail_on_recompile'):  # chunks of 64, 64, 22; then 50, 50, 50; then 90 and 7
        for n, chunk in ((150, 64), (150, 50), (97, 90)):
            compiled(n, chunk).backward()


def test_compiled_chunk_takes_the_rows_as_a_size_and_the_vocabulary_as_a_constant(monkeypatch):
    """The compiled chunk's graph (one for every chunk size, above) has the rows as a symbol and the vocabulary as
    the number it is, also after another vocabulary's: kernels compiled for a known row length (dynamic=True, or
    torch.compile's automatic dynamic after a second vocabulary, would make it a symbol, and every index in the
    kernels a division by an unknown)."""
    graphs, compile = [], torch.compile
    record = lambda graph, example_inputs: graphs.append(graph) or graph.forward  # the graph dynamo captured, run as is
    monkeypatch.setattr(torch, 'compile', lambda fn, **options: compile(fn, backend=record, **options))
    chunked_loss._compiled_softmax_chunk.cache_clear()
    torch._dynamo.reset()  # the graphs other vocabularies made before in this process: the chunk compiled afresh
    vocabularies = (300, 257)  # a second vocabulary stays a constant of its own graph: no size by changing
    try:
        for v in vocabularies:
            h, w, t = loss_inputs(v=v)
            chunks(h, w, t, 64, fused=True).backward()  # chunks of 64 rows, and the last of 44
    finally:
        chunked_loss._compiled_softmax_chunk.cache_clear()  # the next test's compiles with Inductor again
    assert len(graphs) == len(vocabularies)  # one graph a vocabulary, for all its chunk sizes
    for graph, v in zip(graphs, vocabularies):
        inputs = [node.meta['example_value'] for node in graph.graph.nodes if node.op == 'placeholder']
        rows, vocabulary = [value for value in inputs if isinstance(value, torch.Tensor)][0].shape  # the logits
        assert isinstance(rows, torch.SymInt) and type(vocabulary) is int and vocabulary == v


# FlashAttention's variable-length kernel, which attn_window and doc_token run on an Ampere or later GPU in bf16:
# compiled, here on the CPU kernels of flash_varlen_on_a_cpu.py; against attention under the mask, eager and compiled,
# with a window warmup's windows, on a CUDA GPU only (the GPU suite, `-m cuda`: skipped elsewhere)
AMPERE = torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 0)


def needs_ampere(test):
    """A test of the GPU suite that runs FlashAttention's variable-length kernel: on an Ampere or later GPU."""
    reason = 'needs an Ampere or later CUDA GPU (FlashAttention\'s variable-length kernel)'
    return pytest.mark.cuda(pytest.mark.skipif(not AMPERE, reason=reason)(test))


PACKED_GPT = dict(n_layer=2, n_head=4, n_embd=256, block_size=512, vocab_size=512, bias=False, pos_emb='rope',
                  qk_norm=True, attn_window=128, doc_token=3)


def packed_tokens(seed):
    """Two rows of 512 tokens on the GPU, a document starting at every 97th from 5 (doc_token 3 nowhere else)."""
    x = torch.randint(4, 512, (2, 512), generator=torch.Generator().manual_seed(seed))
    x[:, 5::97] = 3
    return x.cuda()


def bf16_loss_and_grads(model, x, y, window):
    """(loss, gradients) in fp32 of one forward-backward under bf16 autocast on x's device, with the sliding window."""
    with torch.autocast(x.device.type, dtype=torch.bfloat16):
        loss, grads = loss_and_gradients(model, x, y, attn_window=window)
    return loss.float(), [g.float() for g in grads]


def assert_bf16_close(a, b):
    """bf16 results of two kernels: each tensor within 2% of the other's norm."""
    for x, y in zip([a[0], *a[1]], [b[0], *b[1]]):
        assert ((x - y).norm() / y.norm()).item() < 2e-2


def test_compiled_flash_kernel_takes_any_window_and_documents_without_recompiling(flash_kernel):
    """As on an Ampere GPU in bf16 (Kernels(flash=True): the kernel's CPU stand-ins), compiled, the model runs torch's
    varlen_attn with a window warmup's windows and each batch's longest document as sizes, not constants: the first
    change of each compiles once more (dynamic from then on), then no window or batch compiles again, and every step
    computes what eager does."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=64, vocab_size=50, pos_emb='rope', qk_norm=True,
                          attn_window=32, doc_token=3), kernels=Kernels(flash=True))
    compiled = torch.compile(model)

    def step(window, every):  # documents every `every` tokens from the 3rd: the longest is `every` (or the last) long
        x = tokens_with_documents((2, 64), every, every=every)
        y = torch.randint(0, 50, (2, 64), generator=torch.Generator().manual_seed(every))
        with torch.autocast('cpu', dtype=torch.bfloat16):
            assert model.attention(x, torch.arange(64), None, window).kernel[1] is flash_kernel
        assert_bf16_close(bf16_loss_and_grads(compiled, x, y, window), bf16_loss_and_grads(model, x, y, window))

    step(4, 7)
    step(8, 11)
    with torch.compiler.set_stance('fail_on_recompile'):
        for window, every in ((12, 5), (20, 13), (64, 9), (4, 30)):
            step(window, every)


@needs_ampere
@pytest.mark.parametrize('window', [128, 4, 0])
def test_flash_varlen_kernel_matches_attention_under_the_mask(window):
    """Documents and a window (4: one key more or less would move a position's attention by a quarter), documents
    alone (0)."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(**PACKED_GPT), kernels=Kernels()).cuda()
    x, y = packed_tokens(1), packed_tokens(2)
    with torch.autocast('cuda', dtype=torch.bfloat16):  # the kernel runs, not the masked fallback
        assert attention.kind(model.attention(x, torch.arange(x.size(1), device='cuda'), None, window)) == 'varlen'
    kernel = bf16_loss_and_grads(model, x, y, window)
    masked = GPT(GPTConfig(**PACKED_GPT)).cuda()  # the same weights through blocked_attention
    masked.load_state_dict(model.state_dict())
    assert_bf16_close(kernel, bf16_loss_and_grads(masked, x, y, window))


@needs_ampere
def test_compiled_flash_varlen_kernel_follows_a_growing_window():
    """The windows of a warmup, one after the other: each compiled step computes what eager does at that window."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(**PACKED_GPT), kernels=Kernels()).cuda()
    compiled = torch.compile(model)
    x, y = packed_tokens(1), packed_tokens(2)
    for window in (32, 64, 96, 128):
        assert_bf16_close(bf16_loss_and_grads(compiled, x, y, window), bf16_loss_and_grads(model, x, y, window))


# The speedrun preset's model (config/speedrun_gpt2_12gb.py's keys: value_residual, qk_norm, x0_shortcut, U-net skips,
# soft-capped logits...), scaled down, with every weight random: zero_init_proj's zero head would make the loss ln(V)
# and every gradient below it zero, whatever attention computes. The kernel under bf16 autocast against the masked
# attention in fp32 may be off by as much as the masked attention under the same bf16 autocast is, a few times over.
# the window by position: FlashAttention's (the preset's, in blocks, runs the masked attention or FlexAttention)
SPEEDRUN_SCALED_DOWN = ['--n_layer=4', '--n_head=4', '--n_embd=256', '--block_size=512', '--attn_window=16',
                        '--attn_window_block=0', '--doc_token=3', '--init_from=scratch', '--hellaswag=False']
# the preset's window in blocks of 128, two of them: FlexAttention's
IN_BLOCKS = ['--attn_window=256', '--attn_window_block=128']
def speedrun_model(device, flash_kernel=False, flex_kernel=False, keys=()):
    """The scaled-down speedrun preset's GPT on `device` (vocabulary 512), its weights random: matrices at
    1/sqrt(fan-in), the lambdas and gains their initial values moved by N(0, 0.1). keys: more train.py keys."""
    with contextlib.redirect_stdout(io.StringIO()):
        config = configurator.load_config(configurator.train_keys(), [str(ROOT / 'config' / 'speedrun_gpt2_12gb.py'),
                                                                      *SPEEDRUN_SCALED_DOWN, *keys])
        model_args, _ = rules.model_args(at_depth(config), 512) # the record's value tables and layers at 4 blocks
    torch.manual_seed(0)
    model = GPT(GPTConfig(**model_args), kernels=Kernels(flash_kernel, flex_kernel))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * p.size(-1) ** -0.5 if p.dim() >= 2 else p + 0.1 * torch.randn_like(p))
    return model.to(device)


def named(results):
    """(loss, {index: gradient}) of helpers.loss_and_gradients' (loss, [gradients]), as the card's checks take them."""
    loss, gradients = results
    return loss.item(), dict(enumerate(gradients))


def kernel_against_masked(model, kind, run, x, y, window):
    """card_checks.compare's verdict on `model`'s attention of `kind` (run: model, or model compiled) under bf16
    autocast, against the masked attention of the same weights in fp32, with the masked attention's own bf16 error
    as the noise; the masked model's loss away from ln(V) and every gradient nonzero, so that the verdict can fail."""
    device = x.device.type
    with torch.autocast(device, dtype=torch.bfloat16):
        assert attention.kind(model.attention(x, torch.arange(x.size(1), device=device), None, window)) == kind
        kernel = loss_and_gradients(run, x, y, attn_window=window)
    torch._dynamo.reset()
    model.kernels = None  # the same weights through blocked_attention
    reference = loss_and_gradients(model, x, y, attn_window=window)
    assert abs(reference[0].item() - math.log(512)) > 0.1 and all(g.norm() > 0 for g in reference[1])
    with torch.autocast(device, dtype=torch.bfloat16):
        noisy = loss_and_gradients(model, x, y, attn_window=window)
    return card_checks.compare(named(kernel), named(reference), named(noisy), named(reference))


def varlen_against_masked(device, flash_kernel):
    """The speedrun model's loss and gradients through FlashAttention's kernel: FlashAttention rounds differently
    from the masked kernel (P in bf16), not worse by more."""
    model = speedrun_model(device, flash_kernel)
    x, y = (tokens_with_documents((2, 512), seed, every=97).to(device) for seed in (1, 2))
    return kernel_against_masked(model, 'varlen', model, x, y, 16)


def assert_kernel_within_bf16_noise(device, flash_kernel):
    verdict = varlen_against_masked(device, flash_kernel)
    assert verdict['passed'], verdict


@needs_ampere
def test_flash_varlen_kernel_computes_the_speedrun_models_masked_attention_within_bf16_noise():
    assert_kernel_within_bf16_noise('cuda', None)


def test_the_kernels_stand_in_computes_the_speedrun_models_masked_attention_within_bf16_noise(flash_kernel):
    """The GPU test above on the CPU stand-in: the tolerance holds where the kernel is right."""
    assert_kernel_within_bf16_noise('cpu', True)


def test_a_window_one_key_too_wide_is_beyond_bf16_noise(flash_kernel, monkeypatch):
    """The tolerance catches a kernel that lets each query see one key more than its window: a failed verdict, a
    gradient beyond the tolerance times its noise."""
    window_mask = flash_varlen_on_a_cpu.window_mask
    monkeypatch.setattr(flash_varlen_on_a_cpu, 'window_mask', lambda n_q, n_k, max_k, is_causal, left, right:
                        window_mask(n_q, n_k, max_k, is_causal, left + 1 if left >= 0 else left, right))
    verdict = varlen_against_masked('cpu', True)
    assert not verdict['passed']
    assert verdict['gradient_difference'] > verdict['tolerance'] * verdict['gradient_noise']


def assert_flex_within_bf16_noise(device, kernel_options, compiled, t):
    """FlexAttention's kernel (kernel_options; compiled: in the compiled model's graph) on rows of t tokens, within
    the card's tolerance of the masked attention's own bf16 error; the model scaled down with the preset's windows in
    blocks of 128."""
    model = speedrun_model(device, flex_kernel=True, keys=IN_BLOCKS)
    model.kernels.flex_options = kernel_options
    x, y = (tokens_with_documents((2, t), seed, every=97).to(device) for seed in (1, 2))
    verdict = kernel_against_masked(model, 'flex', torch.compile(model) if compiled else model, x, y, 256)
    assert verdict['passed'], verdict


CUDA = torch.cuda.is_available()
RTX_3060_SHARED_MEMORY = 101376  # a thread block's, opted in: what an RTX 30 or 40 series card gives FlexAttention


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason='needs a CUDA GPU (FlexAttention trains on CUDA only)')
@pytest.mark.parametrize('tiles', ["torch's", 'a consumer card\'s'])
@pytest.mark.parametrize('compiled', [False, True], ids=['flex compiled alone', 'in the compiled model'])
@pytest.mark.parametrize('t', [512, 448], ids=['whole blocks', 'a part of a block'])
def test_flex_kernel_computes_the_speedrun_models_masked_attention_within_bf16_noise(tiles, compiled, t):
    """On this GPU with torch's own tiles, and with the tiles an RTX 3060 gets (attention.flex_kernel_options)."""
    options = {}
    if tiles != "torch's":
        properties = torch.cuda.get_device_properties()
        consumer = type('Properties', (), dict(shared_memory_per_block_optin=RTX_3060_SHARED_MEMORY))
        options = attention.flex_kernel_options(consumer, 256 // 4)[0]
        assert options and properties.shared_memory_per_block_optin >= RTX_3060_SHARED_MEMORY
    assert_flex_within_bf16_noise('cuda', options, compiled, t)


def test_compiled_flex_forward_on_a_cpu_is_the_masked_forward():
    """FlexAttention's forward in the compiled model's graph (Inductor's CPU kernel, which takes whole blocks; a CPU
    has no backward for it): the masked attention's loss, in fp32, with documents and windows in blocks of 128, the
    window changed without compiling the graph again."""
    model = speedrun_model('cpu', flex_kernel=True, keys=IN_BLOCKS).eval()
    x, y = (tokens_with_documents((2, 512), seed, every=97) for seed in (1, 2))
    compiled = torch.compile(model)
    with torch.no_grad():
        assert attention.kind(model.attention(x, torch.arange(512), None, 256)) == 'flex'
        compiled(x, y, attn_window=384)
        compiled(x, y, attn_window=128)  # a second window compiles once more, the window's number dynamic from then on
        with torch.compiler.set_stance('fail_on_recompile'):
            _, flex = compiled(x, y, attn_window=256)
        torch._dynamo.reset()
        model.kernels = None
        _, masked = model(x, y, attn_window=256)
    assert flex.item() == pytest.approx(masked.item(), rel=1e-5)
