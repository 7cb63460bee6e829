"""
Peak GPU memory of a training config before launch, on any machine, and a micro-batch that fits. For example:
$ python estimate_memory.py config/train_openwebtext_12gb.py --gpu_memory_gb=12
$ python estimate_memory.py config/train_openwebtext_12gb.py --batch_size=32 --find_batch_size
$ python estimate_memory.py config/train_gpt2.py --gpu_memory_gb=8 --ladder
$ python estimate_memory.py config/train_openwebtext_12gb.py --gpu_memory_gb=12 && python train.py ...
Same config files and --key=value overrides as train.py, plus this script's keys (--help lists them first). The
config fits when training and evaluation fit the card less gpu_headroom_gb (memory left to other programs: a
desktop, a browser; train.py's auto_batch_size leaves it too); with eval_only=True, when its one evaluation does.
--ladder adds memory levers one at a time (checkpointing, optimizer state, the step in backward, weight precision)
until the config fits, and prints the keys to add to train.py's command. dtype defaults to bfloat16, as on a GPU.
Progress goes to stderr, the report (or --json) to stdout. How it traces: training/memory/estimate.py.

Exit status: 0 the config fits, 1 it does not (training or evaluation; whatever --ladder or --find_batch_size found),
2 bad input (a one-line error on stderr).
"""
import contextlib
import inspect
import io
import json
import os
import sys
import time

from training import configurator
from training import rules, runs
from training.errors import ConfigError, fail
from training.memory import estimate, fit
from training.memory.estimate import FRAGMENTATION, GIB, LOSSES, MIB, TRACED_ITERATIONS, check_config, gib

FITS, DOES_NOT_FIT, BAD_INPUT = 0, 1, 2  # exit statuses (fail() exits 2 for bad input)

ALLOWANCE_NOTES = {  # the allowance's numbers and why, for the report
    'cuda_context_bytes': "CUDA context: driver state and loaded kernels, outside PyTorch's counters "
                          "(--measure shows your card's)",
    'workspace_bytes': 'workspaces: cuBLAS keeps one per handle and stream, attention kernels a few MiB',
    'fragmentation_bytes': f'fragmentation: {FRAGMENTATION:.0%} of the peak, as the caching allocator reserves more '
                           f'than it allocates'}
PARALLELISM_NOTES = {  # what the per-rank figures above mean, for world_size > 1
    'ddp': 'note: per rank; DDP holds the gradients a second time, in its buckets (counted above); the per-rank peak '
           'does not fall with world_size: try --parallelism=zero1 or fsdp',
    'zero1': "note: per rank (rank 0, the largest share); each rank keeps 1/world_size of the AdamW state, and DDP's "
             "gradient buckets (counted above)",
    'fsdp': 'note: per rank (rank 0, the largest share); weights, gradients and AdamW state are split over the ranks, '
            "each block's weights gathered only for its forward and backward (counted as parameters); between "
            "accumulation micro-steps the gradients stay unsharded (counted as temporaries)"}
# gpt2026.py's record under torchrun, whose optimizer sums the gradients itself (training/record2026.py)
SUMMED_GRADIENTS_NOTES = {
    'ddp': "note: per rank; each rank holds the whole model, its gradients and the record's optimizer, which sums the "
           "gradients over the ranks in place (no DDP buckets): the per-rank peak does not fall with world_size: try "
           "--parallelism=zero1",
    'zero1': "note: per rank (rank 0, the largest share); each rank holds the whole model and its gradients, which the "
             "record's optimizer sums in place (no DDP buckets), and the optimizer state of its share of the "
             "parameters, which it steps"}

def allocation_text(allocation):
    size = allocation['bytes']
    return f"{tuple(allocation['shape'])} {allocation['dtype']} " + (gib(size) if size >= GIB // 10 else
                                                                       f'{size / MIB:.1f} MiB')


