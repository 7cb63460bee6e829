"""
Peak GPU memory of a training config before launch, on any machine, and a micro-batch that fits. For example:
$ python estimate_memory.py config/train_openwebtext_12gb.py --gpu_memory_gb=12
$ python estimate_memory.py config/train_openwebtext_12gb.py --batch_size=32 --find_batch_size
$ python estimate_memory.py config/train_openwebtext_12gb.py --json
Same config files and --key=value overrides as train.py, plus: gpu_memory_gb (the card's memory; a "12 GB" card has
12 GiB), json (print one JSON object), find_batch_size (the largest micro-batch that fits, with activation
checkpointing off and on), ladder (climb the memory levers, micro-batch, checkpointing, optimizer state, weight
precision, until the config fits, and print the first that does with what each costs), measure (two real steps on
the GPU here: the ground truth), world_size (processes under torchrun), loss (chunked: model.py's; naive: nanoGPT's
full logits, to compare). dtype defaults to bfloat16, as on a GPU. How it traces: training/memory/estimate.py.
"""
import contextlib
import io
import json
import sys

import configurator
from training import optim
from training.errors import ConfigError, fail
from training.memory.estimate import (ESTIMATOR_DEFAULTS, FRAGMENTATION, GIB, MIB, TRACED_ITERATIONS, check_config,
                                      estimate, gib)

ALLOWANCE_NOTES = {  # the allowance's numbers and why, for the report
    'cuda_context_bytes': "CUDA context: driver state and kernels of CUDA 12 and PyTorch 2.x (0.3-0.6 GiB), outside "
                          "PyTorch's counters",
    'workspace_bytes': 'workspaces: cuBLAS keeps up to 32 MiB per handle and stream, attention kernels a few MiB',
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
             f"{optim.describe(config['optim'], config['optimizer_in_backward'])}, {result['loss']} loss, "
             f"activation checkpointing {checkpointing}",
             f"training peak of tensors: {gib(train['peak_bytes'])} ({TRACED_ITERATIONS} iterations traced, "
             f"{result['micro_steps_traced']} micro-step(s) each: later micro-steps repeat the 2nd)"]
    lines += [f"  {gib(size):>9}  {name.replace('_', ' ')}" for name, size in train['breakdown'].items()
              if size or name != 'ddp_gradient_buckets']
    lines += [f"  largest allocation: {allocation_text(train['largest_allocations'][0])}; in the loss path: "
              + ', '.join(map(allocation_text, train['largest_loss_path_allocations'])),
              f"allowance for what tensors don't show: {gib(sum(a.values()))}",
              *(f'  {gib(size):>9}  {ALLOWANCE_NOTES[name]}' for name, size in a.items()),
              f"estimated training total: {gib(result['total_bytes'])}",
              f"evaluation forward (no_grad, batch {evaluation['batch_size']}): peak of tensors "
              f"{gib(evaluation['peak_bytes'])}, {gib(result['eval_total_bytes'])} with the allowance"]
    budget, needed = result['gpu_memory_bytes'], max(result['total_bytes'], result['eval_total_bytes'])
    card = f"a {config['gpu_memory_gb']:g} GB card ({gib(budget)})"
    hint = '' if result['activation_checkpointing'] else ' or --activation_checkpointing=True'
    if result['fits']:
        lines.append(f'verdict: fits {card}, {gib(budget - needed)} to spare')
    elif result['total_bytes'] <= budget:
        lines.append(f'verdict: training fits {card} but evaluation does NOT, {gib(needed - budget)} over: '
                     f'lower --eval_batch_size')
    else:
        lines.append(f'verdict: does NOT fit {card}, {gib(needed - budget)} over: try --find_batch_size{hint}')
    if config['compile']:
        lines.append('note: traced in eager mode; torch.compile usually needs a little less activation memory')
    if config['dtype'] == 'float16':
        lines.append('note: traced in bfloat16, which takes the same bytes as float16')
    if result['world_size'] > 1:
        lines.append(PARALLELISM_NOTES[result['parallelism']])
    for choice in result.get('find_batch_size', []):
        found = ('even batch 1 does not fit' if choice['batch_size'] is None else
                 f"--batch_size={choice['batch_size']} --gradient_accumulation_steps="
                 f"{choice['gradient_accumulation_steps']} ({choice['tokens_per_step']:,} tokens per step; the largest "
                 f"micro-batch that fits is {choice['largest_batch_size']}: {gib(choice['largest_total_bytes'])})")
        checkpointing = 'on' if choice['activation_checkpointing'] else 'off'
        lines.append(f'find_batch_size, activation checkpointing {checkpointing}: {found}')
    for step in result.get('ladder', []):
        if not step['fits']:
            lines.append(f"ladder, + {step['rung']}: even micro-batch 1 needs {gib(step['batch_1_total_bytes'])}")
            continue
        keys = {**step['levers'], 'batch_size': step['batch_size'],
                'gradient_accumulation_steps': step['gradient_accumulation_steps']}
        evaluation = ('' if step['eval_total_bytes'] <= result['gpu_memory_bytes'] else
                      ' does NOT fit: lower --eval_batch_size')
        lines += [f"ladder, + {step['rung']}: fits, {gib(step['total_bytes'])} with micro-batch {step['batch_size']} "
                  f"({step['tokens_per_step']:,} tokens per step; evaluation {gib(step['eval_total_bytes'])}"
                  f"{evaluation})",
                  '  add to your command: ' + ' '.join(f'--{key}={value}' for key, value in keys.items())]
        lines += [f'  cost of {s["rung"]}: {s["cost"]}' for s in result['ladder'] if s['cost']]
    if result.get('ladder') and not result['ladder'][-1]['fits']:
        lines.append('ladder: no rung fits this card: a smaller model or block_size, or several GPUs (fsdp)')
    for phase in ('train', 'eval') if 'measured' in result else ():
        measured = result['measured']
        lines.append(f"measured on {measured['device']}, {phase}: max_memory_allocated "
                     f"{gib(measured[phase]['max_allocated_bytes'])}, max_memory_reserved "
                     f"{gib(measured[phase]['max_reserved_bytes'])}")
    return '\n'.join(lines)



def estimator_defaults():
    """train.py's keys and defaults, with the dtype its defaults pick on a bf16 GPU (on a machine without one they say
    float32; float16 GPUs take the same bytes), and this script's own keys."""
    return {**configurator.train_defaults(), 'dtype': 'bfloat16', **ESTIMATOR_DEFAULTS}


def load_config(argv):
    """The checked config of argv: train.py's config files and --key=value overrides, plus this script's keys; a bare
    boolean flag (--json) means --json=True. ConfigError for bad input."""
    defaults = estimator_defaults()
    argv = [f'{arg}=True' if arg.startswith('--') and isinstance(defaults.get(arg[2:]), bool) else arg for arg in argv]
    with contextlib.redirect_stdout(io.StringIO()):  # the configurator echoes the config files: noise here
        config = configurator.load_config(defaults, argv)
    check_config(config)
    return config


def main(argv):
    if '--help' in argv or '-h' in argv:
        configurator.load_config(estimator_defaults(), argv)  # prints the keys with their defaults and exits
    try:
        config = load_config(argv)
        result = estimate(config)
    except ConfigError as e:
        fail(e)
    print(json.dumps(result, indent=2) if config['json'] else report(config, result))


if __name__ == '__main__':
    main(sys.argv[1:])
