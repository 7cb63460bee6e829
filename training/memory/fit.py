"""What fits a card, from estimate.py's traces: a config's whole estimate against the card's budget
(estimate_memory.py's report, train.py's record of its run), the largest micro-batch that fits (--find_batch_size,
train.py's auto_batch_size) and the ladder of memory levers climbed until one does (--ladder).
"""
from training import rules, runs
from training.errors import ConfigError
from training.memory.advice import resplit, zero1_splits_more
from training.memory.estimate import (ESTIMATOR_DEFAULTS, GIB, allowance, budget, gib, measure, silent, total_bytes,
                                      trace)

# The ladder of memory levers (--ladder), in order: each rung adds its keys to the rungs before it, at what cost
LADDER = (
    ('as configured', {}, ''),
    ('smaller loss chunks', {'loss_chunk_mib': 128},
     'the loss in more, smaller chunks: a few more kernel launches a step (docs/loss.md)'),
    ('optimizer state split over the processes', {'parallelism': 'zero1'},
     'each process keeps and steps its share of the optimizer state, then sends the others the weights it updated: '
     'more communication, no more compute (docs/parallel.md)'),
    ('activation checkpointing', {'activation_checkpointing': True},
     'one more forward pass of compute: each block runs its forward again in backward'),
    ('bf16 optimizer moments', {'optim': 'adamw_bf16'},
     "AdamW's moments stored in bf16 with stochastic rounding, 4 bytes a parameter instead of 8"),
    ('8-bit optimizer moments', {'optim': 'adamw_8bit'},
     "torchao's block-wise 8-bit AdamW moments, about 2 bytes a parameter; needs pip install torchao"),
    ('optimizer step in backward', {'optimizer_in_backward': True, 'grad_clip': 0.0},
     'no gradient clipping and no accumulation: a step is one micro-batch, fewer tokens than configured'),
    ('bf16 weights', {'weight_dtype': 'bfloat16', 'dtype': 'bfloat16'},
     'weights and gradients in bf16, updates rounded stochastically (docs/optimizers.md: its cost in quality)'),
)


def fewest_micro_steps(config, largest):
    """(batch_size, gradient_accumulation_steps) of config re-split into micro-batches of at most `largest`. With the
    optimizer step in backward, which cannot accumulate (training.optim.check_config): one micro-batch of at most
    `largest`, so a step has fewer tokens than configured where `largest` is smaller than its samples."""
    if config['optimizer_in_backward']:
        return min(largest, config['batch_size'] * config['gradient_accumulation_steps']), 1
    return resplit(config['batch_size'], config['gradient_accumulation_steps'], config['world_size'], largest)


def rebatched(config, batch_size):
    """`config` at micro-batch `batch_size`, with the gradient_accumulation_steps that re-splitting gives it."""
    accumulation = fewest_micro_steps(config, batch_size)[1]
    return {**config, 'batch_size': batch_size, 'gradient_accumulation_steps': accumulation}


def largest_batch(config, budget_bytes, loss='chunked', cuda_context=True, progress=silent):
    """The largest micro-batch whose traced training peak plus allowance fits `budget_bytes` (None if batch 1 does
    not), and {micro-batch: estimated total bytes} of the traces made, up to the batch that needs one micro-step per
    iteration (batch_size * gradient_accumulation_steps / world_size): beyond it the tokens per step would grow.
    Each candidate is traced warm-started with its own gradient_accumulation_steps. Doubling, then bisection; as the
    peak grows almost linearly with the batch, both try the batch where the line meets the budget first when nearer."""
    limit = config['batch_size'] * config['gradient_accumulation_steps'] // config['world_size']
    totals = {}

    def fits(batch_size):
        result = trace(rebatched(config, batch_size), loss, evaluate=False, warm_start=True, progress=progress)
        totals[batch_size] = total_bytes(result['train']['peak_bytes'], cuda_context)
        return totals[batch_size] <= budget_bytes

    if not fits(1):
        return None, totals
    low, previous, high = 1, None, None
    while high is None and low < limit:
        candidate = 2 * low
        if previous is not None and totals[low] > totals[previous]:
            slope = (totals[low] - totals[previous]) / (low - previous)
            candidate = min(candidate, low + max(1, int((budget_bytes - totals[low]) / slope)))
        previous, candidate = low, min(candidate, limit)
        if fits(candidate):
            low = candidate
        else:
            high = candidate
    interpolate = True
    while high is not None and high - low > 1:
        width = high - low
        if interpolate:
            guess = low + int((budget_bytes - totals[low]) * width / (totals[high] - totals[low]))
            guess = min(max(guess, low + 1), high - 1)
        else:
            guess = (low + high) // 2
        if fits(guess):
            low = guess
        else:
            high = guess
        interpolate = not interpolate or 2 * (high - low) <= width  # bisect after a step that did not halve it
    return low, totals


