"""training/opcount.py: the operators a training iteration dispatches, by part, under FakeTensorMode; GPT-2 124M at
batch 12 x 1024 with the chunked loss within 10% of nanoGPT's full logits, and train.py's bookkeeping no more than
nanoGPT's loop. Counting GPT-2's step takes a few seconds on a CPU: no memory, no arithmetic."""
import itertools

import pytest
import torch

from training.chunked_loss import chunk_rows, chunked_cross_entropy, one_piece_bytes
from helpers import gpt2_estimator_config, loss_inputs, tiny_gpt
from training.opcount import OVERHEAD, OperatorCounter, count_step
from training import runs
from training.card_measure import load_preset
from training.memory.estimate import random_batch
from training.step import Prefetcher, build, train_step


def counted(fn):
    with OperatorCounter() as counter:
        fn()
    return sum(counter.counts.values())


def test_counts_each_aten_operator_once_and_no_prim_ones():
    x = torch.ones(3)
    assert counted(lambda: (x + x).mul_(2).sum()) == 3
    assert counted(lambda: x.device) == 0


def test_gpt2_step_at_batch_12_within_10_percent_of_the_naive_loss():
    """The issue's check: 12 layers, GPT-2's vocabulary, bf16 autocast, forward, backward, clipping and the AdamW
    step at batch 12 x 1024: our loss in a few chunks of the default budget against nanoGPT's full logits."""
    config = gpt2_estimator_config(12, grad_clip=1.0)
    ours, naive = (count_step(config, loss).counts for loss in ('chunked', 'naive'))
    assert sum(ours.values()) <= 1.10 * sum(naive.values())
    assert {part: ours[part] for part in ours if part != 'loss'} == {part: naive[part] for part in naive
                                                                      if part != 'loss'}
    assert chunk_rows(12 * 1024, 50304, 768, torch.bfloat16) * 4 >= 12 * 1024  # at most 4 chunks


@pytest.mark.parametrize('accumulation, grad_clip', [(1, 1.0), (3, 1.0), (2, 0.0)])
def test_train_steps_bookkeeping_is_no_more_than_nanogpts(tiny, accumulation, grad_clip):
    """accumulation, clipping, the optimizer's step and the log line's read of the loss, on the same model and loss:
    train.py's train_step against nanoGPT's loop, which divides each micro-step's loss."""
    config = {**tiny, 'gradient_accumulation_steps': accumulation, 'grad_clip': grad_clip, 'dtype': 'bfloat16'}
    ours, nanogpt = (count_step(config, 'naive', loop).counts for loop in ('ours', 'nanogpt'))
    assert sum(ours[part] for part in OVERHEAD) <= sum(nanogpt[part] for part in OVERHEAD)
    assert ours['forward'] == nanogpt['forward'] and ours['clipping'] == nanogpt['clipping']
    # a micro-step: nanoGPT's loss / k and backward's seed; ours, the running mean and the seed 1/k
    assert ours['accumulation'] == nanogpt['accumulation'] == 2 * accumulation


def test_train_step_is_the_mean_loss_and_gradients_of_divided_micro_steps():
    """The seed gradient 1/k in place of nanoGPT's loss / k: the same SGD step and the mean micro-batch loss."""
    x, y = torch.randint(0, 50, (3, 4, 16)), torch.randint(0, 50, (3, 4, 16))
    model, reference = tiny_gpt(), tiny_gpt()
    batches = Prefetcher(iter([*zip(x, y), (x[0], y[0])]))  # and the batch fetched ahead of the next step
    loss, _ = train_step(model, torch.optim.SGD(model.parameters(), lr=1.0), batches, 3)
    losses = []
    for k in range(3):  # nanoGPT's micro-steps
        _, micro = reference(x[k], y[k])
        (micro / 3).backward()
        losses.append(micro.detach())
    torch.optim.SGD(reference.parameters(), lr=1.0).step()
    torch.testing.assert_close(loss, sum(losses) / 3)
    assert not loss.requires_grad
    for ours, expected in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(ours, expected)


def test_one_piece_dispatches_fewer_operators_than_one_chunk_and_equals_naive():
    """Where all rows fit the budget whole, the loss is nanoGPT's in one piece: fewer operators than the chunked
    path takes for one chunk of the same rows, and its loss and gradients are the naive loss's."""
    h, w, t = loss_inputs()
    t[::5] = -1
    whole = one_piece_bytes(300, 257, torch.float32)
    one_piece = counted(lambda: chunked_cross_entropy(h, w, t, chunk_bytes=whole).backward())
    one_chunk = counted(lambda: chunked_cross_entropy(h, w, t, chunk_bytes=whole - 1).backward())
    assert one_piece < one_chunk
    loss = chunked_cross_entropy(h, w, t, chunk_bytes=whole)
    grads = torch.autograd.grad(loss, (h, w))
    expected = torch.nn.functional.cross_entropy(h @ w.t(), t, ignore_index=-1)
    torch.testing.assert_close(loss, expected)
    for got, want in zip(grads, torch.autograd.grad(expected, (h, w))):
        torch.testing.assert_close(got, want)


