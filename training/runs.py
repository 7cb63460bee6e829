"""What train.py does differently for each model file it trains (the model_file key): model.py's GPT, on nanoGPT's
schedules and training/optim.py's optimizers, or gpt2026.py's GPT2026, on the training of modded-nanogpt's
single-GPU record of 24 Jan 2026 (training/record2026.py). A checkpoint's model_args name gpt2026.py's (model.py's
keep nanoGPT's model_args, without the key). train.py's loop, the memory estimator's trace and the tests take an
iteration through a run's methods, the same for both:
    lr = run.start_step(it)  # the schedule of iteration `it`: learning rates, momentum, window, rotary
    run.micro_steps(it) micro-batches, each model(X, Y, **run.forward_args(it)) with its loss's backward scaled by
    run.gradient_scale (None: 1 / the micro-steps), then the optimizer's step
    run.end_step(it)  # gpt2026.py's embedding split from its head after the update of SPLIT_STEP
Under torchrun, model.py's gradients are summed over the ranks by DDP (or fsdp), gpt2026.py's by its optimizer
(optimizer_sums_gradients).
"""
import numpy as np
import torch

import gpt2026
from training.chunked_loss import chunked_cross_entropy
from model import GPT, GPTConfig
from training import attention, record2026
from training.device import matmul_dtype
from training.documents import DocumentRows
from training.optim import describe, schedule_groups
from training.schedule import attn_window_at, scheduled_lr

GPT_FILE, RECORD_2026_FILE = 'model.py', 'gpt2026.py'
MODEL_FILES = (GPT_FILE, RECORD_2026_FILE)
# the record's bigram hash table: 5 rows a token of the vocabulary (251,520 for GPT-2's padded 50,304)
BIGRAM_ROWS_PER_TOKEN = 5


def model_file(model_args):
    """The model file of a checkpoint's model_args: nanoGPT's, and ours of model.py's GPT, name none."""
    return model_args.get('model_file', GPT_FILE)


def record_model_args(config, vocab_size):
    """model_args of a GPT2026 from scratch: GPT2026Config's arguments from config's keys, and the model file."""
    return dict(model_file=RECORD_2026_FILE, vocab_size=vocab_size,
                bigram_vocab_size=BIGRAM_ROWS_PER_TOKEN * vocab_size, n_head=config['n_head'],
                n_embd=config['n_embd'], doc_token=config['doc_token'])


def new_model(model_args, **options):
    """The model of model_args, of its model file's class, with that class's constructor options (GPT's through
    gpt_options)."""
    if model_file(model_args) == RECORD_2026_FILE:
        args = {key: value for key, value in model_args.items() if key != 'model_file'}
        return gpt2026.GPT2026(gpt2026.GPT2026Config(**args), **options)
    return GPT(GPTConfig(**model_args), **gpt_options(**options))


def gpt_options(flash_kernel=None, flex_kernel=None, loss_fn=None, **options):
    """GPT's constructor keywords in a run: training/attention.py's kernels (flash_kernel and flex_kernel: Kernels'
    flash and flex; None where each runs) and training/chunked_loss.py's loss (loss_fn None), with the other
    `options`."""
    loss_fn = chunked_cross_entropy if loss_fn is None else loss_fn
    return dict(kernels=attention.Kernels(flash_kernel, flex_kernel), loss_fn=loss_fn, **options)


def record_options(config, model_args, flash_kernel=None):
    """GPT2026's constructor options for config's run: its loss in chunks of loss_chunk_mib (3 fp32 buffers of
    vocab_size a row), and its attention: FlashAttention's variable-length kernel where attention.varlen_kernel
    runs it in config's dtype (flash_kernel None: on an Ampere or later GPU; True: on any device, as the estimator
    traces a CUDA run there) and attention_kernel is not 'masked', over the documents' segments (made once a forward);
    else gpt2026.attend, SDPA under a mask."""
    rows = int(config['loss_chunk_mib'] * 2 ** 20) // (3 * 4 * model_args['vocab_size'])
    options = dict(loss_chunk_rows=max(1, rows), attend=gpt2026.attend)
    if varlen_kernel_missing(config, model_args, flash_kernel) is None:
        # the segments looked up here, when the model is built: the memory estimator's trace replaces them
        options.update(attend=attention.window_document_attention, segments=attention.position_segments)
    return options


