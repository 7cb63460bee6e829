"""ckpt.pt in nanoGPT's format, saved atomically and loaded with one-line errors, and the models that sample.py and
hellaswag.py load from it, from OpenAI's GPT-2 weights or from a local Hugging Face GPT-2 folder.

nanoGPT's keys: model, optimizer, model_args, iter_num, best_val_loss, config. train.py adds what exact resume
needs (scaler, rng_states, pending_gradients); a checkpoint without them, e.g. one written by nanoGPT, loads all the
same. model_args name the model file of a model that is not model.py's GPT (training.runs).
"""
import contextlib
import os
import zipfile

import torch
import torch.distributed as dist

from model import GPT
from training import hf, runs
from training.errors import ConfigError, first_line
from training.parallel import load_optimizer_state, world_size

CKPT_NAME = 'ckpt.pt'
PREVIOUS_NAME = 'ckpt.prev.pt'  # another run's ckpt.pt, kept when a new run in its out_dir first saves (keep_previous)
# the init_from values sample.py and hellaswag.py load (train.py's add 'scratch'), as --help lists them
LOAD_CHOICES = ('resume', *GPT.PRETRAINED_ARGS, 'PATH (a Hugging Face GPT-2 folder or an export_hf.py export)')
# a save writes .ckpt.pt.<pid>.tmp first: the pid tells a later save whether the writer of a leftover still runs
TMP_PREFIX, TMP_SUFFIX = f'.{CKPT_NAME}.', '.tmp'
# the prefixes wrappers give parameter names: torch.compile's (nanoGPT saves a compiled model's names so) and DDP's
# (train.py saves the unwrapped model, but a script that saves the wrapper's state dict has them)
WRAPPER_PREFIXES = ('_orig_mod.', 'module.')


class CheckpointError(ConfigError):
    """A checkpoint problem the user can fix; str(e) is the one-line message."""


def checkpoint_path(out_dir):
    return os.path.join(out_dir, CKPT_NAME)


def _process_is_alive(pid):
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        return True
    return True


def remove_stale_temporaries(out_dir):
    """Delete the temporary files that saves killed mid-write (SIGKILL, out of host memory) left in out_dir: with
    its optimizer state a GPT-2 124M checkpoint is 1.5 GB, so each is disk space the next save may need.
    Those of live processes (another run saving into the same out_dir) are left alone."""
    if os.name != 'posix':  # os.kill(pid, 0) only probes a process on POSIX; on Windows it would end it
        return
    for name in os.listdir(out_dir):
        pid = name[len(TMP_PREFIX):-len(TMP_SUFFIX)]
        is_temporary = name.startswith(TMP_PREFIX) and name.endswith(TMP_SUFFIX) and pid.isdigit()
        if is_temporary and not _process_is_alive(int(pid)):  # this process's own: overwritten below
            with contextlib.suppress(FileNotFoundError):  # another run's cleanup may have got there first
                os.remove(os.path.join(out_dir, name))


def save_checkpoint(checkpoint, out_dir, keep_previous=False):
    """Write out_dir/ckpt.pt through a temporary file in out_dir and os.replace: a crash or kill at any moment
    leaves either the previous ckpt.pt or the new one, never a partial file. keep_previous: the ckpt.pt there now
    (another run's) stays, as ckpt.prev.pt (keep_aside), and an older ckpt.prev.pt goes before the new file is
    written: out_dir never holds three checkpoints."""
    os.makedirs(out_dir, exist_ok=True)
    remove_stale_temporaries(out_dir)
    previous = os.path.join(out_dir, PREVIOUS_NAME)
    if keep_previous:
        with contextlib.suppress(FileNotFoundError):
            os.remove(previous)
    tmp = os.path.join(out_dir, f'{TMP_PREFIX}{os.getpid()}{TMP_SUFFIX}')  # same filesystem, so os.replace is a rename
    try:
        with open(tmp, 'wb') as f:
            torch.save(checkpoint, f)
            f.flush()
            os.fsync(f.fileno())  # the data is on disk before the rename makes it ckpt.pt
        if keep_previous:
            keep_aside(out_dir)
        os.replace(tmp, checkpoint_path(out_dir))
    except BaseException as e:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
        if keep_previous and not os.path.exists(checkpoint_path(out_dir)) and os.path.exists(previous):
            os.replace(previous, checkpoint_path(out_dir))  # keep_aside renamed it (no hard links): back it goes
        if isinstance(e, (OSError, RuntimeError)):  # a full disk: ENOSPC, or torch's "unexpected pos" from its writer
            kept = 'the previous ckpt.pt is intact' if os.path.exists(checkpoint_path(out_dir)) else 'nothing saved'
            raise CheckpointError(f'could not write {checkpoint_path(out_dir)} ({first_line(e)}): {kept}; free disk '
                                  f'space in {out_dir} (a checkpoint with its optimizer state is about 16 bytes a '
                                  f'parameter) or use another --out_dir') from None
        raise


