"""
train.py's `optim` key (adamw, adamw_bf16, adamw_8bit, muon), `weight_dtype` and `optimizer_in_backward`: what each
needs and refuses (one-line ConfigErrors), the parameter groups (Muon's matrices, AdamW's rest, their learning rates)
and their schedule, and the optimizer built from them (the classes: training/optimizers.py).
"""
import contextlib
import logging

import torch

from training.errors import ConfigError
from training.optimizers import (MUON_MOMENTUM_FORMS, AdamWBF16, MuonAdamW, OptimizerInBackward, SlicedAdamW,
                                 torchao_adamw8bit)

OPTIMS = ('adamw', 'adamw_bf16', 'adamw_8bit', 'muon')


@contextlib.contextmanager
def _errors_only(*logger_names):
    """Silence the named loggers' warnings for the duration. torchao's first import warns about each of its compiled
    extensions that does not load (e.g. 'Failed to load ..._C_mxfp8.cpython-310-...so' under another Python or a
    CPU build of torch), and torch's pytree warns about torchao's enum registration; its 8-bit AdamW is plain PyTorch
    and needs none of them, so those lines would only alarm. Errors still show."""
    loggers = [logging.getLogger(name) for name in logger_names]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def require(optim):
    """Check that `optim` is known and its library imports; ConfigError otherwise. Importing torchao here, before a
    checkpoint is loaded, also registers its 8-bit state class with torch.load(weights_only=True)."""
    if optim not in OPTIMS:
        raise ConfigError(f"unknown optim {optim!r}: use one of {', '.join(OPTIMS)}")
    if optim == 'adamw_8bit':
        try:
            with _errors_only('torchao', 'torch.utils._pytree'):
                import torchao.optim  # noqa: F401  imported only when selected: an optional dependency
        except ImportError as e:
            raise ConfigError(f"optim='adamw_8bit' needs torchao ({e}): pip install torchao, or use "
                              f"--optim=adamw_bf16") from None
    if optim == 'muon' and not hasattr(torch.optim, 'Muon'):
        raise ConfigError(f"optim='muon' needs torch.optim.Muon, new in torch 2.9 (this is torch {torch.__version__}): "
                          f"pip install -U torch, or use --optim=adamw")


def check_config(config, world_size):
    """ConfigError, one line naming the key, the value and the fix, for an optimizer hyperparameter out of range, an
    `optim` that cannot run here, or an optimizer_in_backward=True combined with what it cannot honour (see
    OptimizerInBackward)."""
    check_hyperparameters(config)
    require(config['optim'])
    if config['optim'] == 'muon':
        check_muon(config, world_size)
    check_weight_dtype(config, world_size)
    if config['optimizer_in_backward']:
        check_in_backward(config, world_size)


def check_hyperparameters(config):
    """ConfigError for a learning rate, beta, weight decay or clipping norm that AdamW (or Muon) cannot use: torch's
    optimizers refuse some with a traceback at the first step, and a negative weight_decay or grad_clip would train
    silently in the wrong direction."""
    if config['learning_rate'] <= 0:
        raise ConfigError(f"learning_rate must be positive, got {config['learning_rate']}: e.g. "
                          f"--learning_rate=6e-4")
    for key, example in (('beta1', 0.9), ('beta2', 0.95)):
        if not 0.0 <= config[key] < 1.0:
            raise ConfigError(f"{key} is a moment's decay rate in [0, 1), got {config[key]}: e.g. --{key}={example}")
    if config['weight_decay'] < 0:
        raise ConfigError(f"weight_decay must be 0 or more, got {config['weight_decay']}: e.g. --weight_decay=0.1, "
                          f"or 0 for none")
    if config['grad_clip'] < 0:
        raise ConfigError(f"grad_clip is a norm, 0 or more, got {config['grad_clip']}: e.g. --grad_clip=1.0, "
                          f"or 0 for no clipping")


def check_in_backward(config, world_size):
    """ConfigError listing every key optimizer_in_backward=True conflicts with, and each fix, in one line: the
    process count first, the one that explains the others under torchrun."""
    conflicts = []
    if world_size != 1:
        conflicts.append(f'{world_size} processes (each would step before the gradients are averaged across them): '
                         f'run one process, without torchrun')
    accumulation = config['gradient_accumulation_steps']
    if accumulation != 1:
        conflicts.append(f'gradient_accumulation_steps={accumulation} (it steps during each backward, so it cannot '
                         f'accumulate micro-batches): use --gradient_accumulation_steps=1, a larger --batch_size '
                         f'keeps the tokens per step')
    if config['grad_clip'] != 0.0:
        conflicts.append(f"grad_clip={config['grad_clip']} (no global norm exists until every gradient does): "
                         f"use --grad_clip=0.0")
    if config['dtype'] == 'float16':
        conflicts.append("dtype='float16' (it would step before GradScaler unscales the gradients and skips "
                         "overflowing steps): use --dtype=bfloat16 or float32")
    if config.get('auto_batch_size'):
        conflicts.append('auto_batch_size=True (the batch search may pick gradient_accumulation_steps > 1): set '
                         '--batch_size yourself or --auto_batch_size=False')
    if conflicts:
        raise ConfigError(f"optimizer_in_backward=True conflicts with {'; and with '.join(conflicts)}; "
                          f"or use --optimizer_in_backward=False")