def varlen_kernel_missing(config, model_args, flash_kernel=None):
    """Why config's run computes its attention by position (gpt2026.py's; model.py's windows by position and
    documents) under a mask, in a few words, or None: FlashAttention's variable-length kernel runs it. gpt2026.py's
    attention_kernel='masked', or what the kernel needs and lacks (attention.varlen_missing)."""
    if config['model_file'] == RECORD_2026_FILE and config['attention_kernel'] == 'masked':
        return "attention_kernel='masked'"
    need = attention.varlen_missing(torch.device(config['device']), matmul_dtype(config),
                                    model_args['n_embd'] // model_args['n_head'], flash_kernel,
                                    dropout=config['dropout'] > 0)
    return None if need is None else f"FlashAttention's variable-length kernel needs {need}"


def optimizer_words(config):
    """The optimizer config's run steps, in a few words (estimate_memory.py's report)."""
    if config['model_file'] == RECORD_2026_FILE:
        return "the record's NorMuon for the blocks' matrices and Adam for the rest (training/record2026.py)"
    return describe(config['optim'], config['optimizer_in_backward'])


def has_activation_checkpointing(config):
    """Whether config's model file has activation checkpointing: model.py's GPT; gpt2026.py's record has none."""
    return config['model_file'] == GPT_FILE


def run_class(config):
    """The class of the runs of config's model file: GPTRun or GPT2026Run."""
    return GPT2026Run if config['model_file'] == RECORD_2026_FILE else GPTRun


def make_run(config, model, optimizer):
    """The run of config's model file, stepping `model` (unwrapped) with `optimizer`."""
    return run_class(config)(config, model, optimizer)


class GPTRun:
    """model.py's GPT: the lr of lr_schedule (learning_rate without decay_lr) in each group's proportion, Muon's
    momentum, the sliding window of attn_window (growing over attn_window_warmup_iters), gradient_accumulation_steps
    micro-steps an iteration, each loss a mean, its backward scaled by 1 / the micro-steps."""
    gradient_scale = None
    optimizer_sums_gradients = False  # under torchrun DDP (or fsdp) sums them in backward

    def __init__(self, config, model, optimizer):
        self.config, self.model, self.optimizer = config, model, optimizer
        # the iterations the memory estimator traces (the first allocates the optimizer's state): two where the
        # sliding window has grown to its largest
        self.traced_steps = (config['attn_window_warmup_iters'], config['attn_window_warmup_iters'] + 1)

    def micro_steps(self, it):
        """Micro-steps of iteration `it`, all ranks'."""
        return self.config['gradient_accumulation_steps']

    def window(self, it):
        """The sliding window of iteration `it`: attn_window (the model's: a checkpoint's on resume), or on its way
        there with attn_window_warmup_iters."""
        config = self.config
        return attn_window_at(it, self.model.config.attn_window, config['attn_window_warmup_start'],
                              config['attn_window_warmup_iters'], config['attn_window_warmup_end'])

    def start_step(self, it):
        config = self.config
        lr = scheduled_lr(it, config) if config['decay_lr'] else config['learning_rate']
        schedule_groups(self.optimizer, it, lr, config)  # optim='muon': each group's lr in proportion, its momentum
        return lr

    def forward_args(self, it, training=True):
        return dict(attn_window=self.window(it))

    def document_rows(self, path, block_size):
        """None: train.py's training rows are windows at any offset."""
        return None

    def end_step(self, it):
        """Nothing: model.py's GPT is the same model at every iteration."""

    def compiled_variants(self):
        """The forwards torch.compile may specialize: a window size is a shape of the masked attention, each may
        compile the model anew, in training and in evaluation (0: the default limit is enough)."""
        iters = self.config['attn_window_warmup_iters']
        return 2 * len({self.window(it) for it in range(iters + 1)}) + 2 if iters else 0

    def mfu(self, it, rows, dt, peak_flops):
        """Model flops utilization of an iteration of `rows` rows of block_size in dt seconds (GPT.estimate_mfu)."""
        return self.model.estimate_mfu(rows, dt, peak_flops, self.window(it))

    def summary(self):
        """The model's shape, as estimate_memory.py reports it."""
        shape = {k: getattr(self.model.config, k) for k in ('n_layer', 'n_head', 'n_embd', 'block_size', 'vocab_size',
                                                            'bias')}
        return dict(shape, n_params=self.model.get_num_params(non_embedding=False))


