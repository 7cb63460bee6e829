"""bench.py --mode=card's checks: each path a GPU run takes against its reference, on one model and batch, under bf16
autocast: the compiled model against eager, FlashAttention's variable-length kernel and FlexAttention's kernel (with
this GPU's tiles, and with the tiles a consumer card gets) against the masked attention, bf16 weights (stochastic
rounding) against fp32 weights over a few AdamW steps. Each compares the loss and every
parameter's gradient, and takes its tolerance from the noise it measures itself: the reference path under bf16
autocast against the same path in fp32. A path passes where no quantity differs by more than NOISE_MULTIPLE times
that noise.

The model is never the one a run starts from: zero-initialized projections and head (zero_init_proj) give ln(V)
whatever attention computes, and no gradient below the head. randomize() redraws its weights first, so that the loss
and every gradient depend on every path compared."""
import contextlib
import io
import itertools
import math
import statistics
import types

import torch

from training import attention, step
from training.optim import build_optimizer
from training.schedule import scheduled_window

NOISE_MULTIPLE = 4 # a path passes within this many times its reference's own bf16 noise
# the least noise a quantity is given, relative: a 16th of one bf16 rounding (2^-8), so that the reference's two
# precisions agreeing by chance on one quantity does not make its tolerance zero
NOISE_FLOOR = 2 ** -12
CHECK_STEPS = 8 # AdamW steps of bf16 weights against fp32 weights
CHECK_DTYPE = 'bfloat16' # the checks' autocast dtype: the speedrun presets' on a GPU, and what the CPU has too


def randomize(model, seed=0):
    """Every matrix and embedding of `model` redrawn from N(0, 1 / its last dimension): unit-RMS outputs of a linear
    layer from unit-RMS inputs, so logits of about unit scale (a loss away from ln(V)) and every block's output in
    the residual stream; gains, biases and scalars keep their initial values."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=generator) / math.sqrt(p.shape[-1]))
    return model


def first_window(config):
    """The sliding window of a run's first step (0: none): the window every check runs at, where one off by one shows
    most and the fp32 reference's masked attention (a block of window x 2 window scores a query block) needs the
    least memory."""
    return scheduled_window(0, config)


def check_model(config, model_args, device, **options):
    """The config's model, randomized, on `device`, in fp32 weights (the checks cast by autocast)."""
    model = step.build_model(dict(config, weight_dtype='float32'), model_args, **options)
    return randomize(model).to(device)