def waits(fn, gpu='cpu'):
    with OperatorCounter(gpu) as counter:
        fn()
    return sum(counter.waits.values())


def test_counts_as_gpu_waits_the_operators_whose_result_the_cpu_reads():
    """The values (item, bool) and the sizes that depend on values (nonzero, a boolean mask's indexing, repeats in
    a tensor): each makes the CPU wait for a GPU. Their forms of known size, none. A 0-d CPU tensor in a GPU's
    operator is a number it takes, no copy."""
    x, mask, repeats = torch.arange(4.0), torch.tensor([True, False, True, True]), torch.tensor([1, 2, 0, 1])
    for wait in (lambda: x.sum().item(), lambda: bool(x.any()), lambda: x.nonzero(), lambda: x[mask],
                 lambda: x.clone().index_put_((mask,), torch.tensor(0.0)), lambda: x.repeat_interleave(repeats),
                 lambda: torch.unique(x), lambda: torch.equal(x, x)):
        assert waits(wait) == 1
    for no_wait in (lambda: x.sum(), lambda: x.masked_fill(mask, 0.0), lambda: x[torch.tensor([0, 2])],
                    lambda: x.repeat_interleave(2), lambda: x.repeat_interleave(repeats, output_size=4),
                    lambda: x.cumsum(0), lambda: x[1:3]):
        assert waits(no_wait) == 0
    # on the meta device standing for a GPU, the CPU's tensors are the host's: their values are at hand, and a
    # blocking copy between them and the GPU's waits
    gpu = torch.zeros(4, device='meta')
    for wait in (lambda: x.to('meta'), lambda: gpu.clone().copy_(x)):
        assert waits(wait, 'meta') == 1
    for no_wait in (lambda: x.to('meta', non_blocking=True), lambda: x.sum().item(), lambda: x.nonzero(),
                    lambda: gpu * torch.tensor(2.0), lambda: gpu.to(torch.float16)):
        assert waits(no_wait, 'meta') == 0


@pytest.mark.parametrize('preset', ['speedrun_gpt2_12gb', 'speedrun_gpt2_8gb'])
def test_a_speedrun_step_makes_the_cpu_wait_for_the_gpu_only_at_the_log_line(preset):
    """The speedrun presets' steps (their FlexAttention's block masks, chunked loss, Muon and Adam, as on CUDA): the
    CPU runs ahead of the GPU through every micro-step and the optimizer, and waits once, for the logged loss."""
    import estimate_memory
    config = {**estimate_memory.load_config([f'config/{preset}.py']), 'gradient_accumulation_steps': 2}
    counter = count_step(config)
    assert counter.counts['forward'] > 0 and counter.counts['optimizer'] > 0
    assert counter.waits == {**dict.fromkeys(counter.waits, 0), 'logging': 1}


@pytest.mark.parametrize('preset', ['speedrun_gpt2_12gb', 'speedrun2026_gpt2_12gb', 'train_gpt2_6gb'])
def test_an_iteration_on_a_gpu_copies_nothing_from_the_host_and_reads_nothing_back(preset, monkeypatch):
    """Two of train.py's iterations of the preset at the card's CPU scale, its run's schedule and forward arguments
    included, on the meta device standing for a GPU (the CPU's tensors for the host's): no blocking copy from the
    host (a rotary table made on the CPU, the step's MTP weights), no value read back. The optimizer is built as on
    a CPU (torch's fused AdamW has no meta kernel), and meta has no autocast."""
    config, _, model_args = load_preset(f'config/{preset}.py', tiny=True)
    is_autocast_enabled = torch.is_autocast_enabled
    monkeypatch.setattr(torch, 'is_autocast_enabled', lambda *device: device != ('meta',) and
                        is_autocast_enabled(*device))
    model, optimizer = build(config, model_args, 'meta', 'cpu')
    run = runs.make_run(config, model, optimizer)
    batches = Prefetcher(random_batch(config['batch_size'], config['block_size'], model_args['vocab_size'], 'meta')
                         for _ in itertools.count())
    with OperatorCounter(gpu='meta') as counter:
        for it in range(2):
            run.start_step(it)
            train_step(model, optimizer, batches, run.micro_steps(it), grad_clip=config['grad_clip'],
                       forward_args=run.forward_args(it), gradient_scale=run.gradient_scale)
            run.end_step(it)
    assert sum(counter.counts.values()) > 0 and sum(counter.waits.values()) == 0