class GPT2026Run:
    """gpt2026.py's GPT2026 on the record's training: each iteration YaRN fits the rotary to the step's long window
    and NorMuonAdam takes its lrs, momentum and Adam's turn; the forward gets the step's windows and multi-token
    prediction weights (the final validation's longer window at NUM_ITERATIONS); the micro-steps are
    gradient_accumulation_steps over the first third and grow with the record's batch (x2, then x3) at the same
    micro-batch; each micro-batch's summed loss is scaled by GRADIENT_SCALE (the forward's mean times the micro-batch's
    tokens, so that the logged loss is per position); after SPLIT_STEP's update the embedding splits from the head."""
    optimizer_sums_gradients = True  # NorMuonAdam, under torchrun: no DDP wrapper (record2026.sum_over_processes)

    def __init__(self, config, model, optimizer):
        self.config, self.model, self.optimizer = config, model, optimizer
        # the iterations the memory estimator traces: the largest stage's first two, at the last batch size, where
        # Adam's step makes its state, then the embedding splits (its gradient, and Adam's state for it)
        self.traced_steps = (record2026.SPLIT_STEP, record2026.SPLIT_STEP + 1)
        self.gradient_scale = record2026.GRADIENT_SCALE * config['batch_size'] * config['block_size']

    def micro_steps(self, it):
        return self.config['gradient_accumulation_steps'] * record2026.batch_size_at(it) // record2026.BATCH_SIZES[0]

    def document_rows(self, path, block_size):
        """The DocumentRows of the token file at `path` that train.py's training rows are, as the record's: each from
        a document's start, its documents cut to MAX_DOCUMENT_TOKENS."""
        data = np.memmap(path, dtype=np.uint16, mode='r')
        return DocumentRows(data, self.model.config.doc_token, block_size, record2026.MAX_DOCUMENT_TOKENS, path)

    def start_step(self, it):
        self.model.fit_rotary(record2026.windows_at(it)[1])
        self.optimizer.schedule(it)
        return record2026.NORMUON_LR * record2026.lr_factor_at(it)  # the matrices' lr, the others' in proportion

    def forward_args(self, it, training=True):
        if not training:
            return dict(windows=record2026.windows_at(it, final_validation=it >= record2026.NUM_ITERATIONS))
        # a tensor, as the record's: its values change every step, which a compiled forward takes as inputs. Copied
        # from pinned memory without blocking: a blocking copy to a GPU waits for all the work queued before it
        device = self.model.lm_head.weight.device
        weights = torch.tensor(record2026.mtp_weights_at(it), pin_memory=device.type == 'cuda')
        weights = weights.to(device, non_blocking=True)
        return dict(windows=record2026.windows_at(it), mtp_weights=weights)

    def end_step(self, it):
        if it == record2026.SPLIT_STEP:
            record2026.split_embedding(self.model, self.optimizer)

    def compiled_variants(self):
        """The forwards torch.compile may specialize: each training one's windows, number of MTP weights and tie,
        and each evaluation's windows and tie."""
        steps = range(record2026.NUM_ITERATIONS + 1)
        training = {(record2026.windows_at(s), len(record2026.mtp_weights_at(s)), s <= record2026.SPLIT_STEP)
                    for s in steps}
        evaluation = {(self.forward_args(s, training=False)['windows'], s <= record2026.SPLIT_STEP) for s in steps}
        return len(training) + len(evaluation) + 2

    def mfu(self, it, rows, dt, peak_flops):
        """Model flops utilization of an iteration of `rows` rows in dt seconds: 6 flops a token for each weight of
        the matrix products (the blocks' and the head's), and attention's 12 a channel for each key a query sees (its
        layer's window, at most the row)."""
        short, long = record2026.windows_at(it)
        block_size, config = self.config['block_size'], self.model.config
        matrices = sum(p.numel() for name, p in self.model.named_parameters()
                       if name == 'lm_head.weight' or (name.startswith('transformer.h.') and p.dim() == 2))
        keys = sum(min(long if kind == 'long' else short, block_size) for kind, _ in config.layers if kind)
        return (6 * matrices + 12 * config.n_embd * keys) * rows * block_size / dt / peak_flops

    def summary(self):
        config = self.model.config
        return dict(n_layer=len(config.layers), n_head=config.n_head, n_embd=config.n_embd,
                    block_size=self.config['block_size'], vocab_size=config.vocab_size, bias=False,
                    n_params=sum(p.numel() for p in self.model.parameters()))