def check_batch(config, vocab_size, device, seed=0):
    """(x, y): one micro-batch of random tokens, a document token every third of a row where the model has one."""
    generator = torch.Generator().manual_seed(seed)
    shape = (config['batch_size'], config['block_size'])
    x, y = (torch.randint(vocab_size, shape, generator=generator) for _ in range(2))
    if config['doc_token'] >= 0:
        x[:, ::max(1, config['block_size'] // 3)] = config['doc_token']
    return x.to(device), y.to(device)


def autocast(dtype, device_type, cache_enabled=True):
    """bf16 or fp16 autocast (cache_enabled: train.py's autocast_cache), or none for 'float32'."""
    if dtype == 'float32':
        return contextlib.nullcontext()
    return torch.autocast(device_type, dtype=getattr(torch, dtype), cache_enabled=cache_enabled)


def loss_and_gradients(run, model, batch, window, dtype, device_type):
    """(loss, {name: gradient in fp32}) of one forward and backward of run (model, or model compiled) on batch."""
    model.zero_grad(set_to_none=True)
    with autocast(dtype, device_type):
        _, loss = run(*batch, attn_window=window)
    loss.backward()
    return loss.item(), {name: p.grad.float().clone() for name, p in model.named_parameters() if p.grad is not None}


def relative(a, b, scale):
    """|a - b| / |scale| for numbers, the same with norms for tensors."""
    if isinstance(a, float):
        return abs(a - b) / max(abs(scale), 1e-30)
    return ((a - b).norm() / scale.norm().clamp(min=1e-30)).item()


def compare(path, reference, noisy, exact, judged=lambda gradient: True):
    """The check's verdict from (loss, gradients) pairs: `path` against `reference`, with `noisy` (the reference
    under bf16) against `exact` (the reference in fp32) as the noise. Each quantity relative to its exact value; the
    gradients that judged(exact gradient) rejects are reported (unjudged_difference, the largest) but pass.

    A gradient's noise is one sample. A matrix's is a norm over many elements and steady; a scalar's or a vector's
    (a sum over every position, which cancels) is not: on an H200 the speedrun model's lambdas scattered from 0.2x
    to 5x their own noise under a correct kernel while every matrix sat within 1.1x. So matrices (2+ dimensions) are
    judged one by one, and the scalars and vectors together: the root mean square of their differences against that
    of their noises. No noise is taken below the median parameter's: precisions can agree on one by chance."""
    (loss, grads), (ref_loss, ref_grads), (noisy_loss, noisy_grads), (exact_loss, exact_grads) = \
        path, reference, noisy, exact
    if set(grads) != set(ref_grads):
        raise AssertionError(f'the compared paths give gradients to different parameters: '
                             f'{sorted(set(grads) ^ set(ref_grads))}')
    loss_difference = relative(loss, ref_loss, exact_loss)
    loss_noise = max(relative(noisy_loss, exact_loss, exact_loss), NOISE_FLOOR)
    gradients = {name: [relative(grad, ref_grads[name], exact_grads[name]),
                        relative(noisy_grads[name], exact_grads[name], exact_grads[name])]
                 for name, grad in grads.items()} # each parameter's [difference, noise]: the report's JSON keeps them
    least_noise = max(NOISE_FLOOR, statistics.median(noise for _, noise in gradients.values()))
    judged_names = [name for name in grads if judged(exact_grads[name])]
    unjudged = max([gradients[name][0] for name in grads if name not in judged_names], default=0.0)
    quantities = [(name, *gradients[name]) for name in judged_names if grads[name].dim() >= 2]
    pooled = [gradients[name] for name in judged_names if grads[name].dim() < 2]
    if pooled:
        root_mean_square = lambda values: math.sqrt(sum(v * v for v in values) / len(values))
        quantities.append((f'{len(pooled)} scalars and vectors, pooled', *map(root_mean_square, zip(*pooled))))
    # (difference / noise, name, difference, noise) of the quantity furthest out, relative to its noise
    ratio, parameter, gradient_difference, gradient_noise = max(
        (difference / max(noise, least_noise), name, difference, max(noise, least_noise))
        for name, difference, noise in quantities)
    return dict(loss=loss, reference_loss=ref_loss, loss_difference=loss_difference, loss_noise=loss_noise,
                gradient_parameter=parameter, gradient_difference=gradient_difference, gradient_noise=gradient_noise,
                parameters=len(grads), unjudged_difference=unjudged, tolerance=NOISE_MULTIPLE, gradients=gradients,
                passed=loss_difference <= NOISE_MULTIPLE * loss_noise and ratio <= NOISE_MULTIPLE)


def check_compiled(config, model_args, device, device_type):
    """The model compiled against eager, both under bf16 autocast; the noise: eager under bf16 against eager in
    fp32."""
    torch.manual_seed(0)
    model = check_model(config, model_args, device)
    batch = check_batch(config, model_args['vocab_size'], device)
    window = first_window(config) or None
    eager = loss_and_gradients(model, model, batch, window, CHECK_DTYPE, device_type)
    exact = loss_and_gradients(model, model, batch, window, 'float32', device_type)
    compiled = loss_and_gradients(torch.compile(model), model, batch, window, CHECK_DTYPE, device_type)
    torch._dynamo.reset()
    return compare(compiled, eager, eager, exact)


def kernel_registered_on_cpu():
    """Whether FlashAttention's variable-length kernel has CPU kernels registered for its operator (the tests' stand-in,
    flash_varlen_on_a_cpu.py): a bare CPU has none, as the kernel is CUDA only."""
    if attention.flash_varlen_attn() is None:
        return False
    from torch.nn.attention import varlen
    return torch._C._dispatch_has_kernel_for_dispatch_key(varlen._varlen_attn._qualname, 'CPU')


def check_varlen(config, model_args, device, device_type):
    """FlashAttention's variable-length kernel against the masked attention of the same weights, both under bf16
    autocast; the noise: the masked attention under bf16 against fp32. The kernel's window is by position: a window
    in blocks (attn_window_block, the records' block masks, which the masked attention runs) is checked by position.
    Skipped, with the reason, where the model does not run the kernel."""
    if device_type != 'cuda' and not kernel_registered_on_cpu():
        return dict(skipped="FlashAttention's kernel is CUDA only (the tests give a CPU stand-in)")
    window = first_window(config)
    model_args = dict(model_args, attn_window_block=0)
    # CUDA: the kernel where it runs, as in a run; a CPU: the stand-in registered for it (flash_kernel=True)
    varlen = check_model(config, model_args, device, flash_kernel=None if device_type == 'cuda' else True)
    masked = check_model(config, model_args, device, flash_kernel=False)
    batch = check_batch(config, model_args['vocab_size'], device)
    positions = torch.arange(batch[0].size(1), device=device)
    with autocast(CHECK_DTYPE, device_type):
        if attention.kind(varlen.attention(batch[0], positions, None, window)) != 'varlen':
            return dict(skipped="the model does not run the kernel here (its GPU, head size or window)")
    args = (batch, window or None)
    return compare(loss_and_gradients(varlen, varlen, *args, CHECK_DTYPE, device_type),
                   *(loss_and_gradients(masked, masked, *args, dtype, device_type)
                     for dtype in (CHECK_DTYPE, CHECK_DTYPE, 'float32')))


# the shared memory a thread block of an RTX 30 or 40 series card may use: the tiles FlexAttention gets there
CONSUMER_SHARED_MEMORY = 101376
FLEX_WINDOW_BLOCKS = 4 # the flex checks' window: full blocks and partial ones, and a masked fp32 reference that fits


def flex_against_masked(config, model_args, device, device_type, kernel_options):
    """FlexAttention's kernel with kernel_options against the masked attention of the same weights, both under bf16
    autocast, at a window of FLEX_WINDOW_BLOCKS blocks (or the config's, if shorter); the noise: the masked attention
    under bf16 against fp32."""
    block = model_args['attn_window_block']
    window = min(model_args['attn_window'], FLEX_WINDOW_BLOCKS * block)
    flex = check_model(config, model_args, device, flex_kernel=True)
    flex.kernels.flex_options = kernel_options
    masked = check_model(config, model_args, device, flex_kernel=False)
    batch = check_batch(config, model_args['vocab_size'], device)
    positions = torch.arange(batch[0].size(1), device=device)
    if attention.kind(flex.attention(batch[0], positions, None, window)) != 'flex':
        return dict(skipped='the model does not run FlexAttention (its blocks, head size or rows)')
    return compare(loss_and_gradients(flex, flex, batch, window, CHECK_DTYPE, device_type),
                   *(loss_and_gradients(masked, masked, batch, window, dtype, device_type)
                     for dtype in (CHECK_DTYPE, CHECK_DTYPE, 'float32')))


def check_flex(config, model_args, device, device_type, shared_memory=None):
    """flex_against_masked with the tiles attention.flex_kernel_options picks for this GPU, or for a GPU of
    `shared_memory` bytes a block (forced here: an H100 compiles and runs what an RTX 3060 would). Skipped where
    FlexAttention does not train (a CPU) or the model has no windows in blocks."""
    if device_type != 'cuda':
        return dict(skipped='FlexAttention trains on CUDA only (the tests run it on a CPU stand-in)')
    if not model_args.get('attn_window_block'):
        return dict(skipped='the model has no windows in blocks')
    properties = torch.cuda.get_device_properties(device)
    if shared_memory is not None:
        properties = types.SimpleNamespace(shared_memory_per_block_optin=shared_memory)
    head_size = model_args['n_embd'] // model_args['n_head']
    options = attention.flex_kernel_options(properties, head_size)[0]
    return dict(flex_against_masked(config, model_args, device, device_type, options), kernel_options=options)


def trained(config, model_args, device, device_type, batch, weight_dtype, dtype):
    """From the randomized weights in weight_dtype under `dtype`: (the loss and gradients on `batch`, then the losses
    of CHECK_STEPS AdamW steps on it)."""
    keys = dict(config, weight_dtype=weight_dtype, dtype=dtype, optim='adamw', optimizer_in_backward=False)
    torch.manual_seed(0)
    model = check_model(config, model_args, device).to(getattr(torch, weight_dtype))
    window = first_window(config) or None
    first = loss_and_gradients(model, model, batch, window, dtype, device_type)
    with contextlib.redirect_stdout(io.StringIO()): # the optimizer's description, once a build
        optimizer = build_optimizer(model, keys, device_type)
    batches = step.Prefetcher(itertools.repeat(batch))
    return first, [step.train_step(model, optimizer, batches, 1, autocast(dtype, device_type),
                                   grad_clip=config['grad_clip'], forward_args=dict(attn_window=window))[0].item()
                   for _ in range(CHECK_STEPS)]


def check_bf16_weights(config, model_args, device, device_type):
    """bf16 weights against fp32 weights, both under bf16 autocast, from the same randomized weights: the loss and
    every gradient of the first step (the weights' rounding), then the losses of CHECK_STEPS AdamW steps (the
    update's stochastic rounding: one rounded to nearest loses the updates below half a bf16 step); the noise: the
    fp32 weights' run under bf16 against the same in fp32, the largest over the steps for the losses. The scalars'
    gradients are not judged at the first step: with bf16 weights they are bf16 sums over every position (autocast
    keeps fp32 weights' elementwise products in fp32), tens of times the noise by design; the steps' losses judge
    their updates."""
    batch = check_batch(config, model_args['vocab_size'], device)
    runs = [trained(config, model_args, device, device_type, batch, weight_dtype, dtype)
            for weight_dtype, dtype in (('bfloat16', CHECK_DTYPE), ('float32', CHECK_DTYPE), ('float32', 'float32'))]
    (bf16, bf16_losses), (fp32, fp32_losses), (exact, exact_losses) = runs
    verdict = compare(bf16, fp32, fp32, exact, judged=lambda gradient: gradient.dim() >= 2)
    step_difference = max(relative(a, b, e) for a, b, e in zip(bf16_losses, fp32_losses, exact_losses))
    step_noise = max(NOISE_FLOOR, *(relative(b, e, e) for b, e in zip(fp32_losses, exact_losses)))
    verdict.update(bf16_losses=bf16_losses, fp32_losses=fp32_losses, step_difference=step_difference,
                   step_noise=step_noise,
                   passed=verdict['passed'] and step_difference <= NOISE_MULTIPLE * step_noise)
    return verdict


CHECKS = (('compiled against eager', check_compiled), ('varlen kernel against masked', check_varlen),
          ('flex kernel against masked', check_flex),
          ('flex, consumer tiles, against masked',
           lambda *args: check_flex(*args, shared_memory=CONSUMER_SHARED_MEMORY)),
          ('bf16 weights against fp32', check_bf16_weights))
