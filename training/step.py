"""train.py's model, optimizer and training step, as functions: train.py's loop, the memory estimator's trace, bench.py,
bench_optim.py and the tests all call these, so what they run, measure or estimate is the step train.py takes."""
from contextlib import nullcontext

import torch

from training import runs
from training.attention import flex_kernel_options, flex_probe
from training.checkpoint import load_model_state, pretrained_model
from training.device import TORCH_DTYPES, matmul_dtype
from training.errors import ConfigError
from training.optim import build_optimizer
from training.parallel import fsdp_param_dtype, shard_model, shard_optimizer_state
from training.record2026 import NorMuonAdam

NO_SCALER = torch.amp.GradScaler('cpu', enabled=False) # disabled: scale, unscale_ and update do nothing
# attention_kernel: how windows in blocks run, as Kernels' flex (None: FlexAttention where it runs)
ATTENTION_KERNELS = {'auto': None, 'flex': True, 'masked': False}


def build_model(config, model_args, checkpoint=None, **options):
    """train.py's model for `config`, on the CPU in config's weight_dtype (bf16 weights never exist there in fp32):
    the model of model_args (GPT, or GPT2026 for gpt2026.py's: training.runs.new_model) from scratch, with
    `checkpoint`'s weights if given, or the pretrained weights init_from names (cropped to model_args' block_size),
    its loss chunked within loss_chunk_mib. options: runs.gpt_options' keywords beyond config's (tools: loss_fn,
    flash_kernel, flex_kernel); GPT2026 takes flash_kernel alone (runs.record_options), having its own loss."""
    init_from = config['init_from']
    if runs.model_file(model_args) == runs.RECORD_2026_FILE:
        options = runs.record_options(config, model_args, options.get('flash_kernel'))
    else: # run-time, not model_args
        options = {'activation_checkpointing': config['activation_checkpointing'],
                   'loss_chunk_mib': config['loss_chunk_mib'],
                   'flex_kernel': ATTENTION_KERNELS[config['attention_kernel']], **options}
    if init_from in ('scratch', 'resume'):
        model = runs.new_model(model_args, **options)
        if checkpoint is not None:
            load_model_state(model, checkpoint, config['out_dir'])
    else: # only dropout can be overridden
        model = pretrained_model(init_from, config['dropout'], **options)
        if model_args['block_size'] < model.config.block_size: # crop down the block size, using model surgery
            model.crop_block_size(model_args['block_size'])
    weight_dtype = TORCH_DTYPES[config['weight_dtype']]
    if model.lm_head.weight.dtype != weight_dtype: # a fake model (the estimator's) is built in it: to() would swap
        model.to(weight_dtype)                     # its parameters, which the tracer's weakrefs forbid
    return model


def build(config, model_args, device, device_type, checkpoint=None, sharded=False, mesh=None, **options):
    """train.py's (model, optimizer): build_model's model moved to `device`, and config's optimizer for it, built as
    on `device_type` (fused AdamW on CUDA). sharded: under a process group of several ranks (the default one, or
    `mesh`), where parallelism='fsdp' shards the model and 'zero1' the optimizer's state."""
    model = build_model(config, model_args, checkpoint, **options)
    if model.lm_head.weight.device != torch.device(device): # as for the dtype: no to() where it would change nothing
        model.to(device)
    if torch.device(device).type == 'cuda' and (line := attention_by_position(config, model_args)):
        print(line)
    if runs.model_file(model_args) == runs.RECORD_2026_FILE: # the record's optimizer, whole on each process
        optimizer = NorMuonAdam(model)
        if sharded and config['parallelism'] == 'zero1':
            optimizer.shard() # or each its share, as the record's
        return model, optimizer
    if torch.device(device).type == 'cuda' and model.kernels.flex_runs(model.config, torch.device(device)):
        set_flex_options(model, config, device, torch.cuda.get_device_properties(device))
    if sharded and config['parallelism'] == 'fsdp': # before the optimizer, which must see the shards
        shard_model(model, mesh, param_dtype=fsdp_param_dtype(config)) # in place: the weights split over the ranks
    # AdamW (or the `optim` key's); with optimizer_in_backward, stepped by hooks as backward finishes each gradient
    optimizer = build_optimizer(model, config, device_type)
    if sharded and config['parallelism'] == 'zero1':
        optimizer = shard_optimizer_state(optimizer) # each rank keeps and steps the AdamW state of its share
    return model, optimizer


def attention_by_position(config, model_args, flash_kernel=None):
    """train.py's line on what computes the attention of windows by position and of documents, gpt2026.py's and
    model.py's without blocks (set_flex_options speaks for windows in blocks): FlashAttention's variable-length
    kernel, or the masked attention and why; None for a model without either. flash_kernel: varlen_kernel's."""
    by_position = not model_args.get('attn_window_block') and (model_args.get('attn_window') or
                                                                model_args.get('doc_token', -1) >= 0)
    if runs.model_file(model_args) != runs.RECORD_2026_FILE and not by_position:
        return None
    why = runs.varlen_kernel_missing(config, model_args, flash_kernel)
    what = 'the windows by position and the documents'
    if why is None:
        return f"attention: FlashAttention's variable-length kernel for {what}"
    return f'attention: the masked attention for {what}, slower and larger ({why})'