def check_muon(config, world_size):
    """ConfigError for optim='muon' keys out of range, and for fsdp, which splits the matrices Muon orthogonalizes."""
    if config['parallelism'] == 'fsdp' and world_size > 1:
        raise ConfigError("optim='muon' orthogonalizes each whole weight matrix, which parallelism='fsdp' splits over "
                          "the processes: use --parallelism=zero1 (Muon's state is sharded there too) or ddp, or "
                          "another --optim with fsdp")
    if config['muon_learning_rate'] < 0:
        raise ConfigError(f"muon_learning_rate must be 0 or more, got {config['muon_learning_rate']}: e.g. "
                          f"--muon_learning_rate=0.02")
    if not 0.0 <= config['muon_momentum'] < 1.0:
        raise ConfigError(f"muon_momentum must be in [0, 1), got {config['muon_momentum']}: e.g. --muon_momentum=0.95")
    for key in MUON_ONLY_KEYS:
        if config.get(key, 0) < 0:
            raise ConfigError(f"{key} must be 0 or more, got {config[key]}: e.g. --{key}=0 (the default)")


# keys that only optim='muon' reads; 0, their default (and what a tool without them gets), changes nothing
MUON_ONLY_KEYS = ('muon_momentum_warmup_iters', 'embedding_learning_rate', 'head_learning_rate', 'scalar_learning_rate',
                  'muon_split_qkv')
# Muon's momentum at iteration 0 with muon_momentum_warmup_iters: nanochat's base_train.py get_muon_momentum (and
# modded-nanogpt's records) raise it linearly from 0.85 to 0.95 over the first 300 iterations
MUON_MOMENTUM_START = 0.85

WEIGHT_DTYPES = ('float32', 'bfloat16')


def check_weight_dtype(config, world_size):
    """ConfigError for a weight_dtype this project cannot train with the rest of config."""
    weight_dtype = config['weight_dtype']
    if weight_dtype not in WEIGHT_DTYPES:
        raise ConfigError(f"unknown weight_dtype {weight_dtype!r}: use one of {', '.join(WEIGHT_DTYPES)}")
    if weight_dtype == 'float32':
        return
    if config['dtype'] != 'bfloat16':
        raise ConfigError(f"weight_dtype='bfloat16' trains in bf16, not dtype={config['dtype']!r}: use "
                          f"--dtype=bfloat16 (Ampere or later), or --weight_dtype=float32")
    if config['optim'] == 'muon':
        raise ConfigError("weight_dtype='bfloat16' needs an update rounded stochastically, which torch's Muon does "
                          "not do: use --optim=adamw, adamw_bf16 or adamw_8bit, or --weight_dtype=float32")
    if config['parallelism'] == 'fsdp' and world_size > 1:
        raise ConfigError("weight_dtype='bfloat16' is not supported with parallelism='fsdp': use zero1 or ddp, or "
                          "--weight_dtype=float32 (fsdp's own --fsdp_mixed_precision=True gathers in bf16)")


def describe(optim, optimizer_in_backward=False):
    """A few words for estimate_memory.py's report."""
    text = {'adamw': 'fused AdamW', 'adamw_bf16': 'AdamW with bf16 moments', 'adamw_8bit': "torchao's 8-bit AdamW",
            'muon': "Muon for the blocks' matrices, fused AdamW for the rest"}
    return text[optim] + (' stepped in backward' if optimizer_in_backward else '')


def optimizer_class(optim, weight_dtype='float32'):
    """The class of the optimizer `optim` for weights of `weight_dtype`, built by model.configure_optimizers as
    class(groups, lr=, betas=); None for 'adamw' on fp32 weights, which configure_optimizers builds itself (torch's,
    fused on CUDA, as nanoGPT). On bf16 weights every update is rounded stochastically (torch's AdamW would round to
    nearest, and keep its moments in bf16)."""
    require(optim)
    bf16_weights = weight_dtype == 'bfloat16'
    if optim == 'adamw_bf16':
        return AdamWBF16
    if optim == 'adamw_8bit':
        return torchao_adamw8bit(bf16_weights)
    return SlicedAdamW if bf16_weights else None


def build_optimizer(model, config, device_type):
    """train.py's optimizer for `model`: configure_optimizers' parameter groups (muon: muon_param_groups'), config's
    optim, and stepped in backward with optimizer_in_backward (ZeRO, under zero1, wraps it after:
    parallel.shard_optimizer_state)."""
    betas = (config['beta1'], config['beta2'])
    if config['optim'] == 'muon':
        optimizer = MuonAdamW(muon_param_groups(model, config), betas=betas,
                              fused=True if device_type == 'cuda' else None)  # as configure_optimizers' AdamW
    else:
        optimizer = model.configure_optimizers(config['weight_decay'], config['learning_rate'], betas, device_type,
                                               optimizer_class(config['optim'], config['weight_dtype']))
    if config['optim'] != 'adamw':
        print(f"using {config['optim']}")
    return OptimizerInBackward(optimizer) if config['optimizer_in_backward'] else optimizer