def keep_aside(out_dir):
    """out_dir/ckpt.pt, if any, also as ckpt.prev.pt (none there): a hard link, no copy, ckpt.pt itself in place until
    the new one replaces it; where the filesystem has no hard links, renamed (until the new one is renamed in,
    out_dir holds ckpt.prev.pt alone, and save_checkpoint renames it back if that fails)."""
    current, previous = checkpoint_path(out_dir), os.path.join(out_dir, PREVIOUS_NAME)
    try:
        os.link(current, previous)
    except FileNotFoundError:  # nothing to keep
        pass
    except OSError:  # FAT, exFAT and some network filesystems have no hard links
        os.replace(current, previous)


def saved_iteration(out_dir):
    """The iter_num of out_dir/ckpt.pt as it is on disk now, or None without a readable one: read through mmap, its
    tensors untouched, so a Ctrl-C anywhere in a save (the rename done or not) is told what the file holds."""
    try:
        return torch.load(checkpoint_path(out_dir), map_location='cpu', mmap=True, weights_only=True)['iter_num']
    except Exception:  # none, damaged, or without an iter_num: nothing to tell
        return None


def load_checkpoint(out_dir, map_location, required=()):
    """out_dir/ckpt.pt as a dict, its model state dict without torch.compile's and DDP's prefixes; CheckpointError if it
    is missing, unreadable, truncated or lacks 'model', 'model_args' or one of the `required` keys."""
    path = checkpoint_path(out_dir)
    if not os.path.isfile(path):
        raise CheckpointError(f'no checkpoint at {path}: check --out_dir (train.py writes ckpt.pt there)')
    if not zipfile.is_zipfile(path):  # torch.save's format is a zip archive; torch.load's own error is an essay
        raise CheckpointError(f'{path} is not a PyTorch checkpoint (truncated, or another kind of file): restore a '
                              f'good copy or train again')
    try:
        checkpoint = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # a damaged archive, pickling or I/O errors: all mean the same to the user
        raise CheckpointError(f'{path} is unreadable or truncated ({first_line(e)}): restore a good copy '
                              f'or train again') from None
    missing = [k for k in ('model', 'model_args', *required) if not isinstance(checkpoint, dict) or k not in checkpoint]
    if missing:
        raise CheckpointError(f"{path} is not a nanoGPT checkpoint (no {', '.join(missing)})")
    state_dict = checkpoint['model']
    for k in list(state_dict):
        name = k
        while name.startswith(WRAPPER_PREFIXES):  # a compiled DDP model has both, in either order
            name = name.split('.', 1)[1]
        state_dict[name] = state_dict.pop(k)
    # nanoGPT saves a diverged run's weights; sampled, they stop in torch.multinomial, exported, they export
    broken = next((name for name, t in state_dict.items()
                   if torch.is_tensor(t) and t.is_floating_point() and not torch.isfinite(t).all()), None)
    if broken is not None:
        raise CheckpointError(f'{path} holds weights that are not finite ({broken} has NaN or inf): the run that saved '
                              f'it diverged; restore an earlier copy')
    return checkpoint


def load_model_state(model, checkpoint, out_dir):
    """Load checkpoint['model'] into `model`; CheckpointError (not a size-mismatch wall) if it does not fit."""
    try:
        model.load_state_dict(checkpoint['model'])
    except RuntimeError as e:
        raise CheckpointError(f'{checkpoint_path(out_dir)} does not match its model_args '
                              f"({first_line(' '.join(str(e).split()), limit=240)})") from None


# the keys that make parameter groups of their own (training/optim.py's muon_param_groups): on or off
GROUP_KEYS = ('muon_split_qkv', 'scalar_learning_rate')


def load_optimizer(checkpoint, optimizer, config, path):
    """The checkpoint's optimizer state into `optimizer` (parallel.load_optimizer_state); CheckpointError, naming the
    key to set, where the state is of other parameter groups than this run's optimizer, which torch's
    load_state_dict refuses with a ValueError."""
    try:
        load_optimizer_state(optimizer, checkpoint['optimizer'])
    except ValueError as e:
        saved_config = checkpoint.get('config') or {}
        keys = [key for key in GROUP_KEYS if key in saved_config and bool(saved_config[key]) != bool(config[key])]
        fix = ' '.join(f'--{key}={saved_config[key]}' for key in keys) or "the optimizer keys of the run that saved it"
        raise CheckpointError(f"{path} holds optimizer state of other parameter groups than this run's optimizer "
                              f"({first_line(e)}): resume with {fix}") from None