def set_flex_options(model, config, device, properties):
    """The FlexAttention kernel_options of model's windows in blocks on a GPU of `properties`: the first of
    attention.flex_kernel_options' whose probe (a forward and backward on two blocks) runs there. Where none does,
    attention_kernel='auto' runs the masked attention instead, saying why in a line; 'flex' is a ConfigError."""
    head_size = model.config.n_embd // model.config.n_head
    dtype = matmul_dtype(config)
    failures = []
    for options in flex_kernel_options(properties, head_size):
        failure = flex_probe(device, model.config.n_head, head_size, dtype, model.config.attn_window_block, options)
        if failure is None:
            model.kernels.flex_options = options
            tiles = ', '.join(f'{key}={value}' for key, value in options.items()) or "torch's own"
            print(f'attention: FlexAttention for the windows in blocks, kernel options: {tiles}')
            return
        failures.append(failure)
    if model.kernels.flex:
        raise ConfigError(f"attention_kernel='flex': FlexAttention does not run on this GPU ({failures[0]}): use "
                          f"--attention_kernel=auto or masked")
    print(f"attention: FlexAttention does not run on this GPU ({failures[0]}): the windows in blocks run the masked "
          f"attention (attention_kernel='masked'), slower")
    model.kernels.flex = False


class Prefetcher:
    """A run's micro-batches (X, Y), in the order `batches` iterates over them, each fetched one ahead of its use:
    nanoGPT's loop fetches the next batch while the GPU runs the forward. Between steps it holds the batch fetched
    ahead, which the next step takes: no caller keeps a step's first batch alive through the step."""

    def __init__(self, batches):
        self.batches = iter(batches)
        self.ahead = next(self.batches)

    def take(self):
        batch, self.ahead = self.ahead, None
        return batch

    def fetch(self):
        self.ahead = next(self.batches)
        return self.ahead


def train_step(model, optimizer, batches, accumulation, ctx=nullcontext(), scaler=None, grad_clip=0.0,
               set_sync=None, forward_args=None, gradient_scale=None):
    """One iteration of train.py: `accumulation` micro-steps of forward and backward on the micro-batches of
    `batches` (a Prefetcher), each loss scaled by gradient_scale (None: 1/accumulation), then clipping at grad_clip
    (0: none), the optimizer's step through the GradScaler (fp16; None: none) and the gradients freed (those the
    optimizer keeps for its next step aside). With optimizer_in_backward the step ran in backward and there is none
    left. forward_args: the model's keywords beyond X and Y (a run's forward_args: model.py's attn_window, gpt2026.py's
    windows and MTP weights; None: none). set_sync(last): under DDP or fsdp, whether the next backward reduces the
    gradients over the ranks: only on the last micro-step. Returns the mean micro-batch loss as a tensor on the
    device (no sync) and the gradient norm before clipping (None without clipping)."""
    scaler = scaler or NO_SCALER
    forward_args = forward_args or {}
    gradient_scale = 1 / accumulation if gradient_scale is None else gradient_scale
    X, Y = batches.take() # fetched during the step before
    loss_sum = None # the mean micro-batch loss, kept on the device: no sync
    for micro_step in range(accumulation):
        if set_sync is not None:
            set_sync(micro_step == accumulation - 1)
        with ctx:
            logits, loss = model(X, Y, **forward_args) # logits is None: never built when given targets
        with torch.no_grad(): # outside the graph: no detach
            loss_sum = loss / accumulation if loss_sum is None else loss_sum.add_(loss, alpha=1 / accumulation)
        # immediately async prefetch next batch while model is doing the forward pass on the GPU
        X, Y = batches.fetch()
        # backward pass, with gradient scaling if training in fp16, of loss * gradient_scale: seeded with it where
        # backward would seed ones_like(loss), rather than nanoGPT's division, an operator (a kernel launch) more
        seed = None if gradient_scale == 1 else torch.full_like(loss, gradient_scale)
        scaler.scale(loss).backward(seed)
        del loss, seed # not kept through the next micro-step's forward: loss_sum holds the loss's value
    # clip the gradient
    grad_norm = None
    if grad_clip != 0.0:
        scaler.unscale_(optimizer)
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip) # before clipping, unscaled
    # step the optimizer and scaler if training in fp16
    scaler.step(optimizer)
    scaler.update()
    # flush the gradients as soon as we can, no need for this memory anymore
    optimizer.zero_grad(set_to_none=True)
    return loss_sum, grad_norm