def pick_batch_size(config, free_bytes):
    """(batch_size, gradient_accumulation_steps) for train.py's auto_batch_size: fewest_micro_steps with the largest
    micro-batch whose estimate fits `free_bytes` (the card's free memory, measured after the CUDA context exists, so
    the allowance leaves the context out) less gpu_headroom_gb, with the config's activation_checkpointing. `config`
    has train.py's keys (world_size defaults to 1). ConfigError if batch 1 does not fit."""
    config = {**ESTIMATOR_DEFAULTS, **config}
    batch_size, totals = largest_batch(config, budget(config, free_bytes), cuda_context=False)
    if batch_size is None:
        split = zero1_splits_more(config['world_size'], config['parallelism'])
        lever = not config['activation_checkpointing'] and runs.has_activation_checkpointing(config)
        hint = (f"{'--parallelism=zero1, ' if split else ''}{'--activation_checkpointing=True, ' if lever else ''}"
                f"a smaller model or block_size")
        raise ConfigError(f"auto_batch_size: even batch_size=1 needs about {totals[1] / GIB:.2f} GiB but the GPU has "
                          f"{free_bytes / GIB:.2f} GiB free, {config['gpu_headroom_gb']:g} GiB of it left to other "
                          f"programs (gpu_headroom_gb): try {hint}")
    return fewest_micro_steps(config, batch_size)


def changes(config, keys):
    """The keys of `keys` whose value differs from `config`'s: what to add to config's command line."""
    return {key: value for key, value in keys.items() if config[key] != value}


def find_batch_sizes(config, budget_bytes, progress=silent):
    """largest_batch and fewest_micro_steps with activation checkpointing off and on (where the model file has it),
    as JSON-able dicts with the keys to change (`command`); ConfigError if batch 1 fits no way."""
    choices = []
    for checkpointing in (False, True) if runs.has_activation_checkpointing(config) else (False,):
        checkpointed = {**config, 'activation_checkpointing': checkpointing}
        largest, totals = largest_batch(checkpointed, budget_bytes, config['loss'], progress=progress)
        choice = dict(activation_checkpointing=checkpointing, largest_batch_size=largest,
                      largest_total_bytes=totals.get(largest), batch_size=None, gradient_accumulation_steps=None,
                      tokens_per_step=None, command=None)
        if largest is not None:
            batch_size, accumulation = fewest_micro_steps(config, largest)
            choice.update(batch_size=batch_size, gradient_accumulation_steps=accumulation,
                          tokens_per_step=batch_size * config['block_size'] * accumulation,
                          command=changes(config, dict(activation_checkpointing=checkpointing, batch_size=batch_size,
                                                       gradient_accumulation_steps=accumulation)))
        choices.append(choice)
    if all(choice['batch_size'] is None for choice in choices):
        with_checkpointing = ' with activation checkpointing' if choices[-1]['activation_checkpointing'] else ''
        raise ConfigError(f"gpu_memory_gb={config['gpu_memory_gb']}: even batch_size=1{with_checkpointing} needs "
                          f"{gib(totals[1])}: use a larger card, or a smaller model or block_size")
    return choices