def restore_training_state(checkpoint, optimizer, scaler, config, rank, world_size, device):
    """Resume what the weights alone do not hold: the optimizer's state (split as this run's parallelism and world
    size want), the GradScaler's, and this rank's RNG state where the checkpoint has one for each rank."""
    path = checkpoint_path(config['out_dir'])
    saved_optim = (checkpoint.get('config') or {}).get('optim', 'adamw')  # nanoGPT's checkpoints: torch's AdamW
    if saved_optim != config['optim']:
        raise CheckpointError(f"{path} holds the state of optim={saved_optim!r}, not optim={config['optim']!r}: "
                              f"resume with --optim={saved_optim}")
    load_optimizer(checkpoint, optimizer, config, path)
    if checkpoint.get('scaler'):  # empty when saved with the scaler disabled
        scaler.load_state_dict(checkpoint['scaler'])
    saved_rng_states = checkpoint.get('rng_states')
    if saved_rng_states is not None and len(saved_rng_states) == world_size:
        torch.set_rng_state(saved_rng_states[rank]['torch'].cpu())
        if torch.device(device).type == 'cuda' and saved_rng_states[rank]['cuda'] is not None:
            torch.cuda.set_rng_state(saved_rng_states[rank]['cuda'].cpu(), device)
    elif rank == 0 and saved_rng_states is None:
        print(f"note: {path} has no RNG or GradScaler state (written by nanoGPT?): resuming without them, so the "
              f"losses will not repeat the original run's exactly")
    elif rank == 0:
        print(f"note: {path} holds the RNG states of {len(saved_rng_states)} processes, this run has {world_size}: "
              f"dropout randomness restarts from the seed")


@torch.no_grad()
def pending_gradients(model, master=True):
    """{parameter name: gradient} of the gradients `model` holds between iterations: those its optimizer keeps for its
    next step (gpt2026.py's Adam, stepped every other step on two steps' gradients); none for model.py's optimizers,
    which free every gradient. An exact resume needs them. Under torchrun each process holds its own micro-batches'
    (record2026.sum_over_processes), and this is a collective: their sum, in the master's host memory, is saved, so
    that any number of processes resumes it. It is made in place on the master, the others' zeroed: the sum the next
    step takes stays the same. The processes but the master get None."""
    pending = {name: p.grad for name, p in model.named_parameters() if p.grad is not None}
    if world_size() == 1:
        return pending
    for grad in pending.values():
        dist.reduce(grad, dst=0)
        if not master:
            grad.zero_()
    return {name: grad.cpu() for name, grad in pending.items()} if master else None


def restore_pending_gradients(model, checkpoint, master=True):
    """The gradients pending_gradients saved, back on model's parameters: on the master; zeros on the other
    processes, so that the sum over the processes is the saved one."""
    parameters = dict(model.named_parameters())
    for name, grad in checkpoint.get('pending_gradients', {}).items():
        param = parameters[name]
        param.grad = grad.to(param) if master else torch.zeros_like(param)


def pretrained_model(init_from, dropout=0.0, **options):
    """OpenAI's GPT-2 weights `init_from` (gpt2, gpt2-medium, gpt2-large, gpt2-xl) through Hugging Face transformers,
    or those of a local GPT-2 folder, with this dropout; ConfigError with the fix if they cannot be loaded. options:
    runs.gpt_options' keywords."""
    options = runs.gpt_options(**options)
    if hf.is_folder(init_from):
        return hf.folder_model(init_from, dropout, **options)
    try:
        from huggingface_hub import constants, try_to_load_from_cache  # a dependency of transformers
        import transformers  # noqa: F401  GPT.from_pretrained imports it in turn
    except ImportError:
        raise ConfigError(f"init_from={init_from} loads OpenAI's weights with Hugging Face transformers: pip install "
                          f"transformers") from None
    if not isinstance(try_to_load_from_cache(init_from, 'config.json'), str):
        if constants.HF_HUB_OFFLINE:  # HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE: no download is tried
            raise ConfigError(f"{init_from}'s weights are not in the Hugging Face cache, and HF_HUB_OFFLINE is set: "
                              f"unset it to download them once (network access), or pass --init_from=FOLDER, a "
                              f"folder where a GPT-2 was saved with save_pretrained")
        # transformers asks for two files (an adapter's config, then the model's), huggingface_hub five times each
        print(f"{init_from}'s weights are not in the Hugging Face cache: downloading them (without network access "
              f"each file is retried for about half a minute, then this stops)", flush=True)
    try:
        return GPT.from_pretrained(init_from, dict(dropout=dropout), **options)  # only dropout can be overridden
    except Exception as e:  # no network, no cached weights, a damaged cache: the fixes are the same
        raise ConfigError(f"could not load the {init_from} weights ({first_line(e)}): they download once into the "
                          f"Hugging Face cache, which needs network access; or pass --init_from=FOLDER, a folder where "
                          f"a GPT-2 was saved with save_pretrained") from None


def load_model(init_from, out_dir, device):
    """(model, the config it was trained with or {}) for sampling and evaluation: out_dir's ckpt.pt with
    init_from='resume', OpenAI's GPT-2 weights, or a local GPT-2 folder's; in eval mode, on `device`. ConfigError
    with one line otherwise."""
    if init_from == 'scratch':  # train.py's choice; there is nothing to load
        raise ConfigError(f"init_from='scratch' is a model with random weights, nothing to sample or evaluate: use "
                          f"one of {', '.join(LOAD_CHOICES)}")
    if init_from == 'resume':
        checkpoint = load_checkpoint(out_dir, device)
        model = runs.new_model(checkpoint['model_args'])
        load_model_state(model, checkpoint, out_dir)
        train_config = checkpoint.get('config') or {}
    else:
        model, train_config = pretrained_model(init_from), {}
    model.eval()
    return model.to(device), train_config