def report(config, result):
    """main()'s JSON-able `result` as text."""
    m, train, evaluation, a = result['model'], result['train'], result['eval'], result['allowance']
    checkpointing = 'on' if result['activation_checkpointing'] else 'off'
    lines = [f"model: {m['n_params'] / 1e6:.1f}M parameters (n_layer={m['n_layer']}, n_head={m['n_head']}, "
             f"n_embd={m['n_embd']}, block_size={m['block_size']}, vocab_size={m['vocab_size']}, bias={m['bias']})",
             f"step: micro-batch {result['batch_size']} x {m['block_size']}, gradient_accumulation_steps="
             f"{result['gradient_accumulation_steps']}, world_size={result['world_size']}, {result['dtype']} autocast "
             f"(cache {'on' if config['autocast_cache'] else 'off'}), {config['weight_dtype']} weights, "
             f"{runs.optimizer_words(config)}, {result['loss']} loss, "
             f"activation checkpointing {checkpointing}"]
    if train is None:
        lines.append('training: none, eval_only=True (train.py evaluates once and stops): the evaluation alone')
    else:
        lines += [f"training peak of tensors: {gib(train['peak_bytes'])} ({TRACED_ITERATIONS} iterations traced, "
                  f"{result['micro_steps_traced']} micro-step(s) each: later micro-steps repeat the 2nd)",
                  *(f"  {gib(size):>9}  {name.replace('_', ' ')}" for name, size in train['breakdown'].items()
                    if size or name != 'ddp_gradient_buckets'),
                  f"  largest allocation: {allocation_text(train['largest_allocations'][0])}; in the loss path: "
                  + ', '.join(map(allocation_text, train['largest_loss_path_allocations']))]
    lines += [f"allowance for what tensors don't show: {gib(sum(a.values()))}",
              *(f'  {gib(size):>9}  {ALLOWANCE_NOTES[name]}' for name, size in a.items())]
    if train is not None:
        lines.append(f"estimated training total: {gib(result['total_bytes'])}")
    lines.append(f"evaluation forward (no_grad, batch {evaluation['batch_size']}): peak of tensors "
                 f"{gib(evaluation['peak_bytes'])}, {gib(result['eval_total_bytes'])} with the allowance")
    budget, needed = result['budget_bytes'], result['needed_bytes']
    card = (f"a {config['gpu_memory_gb']:g} GB card ({gib(result['gpu_memory_bytes'])}, "
            f"{gib(result['headroom_bytes'])} of it left free: --gpu_headroom_gb)")
    hint = ' or --ladder' if result['activation_checkpointing'] else ', --activation_checkpointing=True or --ladder'
    levers = runs.has_activation_checkpointing(config)  # model.py's; gpt2026.py's training is the record's
    fix = f'--find_batch_size{hint}' if levers else (
        "a smaller --block_size, with more --gradient_accumulation_steps for the same tokens a step (model.py's "
        "memory levers do not apply to gpt2026.py's record)")
    if result['fits']:
        lines.append(f'verdict: fits {card}, {gib(budget - needed)} to spare')
    elif train is None:
        lines.append(f'verdict: evaluation does NOT fit {card}, {gib(needed - budget)} over: lower --eval_batch_size')
    elif result['total_bytes'] <= budget:
        lines.append(f'verdict: training fits {card} but evaluation does NOT, {gib(needed - budget)} over: '
                     f'lower --eval_batch_size')
    else:
        lines.append(f'verdict: does NOT fit {card}, {gib(needed - budget)} over: try {fix}')
    data = rules.dataset_path(config)
    if config['init_from'] == 'scratch' and not any(os.path.exists(os.path.join(data, name))
                                                    for name in ('meta.pkl', 'train.bin')):
        lines.append(f"note: {data} is not prepared here, so vocab_size {m['vocab_size']:,} is GPT-2's, as train.py "
                     f"takes it without a meta.pkl; a dataset of characters has far fewer tokens: prepare it (or give "
                     f"--data_dir) for its own")
    if config['compile']:
        lines.append('note: traced in eager mode; torch.compile usually needs a little less activation memory')
    if config['dtype'] == 'float16':
        lines.append('note: traced in bfloat16, which takes the same bytes as float16')
    if result['world_size'] > 1:
        summed = runs.run_class(config).optimizer_sums_gradients
        lines.append((SUMMED_GRADIENTS_NOTES if summed else PARALLELISM_NOTES)[result['parallelism']])
    configured_tokens = config['batch_size'] * config['gradient_accumulation_steps'] * config['block_size']
    for choice in result.get('find_batch_size', []):
        found = ('even batch 1 does not fit' if choice['batch_size'] is None else
                 f"{command_line(choice['command'])} ({tokens_text(choice['tokens_per_step'], configured_tokens)}; "
                 f"the largest micro-batch that fits is {choice['largest_batch_size']}: "
                 f"{gib(choice['largest_total_bytes'])})")
        checkpointing = 'on' if choice['activation_checkpointing'] else 'off'
        lines.append(f'find_batch_size, activation checkpointing {checkpointing}: {found}')
    if result['fits'] and 'ladder' in result:
        lines.append('ladder: fits as configured, nothing to change')
    for step in result.get('ladder', []):
        if step['skipped']:
            lines.append(f"ladder, + {step['rung']}: skipped, train.py would refuse it here: {step['skipped']}")
            continue
        if not step['fits']:
            lines.append(f"ladder, + {step['rung']}: even micro-batch 1 needs {gib(step['batch_1_total_bytes'])}")
            continue
        evaluation = ('' if step['eval_total_bytes'] <= result['budget_bytes'] else
                      ' does NOT fit: lower --eval_batch_size')
        lines += [f"ladder, + {step['rung']}: fits, {gib(step['total_bytes'])} with micro-batch {step['batch_size']} "
                  f"({tokens_text(step['tokens_per_step'], configured_tokens)}; evaluation "
                  f"{gib(step['eval_total_bytes'])}{evaluation})",
                  f"  add to your command: {command_line(step['command'])}"]
        lines += [f'  cost of {s["rung"]}: {s["cost"]}' for s in result['ladder'] if s['cost'] and not s['skipped']]
    if result.get('ladder') and not result['ladder'][-1]['fits']:
        last = [step for step in result['ladder'] if not step['skipped']][-1]
        if last['batch_1_total_bytes'] <= result['gpu_memory_bytes']:  # it is the headroom that it does not fit
            lines.append(f"ladder: no rung fits the {gib(result['budget_bytes'])} that gpu_headroom_gb leaves, but "
                         f"the last, {last['rung']}, needs {gib(last['batch_1_total_bytes'])} at micro-batch 1: with "
                         f"nothing else on the GPU, --gpu_headroom_gb=0 fits it")
        else:
            lines.append('ladder: no rung fits this card: a smaller model or block_size'
                         + (', or several GPUs (fsdp)' if levers else ''))
    measured = result.get('measured', {})
    for phase in [phase for phase in ('train', 'eval') if phase in measured]:
        lines.append(f"measured on {measured['device']}, {phase}: max_memory_allocated "
                     f"{gib(measured[phase]['max_allocated_bytes'])}, max_memory_reserved "
                     f"{gib(measured[phase]['max_reserved_bytes'])}")
    return '\n'.join(lines)