def group_lr(group, lr, config):
    """The learning rate of `group` at an iteration whose scheduled learning_rate is `lr`: the groups of optim='muon'
    follow the same schedule, scaled to their own peak: muon_learning_rate for the Muon groups, and
    embedding_learning_rate, head_learning_rate or scalar_learning_rate, where set (not 0), for the groups
    muon_param_groups marks so."""
    if group.get('muon'):
        return lr * config['muon_learning_rate'] / config['learning_rate']
    peak = config.get(group.get('lr_key'), 0.0)
    return lr * peak / config['learning_rate'] if peak else lr


def muon_momentum_at(it, config):
    """Muon's momentum at iteration `it`: from MUON_MOMENTUM_START up to muon_momentum, linearly over the first
    muon_momentum_warmup_iters iterations (0: muon_momentum throughout)."""
    warmup = config.get('muon_momentum_warmup_iters', 0)
    frac = min(it / warmup, 1.0) if warmup > 0 else 1.0
    return (1 - frac) * MUON_MOMENTUM_START + frac * config['muon_momentum']


def schedule_groups(optimizer, it, lr, config):
    """Set what train.py schedules at iteration `it`, whose learning_rate is `lr`: each group's lr (group_lr) and the
    Muon groups' momentum (muon_momentum_at)."""
    for group in optimizer.param_groups:
        group['lr'] = group_lr(group, lr, config)
        if group.get('muon'):
            group['momentum'] = muon_momentum_at(it, config)


def muon_matrices(model):
    """The parameters optim='muon' gives to Muon: the transformer blocks' 2-D weight matrices. Muon is for hidden
    layers' matrices, so the token embedding (also lm_head, tied) and the position embedding are not among them."""
    return [p for p in model.transformer.h.parameters() if p.requires_grad and p.dim() == 2]


# The parameters that weigh the terms of a sum in model.py (x0_lambdas, value_lambdas, v1_lambda, skip_weights):
# modded-nanogpt's scalars, an AdamW group of their own under scalar_learning_rate
MIXING_SCALARS = ('lambdas', 'v1_lambda', 'skip_weights')


def muon_param_groups(model, config):
    """nanoGPT's parameter groups (2-D tensors decayed, the rest not) with muon_matrices taken out into a Muon group
    (with muon_split_qkv, the c_attn matrices in a second one, split in their q, k and v rows); the embeddings stay
    with AdamW, as do the LayerNorms and biases, an untied lm_head (tie_weights=False) gets an AdamW group of its
    own, and with scalar_learning_rate so do the MIXING_SCALARS. group_lr gives each its learning rate ('lr_key':
    the config key of its peak). Empty groups are left out."""
    matrices = muon_matrices(model)
    qkv = {id(block.attn.c_attn.weight) for block in model.transformer.h
           if block.attn is not None} if config.get('muon_split_qkv') else set()
    head = [] if model.config.tie_weights else [model.lm_head.weight]
    scalars = [p for name, p in model.named_parameters() if name.endswith(MIXING_SCALARS) and p.requires_grad
               and config.get('scalar_learning_rate')]
    apart = {id(p) for p in matrices + head + scalars}
    rest = [p for p in model.parameters() if p.requires_grad and id(p) not in apart]
    decay, no_decay = [p for p in rest if p.dim() >= 2], [p for p in rest if p.dim() < 2]
    print(f"num Muon matrices: {len(matrices)}, with {sum(p.numel() for p in matrices):,} parameters; AdamW: "
          f"{len(decay) + len(head)} decayed tensors, {sum(p.numel() for p in decay + head):,} parameters, "
          f"{len(no_decay) + len(scalars)} not decayed, {sum(p.numel() for p in no_decay + scalars):,} parameters")
    muon = dict(muon=True, lr=config['muon_learning_rate'], momentum=config['muon_momentum'],
                weight_decay=config['weight_decay'],
                momentum_form=config.get('muon_momentum_form', MUON_MOMENTUM_FORMS[0]))
    groups = [dict(params=[p for p in matrices if id(p) not in qkv], **muon),
              dict(params=[p for p in matrices if id(p) in qkv], split=3, **muon),
              dict(params=decay, lr_key='embedding_learning_rate', weight_decay=config['weight_decay']),
              dict(params=head, lr_key='head_learning_rate', weight_decay=config['weight_decay']),
              dict(params=no_decay, weight_decay=0.0),
              dict(params=scalars, lr_key='scalar_learning_rate', weight_decay=0.0)]
    for group in groups[2:]:
        group['lr'] = group_lr(group, config['learning_rate'], config)
    return [group for group in groups if group['params']]