def ladder(config, budget_bytes, progress=silent):
    """Climb LADDER until a rung fits `budget_bytes`, each rung at the config's micro-batch or the largest that fits,
    re-split to keep the tokens per step; a rung train.py would refuse here is skipped with the reason. A JSON-able
    dict a rung; the last tried has fits=True and `command`, the keys to add (every lever so far), unless none fits."""
    steps, levers = [], {}
    for name, keys, cost in LADDER:
        if keys.get('loss_chunk_mib', config['loss_chunk_mib']) > config['loss_chunk_mib']:
            continue  # the config's loss chunks are smaller already
        if 'parallelism' in keys and not zero1_splits_more(config['world_size'], config['parallelism']):
            continue
        rung = {**config, **levers, **keys}
        if rung['optimizer_in_backward']:  # one micro-step a step: at most the step's samples in one micro-batch
            rung.update(batch_size=config['batch_size'] * config['gradient_accumulation_steps'],
                        gradient_accumulation_steps=1)
        try:
            rules.check_config(rung, rung['world_size'], 'cuda')
        except ConfigError as e:
            steps.append(dict(rung=name, cost=cost, levers={**levers, **keys}, fits=False, skipped=str(e)))
            continue
        levers.update(keys)
        progress(f'ladder, + {name}')
        largest, totals = largest_batch(rung, budget_bytes, config['loss'], progress=progress)
        step = dict(rung=name, cost=cost, levers=dict(levers), batch_1_total_bytes=totals[1], fits=largest is not None,
                    skipped=None)
        steps.append(step)
        if largest is None:
            continue
        if largest >= rung['batch_size']:
            batch_size, accumulation = rung['batch_size'], rung['gradient_accumulation_steps']
        else:
            batch_size, accumulation = fewest_micro_steps(rung, largest)
        found = {**rung, 'batch_size': batch_size, 'gradient_accumulation_steps': accumulation}
        evaluation = trace(found, config['loss'], progress=progress)
        step.update(batch_size=batch_size, gradient_accumulation_steps=accumulation, largest_batch_size=largest,
                    total_bytes=total_bytes(evaluation['train']['peak_bytes']),
                    eval_total_bytes=total_bytes(evaluation['eval']['peak_bytes']),
                    tokens_per_step=batch_size * accumulation * rung['block_size'],
                    command={**levers, **changes(config, {'batch_size': batch_size,
                                                          'gradient_accumulation_steps': accumulation})})
        break
    return steps


def estimate(config, progress=silent, warm_start=False):
    """Everything main() reports for a checked config, as one JSON-able dict. progress: called with a line of text
    before each trace and at each of its micro-steps; warm_start: see trace."""
    card_bytes = int(config['gpu_memory_gb'] * GIB)
    budget_bytes = budget(config, card_bytes)
    result = trace(config, config['loss'], progress=progress, warm_start=warm_start)
    train = result['train']  # None with eval_only: train.py evaluates once and stops
    result['allowance'] = allowance((train or result['eval'])['peak_bytes'])
    result['total_bytes'] = total_bytes(train['peak_bytes']) if train else None
    result['eval_total_bytes'] = total_bytes(result['eval']['peak_bytes'])
    result['gpu_memory_bytes'] = card_bytes
    result['headroom_bytes'] = card_bytes - budget_bytes
    result['budget_bytes'] = budget_bytes
    result['needed_bytes'] = max(result['total_bytes'] or 0, result['eval_total_bytes'])  # or 0: eval_only
    result['fits'] = result['needed_bytes'] <= budget_bytes
    if config['find_batch_size']:
        result['find_batch_size'] = find_batch_sizes(config, budget_bytes, progress)
    if config['ladder']:  # a config that fits needs no lever: an empty ladder
        result['ladder'] = [] if result['fits'] else ladder(config, budget_bytes, progress)
    if config['measure']:
        progress('measuring on the GPU')
        result['measured'] = measure(config, config['loss'])
    return result


def run_summary(config, card_bytes):
    """train.py's record of its run's estimate (wandb's run config), in GiB: the traced tensor peak of training (what
    torch.cuda.max_memory_allocated measures), the totals with the allowance of training and evaluation, the card's
    memory and whether both fit it (training's None with eval_only). `config` has train.py's keys (world_size
    defaults to 1)."""
    result = estimate({**ESTIMATOR_DEFAULTS, **config, 'gpu_memory_gb': card_bytes / GIB}, warm_start=True)
    train = result['train']
    return dict(train_peak_gib=train['peak_bytes'] / GIB if train else None,
                total_gib=result['total_bytes'] / GIB if train else None,
                eval_total_gib=result['eval_total_bytes'] / GIB, card_gib=card_bytes / GIB, fits=result['fits'])