def command_line(keys):
    """--key=value arguments for `keys`, or a line saying there is nothing to change."""
    return ' '.join(f'--{key}={value}' for key, value in keys.items()) or 'nothing to change'


def tokens_text(tokens, configured_tokens):
    if tokens >= configured_tokens:
        return f'{tokens:,} tokens per step'
    return (f'{tokens:,} tokens per step, fewer than the configured {configured_tokens:,}: the step in backward cannot '
            f'accumulate')


def estimator_keys():
    """This script's keys (ESTIMATOR_DEFAULTS, read as a declaration) first, then train.py's, with the dtype its
    defaults pick on a bf16 GPU (on a machine without one they say float32; float16 GPUs take the same bytes)."""
    own = configurator.read_keys(inspect.getfile(estimate), 'ESTIMATOR_DEFAULTS')
    train = configurator.train_keys()
    dtype = train['dtype']._replace(default='bfloat16', description=f"{train['dtype'].description}; here as on a GPU")
    return {**own, **train, 'dtype': dtype}


def estimator_defaults():
    return configurator.defaults(estimator_keys())


def load_config(argv):
    """The checked config of argv: train.py's config files and --key=value overrides, plus this script's keys; a bare
    boolean flag (--json) means --json=True. ConfigError for bad input."""
    keys = estimator_keys()
    defaults = configurator.defaults(keys)
    argv = [f'{arg}=True' if arg.startswith('--') and isinstance(defaults.get(arg[2:]), bool) else arg for arg in argv]
    with contextlib.redirect_stdout(io.StringIO()):  # the configurator echoes the config files: noise here
        config = configurator.load_config(keys, argv)
    check_config(config)
    return config


def progress_printer():
    """A progress callback: each line to stderr (stdout stays the report, or parseable --json), with the seconds since
    the start."""
    start = time.monotonic()

    def progress(message):
        print(f'[{time.monotonic() - start:5.0f}s] {message}', file=sys.stderr, flush=True)
    return progress


def main(argv):
    """Estimate, report, and exit with FITS or DOES_NOT_FIT (BAD_INPUT, through fail(), for bad input)."""
    if '--help' in argv or '-h' in argv:
        print(configurator.help_text(estimator_keys(), {**rules.CHOICES, 'loss': LOSSES}))
        print(f'exit status: {FITS} the config fits, {DOES_NOT_FIT} it does not (training or evaluation), '
              f'{BAD_INPUT} bad input')
        sys.exit(0)
    try:  # stdout holds the report (or --json's object) alone: what else prints (a pretrained config's notes) goes
        with contextlib.redirect_stdout(sys.stderr):  # to stderr with the progress
            config = load_config(argv)
            result = fit.estimate(config, progress_printer())
    except ConfigError as e:
        fail(e)
    print(json.dumps(result, indent=2) if config['json'] else report(config, result))
    sys.exit(FITS if result['fits'] else DOES_NOT_FIT)


if __name__ == '__main__':
    main(sys.argv[1:])
