"""
The training of modded-nanogpt's single-GPU record of 24 Jan 2026, for gpt2026.py's GPT2026: its schedules, pure
functions of the step, and its optimizer, NorMuonAdam. docs/record_2026.md says what each piece does;
tests/unit/training/test_record2026.py proves them equal to the record's in float64.

One step of the record, as a training loop runs it:
    model.fit_rotary(windows_at(step)[1])
    optimizer.schedule(step)
    for each micro-batch (rows of the step's batch_size_at(step) tokens):
        _, loss = model(x, y, windows=windows_at(step), mtp_weights=mtp_weights_at(step), reduction='sum')
        (loss * GRADIENT_SCALE).backward()
    optimizer.step()
    optimizer.zero_grad()
    if step == SPLIT_STEP:
        split_embedding(model, optimizer)
and its validation at step NUM_ITERATIONS with windows_at(NUM_ITERATIONS, final_validation=True).
"""
import math

import numpy as np
import torch
import torch.distributed as dist

from training.parallel import world_size

# the record's Hyperparameters
SCHEDULED_ITERATIONS = 1560  # the lr, window and batch-size schedules run over these steps
NUM_ITERATIONS = SCHEDULED_ITERATIONS + 40  # then 40 more at the last batch size and window, lr at 0.1 of its peak
BATCH_SIZES = (8 * 2048 * 8, 16 * 2048 * 8, 24 * 2048 * 8)  # tokens a step over each third, the extension's the last
LR_PEAKS = (1.0, 1.52, 1.73)  # lr factor over each third: (16/8)**0.6, (24/8)**0.5 as the batch grows
COOLDOWN_FRAC = 0.55  # the lr factor falls linearly to 0.1 over the last 55% of the scheduled steps
WINDOW_BLOCK = 128  # windows count blocks of 128 tokens
LONG_WINDOWS = (3, 7, 11)  # blocks over each third; the short window is half the long one (rounded down)
EXTENSION_WINDOW = 13  # the extension's long window
VALIDATION_WINDOW = 20  # the final validation's long window, past the rotary fitted to 13
MAX_DOCUMENT_TOKENS = 16 * WINDOW_BLOCK  # training rows' documents are cut to 2,048 tokens (train_max_seq_len)
SPLIT_STEP = math.ceil(2 / 3 * SCHEDULED_ITERATIONS) | 1  # 1041, odd: an Adam step, after which the embedding splits
GRADIENT_SCALE = 1 / 8  # each micro-batch's summed loss is divided by the record's 8 micro-batches a step

# the optimizers' hyperparameters, multiplied per parameter by ADAM_TABLE's and NORMUON_TABLE's multipliers
ADAM_LR, ADAM_EPS, ADAM_WEIGHT_DECAY = 0.008, 1e-10, 0.005
NORMUON_LR, NORMUON_BETA2, NORMUON_WEIGHT_DECAY = 0.023, 0.95, 1.2
# label: (betas, lr multiplier, weight-decay multiplier)
ADAM_TABLE = {
    'scalars': ((0.9, 0.99), 5.0, 0.0),  # the lambdas but x0's
    'x0_lambdas': ((0.65, 0.95), 5.0, 0.0),
    'value_embeds': ((0.75, 0.95), 75.0, 5.0),
    'bigram_embed': ((0.75, 0.95), 75.0, 5.0),
    'smear_gate': ((0.9, 0.99), 0.01, 0.0),
    'skip_gate': ((0.9, 0.99), 0.05, 0.0),
    'attention_gates': ((0.9, 0.99), 1.0, 1.0),  # attention's output and value gates
    'embeddings': ((0.5, 0.95), 1.0, 150.0),  # lm_head, and wte once split
}
# label: (the parameter's number of matrices along dim 0, lr multiplier): each matrix is orthogonalized on its own;
# the MLP's lr doubles by the shape of the record's (3072, 768) matrices, max(1, 3072 / 768)**0.5, c_proj's again
NORMUON_TABLE = {'attn.c_attn': (3, 1.0), 'attn.c_proj': (1, 1.0), 'mlp.c_fc': (1, 2.0), 'mlp.c_proj': (1, 4.0)}
# Polar Express's (a, b, c) for 5 iterations of X <- a X + (b A + c A^2) X, A = X X^T (safety 2e-2, cushion 2)
POLAR_EXPRESS = ((8.156554524902461, -22.48329292557795, 15.878769915207462),
                 (4.042929935166739, -2.808917465908714, 0.5000178451051316),
                 (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
                 (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
                 (2.3465413258596377, -1.7097828382687081, 0.42323551169305323))


def batch_size_at(step):
    """Tokens in the step's batch: a third of the scheduled steps at each size, the extension at the last."""
    if step >= SCHEDULED_ITERATIONS:
        return BATCH_SIZES[-1]
    return BATCH_SIZES[int(len(BATCH_SIZES) * (step / SCHEDULED_ITERATIONS))]


def windows_at(step, final_validation=False):
    """(short, long) attention windows in tokens at `step`; final_validation: the long one of the last validation."""
    if step >= SCHEDULED_ITERATIONS:
        long = VALIDATION_WINDOW if final_validation else EXTENSION_WINDOW
        return EXTENSION_WINDOW // 2 * WINDOW_BLOCK, long * WINDOW_BLOCK
    long = LONG_WINDOWS[int(len(LONG_WINDOWS) * (step / SCHEDULED_ITERATIONS))]
    return long // 2 * WINDOW_BLOCK, long * WINDOW_BLOCK


def lr_factor_at(step):
    """Every parameter's lr multiplier: each third's peak (higher as the batch grows), from 45% of the scheduled
    steps falling linearly to 0.1, then 0.1 over the extension."""
    if step > SCHEDULED_ITERATIONS:
        return 0.1
    x = step / SCHEDULED_ITERATIONS
    peak = LR_PEAKS[2] if x > 2 / 3 else LR_PEAKS[1] if x > 1 / 3 else LR_PEAKS[0]
    if x >= 1 - COOLDOWN_FRAC:
        w = (1 - x) / COOLDOWN_FRAC
        return peak * w + (1 - w) * 0.1
    return peak


def momentum_at(step, warmup=300, cooldown=50, low=0.85, high=0.95):
    """NorMuon's momentum: from 0.85 up to 0.95 over the first 300 steps, down again over the last 50."""
    if step < warmup:
        return low + step / warmup * (high - low)
    if step > NUM_ITERATIONS - cooldown:
        return high - (step - (NUM_ITERATIONS - cooldown)) / cooldown * (high - low)
    return high


def mtp_weights_at(step):
    """The multi-token prediction weights (next token, the one after, ...) as fp32 values (the record's tensor):
    1, 0.5, 0.25 -> 0 over the first third, 1, 0.5 -> 0 over the second, then the next token alone."""
    x = step / SCHEDULED_ITERATIONS
    if x < 1 / 3:
        weights = [1.0, 0.5, 0.25 * (1 - 3 * x)]
    elif x < 2 / 3:
        weights = [1.0, 0.5 * (1 - (3 * x - 1))]
    else:
        weights = [1.0]
    return tuple(np.array(weights, dtype=np.float32).tolist())  # numpy's: no fake tensor under the memory estimator


def adam_steps_at(step):
    """Adam updates its parameters on odd steps only, with the gradients of the two steps summed."""
    return step % 2 == 1


def polar_express(g, dtype=None):
    """The orthogonal factor U V^T of each matrix of g (..., rows, cols) = U S V^T, approximately (Polar Express: the
    singular values pushed towards 1 by 5 odd polynomials), in `dtype` (None: g's; the record's bf16)."""
    x = g.to(dtype or g.dtype)
    tall = x.size(-2) > x.size(-1)
    if tall:  # iterate on the wide side: A = X X^T is the smaller square
        x = x.mT
    x = x / (x.norm(dim=(-2, -1), keepdim=True) * (1 + 2e-2) + 1e-6)  # spectral norm at most 1
    for a, b, c in POLAR_EXPRESS:
        A = x @ x.mT
        x = a * x + (b * A + c * A @ A) @ x
    return x.mT if tall else x


def normuon_normalize(v, second_momentum, beta2):
    """NorMuon's variance step: each row of the orthogonalized update v (each column where v is wide: the longer
    side's vectors) divided by the root of its mean square's running average (second_momentum, updated in place),
    then each matrix scaled back to its Frobenius norm before the division."""
    reduced = -1 if v.size(-2) >= v.size(-1) else -2
    n = v.size(reduced)
    mean_square = v.square().mean(dim=reduced, keepdim=True)
    norm = (mean_square.sum(dim=(-2, -1), keepdim=True) * n).sqrt()
    second_momentum.lerp_(mean_square, 1 - beta2)
    scale = second_momentum.clamp_min(1e-10).rsqrt()
    new_norm = (mean_square * n * scale.square()).sum(dim=(-2, -1), keepdim=True).sqrt()
    return v * (scale * (norm / new_norm.clamp_min(1e-10)))


def cautious_mask(update, p, zero_too):
    """1.0 where p and its update have the same sign, else 0.0, in p's dtype: cautious weight decay decays p there
    alone, never against the update; zero_too: also where their product is 0 (NorMuon's; Adam's decays only where it
    is > 0). One temporary of p's size, the mask itself."""
    agree = torch.mul(update, p)
    return agree.ge_(0) if zero_too else agree.gt_(0)


def normuon_update(p, grad, state, lr, lr_multiplier, momentum, n_matrices, orthogonalization_dtype):
    """One NorMuon step of p: the gradient's running average (momentum), the Nesterov look-ahead orthogonalized
    (Polar Express) and normalized (normuon_normalize), then p -= lr * lr_multiplier * it, with cautious weight decay
    by NORMUON_WEIGHT_DECAY * lr times the update's lr."""
    buffer, second_momentum = state['momentum_buffer'], state['second_momentum']
    g = grad.to(buffer.dtype)
    buffer.lerp_(g, 1 - momentum)
    matrices = g.lerp(buffer, momentum).view(n_matrices, -1, p.size(-1))
    v = polar_express(matrices, orthogonalization_dtype).to(buffer.dtype)
    v = normuon_normalize(v, second_momentum, NORMUON_BETA2).view(p.shape)
    precise, update_lr = p.to(buffer.dtype), lr_multiplier * lr
    decay = precise * cautious_mask(v, precise, zero_too=True) * (NORMUON_WEIGHT_DECAY * lr * update_lr)
    p.copy_(precise - decay - v * update_lr)


def adam_update(p, grad, state, lr, betas, weight_decay):
    """One Adam step of p with bias correction, eps ADAM_EPS and cautious weight decay by lr**2 * weight_decay, in
    place as the record's: beside the state, two temporaries of p's size at the most (the update, the decay's mask),
    where each operation's own would be five (the bigram table's 0.72 GiB each, at the step's peak)."""
    beta1, beta2 = betas
    state['step'] += 1
    t = state['step']
    exp_avg, exp_avg_sq = state['exp_avg'], state['exp_avg_sq']
    g = grad.to(exp_avg.dtype)
    exp_avg.mul_(beta1).add_(g, alpha=1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 - beta2)
    update = exp_avg_sq.sqrt().add_(ADAM_EPS)
    update = torch.div(exp_avg, update, out=update).mul_(lr * ((1 - beta2 ** t) ** 0.5 / (1 - beta1 ** t)))
    precise = p.to(update.dtype)  # p itself, where it has the state's dtype
    update.addcmul_(precise, cautious_mask(update, precise, zero_too=False), value=lr * lr * weight_decay)
    if precise is p:
        p.sub_(update)
    else:
        p.copy_(precise.sub_(update))


def label(name):
    """The optimizer's label of one of GPT2026's parameters (by its name): a key of NORMUON_TABLE or ADAM_TABLE."""
    if name.endswith(('lambdas', '_lambda')):
        return 'x0_lambdas' if name == 'x0_lambdas' else 'scalars'
    if name in ('lm_head.weight', 'transformer.wte.weight'):
        return 'embeddings'
    if name.startswith('transformer.h.'):
        module, kind = name.split('.')[-3:-1]  # attn or mlp; c_attn, c_proj, c_fc, gate or value_gate
        return 'attention_gates' if kind in ('gate', 'value_gate') else f'{module}.{kind}'
    if name.startswith('transformer.'):
        return name.split('.')[1]  # bigram_embed, value_embeds
    return name[:-len('.weight')]  # smear_gate, skip_gate


class NorMuonAdam(torch.optim.Optimizer):
    """The record's optimizer for a GPT2026: NorMuon for the blocks' matrices, Adam for the rest, a parameter group
    per label of NORMUON_TABLE and ADAM_TABLE. schedule(step) before each step sets the lrs, NorMuon's momentum and
    whether Adam steps; zero_grad() then keeps the gradients of the parameters the step left alone, so that Adam's
    next step takes the sum of two steps' gradients, as the record's. While the model's embedding is tied, wte has
    no gradient and is not stepped: split_embedding gives it the head's weight and Adam state.
    Under torchrun each process holds the whole model, and step() first sums the gradients it updates over the
    processes (each one's are its micro-batches'), as the record's optimizer reduces them itself: no DDP wrapper,
    whose reduction would wait for wte's gradient while it has none (sum_over_processes). Each process holds and
    steps the whole optimizer, or after shard() (parallelism='zero1') its share (owners): the rows of Adam's
    parameters that divide among the processes, NorMuon's matrices and the rest whole, their state and their update,
    which it then sends to the others (share_updates), as the record's optimizer shares out its work.
    orthogonalization_dtype: Polar Express's (the record's bf16; None: the weights')."""

    def __init__(self, model, orthogonalization_dtype=torch.bfloat16):
        named = {}
        for name, p in model.named_parameters():
            named.setdefault(label(name), []).append(p)
        unknown = named.keys() - NORMUON_TABLE.keys() - ADAM_TABLE.keys()
        if unknown:
            raise ValueError(f"no optimizer for the parameters labelled {sorted(unknown)}: not GPT2026's")
        groups = [dict(params=named[key], label=key, kind='normuon', base_lr=NORMUON_LR, lr_multiplier=multiplier,
                       n_matrices=n_matrices) for key, (n_matrices, multiplier) in NORMUON_TABLE.items()]
        groups += [dict(params=named[key], label=key, kind='adam', base_lr=ADAM_LR, lr_multiplier=multiplier,
                        betas=betas, weight_decay=ADAM_WEIGHT_DECAY * wd_multiplier)
                   for key, (betas, multiplier, wd_multiplier) in ADAM_TABLE.items()]
        super().__init__(groups, dict(lr=0.0, momentum=0.0))
        self.orthogonalization_dtype = orthogonalization_dtype
        self.adam_steps = True
        self.owner = None  # shard(): the rank that steps each parameter, or SLICED
        self.rank, self.world = 0, 1

    def shard(self):
        """zero1 under torchrun: from here on this process keeps and steps the state of its share of the parameters
        alone (owners' over the processes of torch.distributed's default group), before any step."""
        assert not self.state, 'shard() before the first step: the state is handed out, not moved'
        self.rank, self.world = dist.get_rank(), world_size()
        self.owner = owners(self.param_groups, self.world)

    def owns(self, p):
        """Whether this process steps p, or rows of it."""
        return self.owner is None or self.owner[p] in (self.rank, SLICED)

    def rows(self, p, rank=None):
        """The rows of p (and of its state and gradient) that this process (or the process `rank`) steps: its share
        where p is SLICED, else all."""
        if self.owner is None or self.owner[p] != SLICED:
            return slice(None)
        share, rank = p.size(0) // self.world, self.rank if rank is None else rank
        return slice(rank * share, (rank + 1) * share)

    def schedule(self, step):
        """The record's lrs, momentum and Adam's turn for optimizer step `step` (from 0)."""
        for group in self.param_groups:
            group['lr'] = group['base_lr'] * lr_factor_at(step)  # the multiplier applies in the update
            group['momentum'] = momentum_at(step)
        self.adam_steps = adam_steps_at(step)

    def stepped_groups(self):
        return [group for group in self.param_groups if group['kind'] == 'normuon' or self.adam_steps]

    @torch.no_grad()
    def step(self):
        grads = sum_over_processes(self)
        for group in self.stepped_groups():
            for p in group['params']:
                if p not in grads:
                    continue
                part = p[self.rows(p)]  # a view: its update is p's
                state = self.state[p]
                if not state:
                    state.update(self.initial_state(part, group))
                if group['kind'] == 'normuon':
                    normuon_update(part, grads[p], state, group['lr'], group['lr_multiplier'], group['momentum'],
                                   group['n_matrices'], self.orthogonalization_dtype)
                else:
                    adam_update(part, grads[p], state, group['lr_multiplier'] * group['lr'], group['betas'],
                                group['weight_decay'])
        share_updates(self)

    @staticmethod
    def initial_state(p, group):
        """Zero moments in fp32 (fp64 for fp64 weights); NorMuon's second moment one value per row of each matrix
        (per column where it is wide)."""
        dtype = torch.promote_types(p.dtype, torch.float32)
        if group['kind'] == 'adam':
            return dict(step=0, exp_avg=torch.zeros_like(p, dtype=dtype), exp_avg_sq=torch.zeros_like(p, dtype=dtype))
        rows, cols = p.size(0) // group['n_matrices'], p.size(1)
        shape = (group['n_matrices'], rows, 1) if rows >= cols else (group['n_matrices'], 1, cols)
        return dict(momentum_buffer=torch.zeros_like(p, dtype=dtype),
                    second_momentum=torch.zeros(shape, dtype=dtype, device=p.device))

    def full_state_dict(self, master=True):
        """state_dict(), after shard() with every process's share, received by the master in host memory: a
        collective, every process calls it; the others get None."""
        whole = self.state_dict()
        if self.owner is None:
            return whole
        # what each process holds: the state's indices (state_dict's, over the groups' parameters) and numbers
        held = [None] * self.world
        dist.all_gather_object(held, {i: {k: v for k, v in state.items() if not torch.is_tensor(v)}
                                      for i, state in whole['state'].items()})
        params = [(p, group) for group in self.param_groups for p in group['params']]
        for i, (p, group) in enumerate(params):
            owner = self.owner[p]
            senders = range(1, self.world) if owner == SLICED else [owner] if owner != 0 else []
            if not senders or i not in held[senders[0]]:
                continue
            shapes = {k: v for k, v in self.initial_state(p.detach().to('meta'), group).items() if torch.is_tensor(v)}
            if self.rank in senders:
                for key in sorted(shapes):
                    dist.send(self.state[p][key], dst=0)
            elif self.rank == 0:  # in host memory: the owner's state, or each process's rows of it
                full = {k: torch.empty(v.shape, dtype=v.dtype) for k, v in shapes.items()}
                for key in sorted(shapes):
                    for sender in senders:
                        part = torch.empty_like(full[key][self.rows(p, sender)], device=p.device)
                        dist.recv(part, src=sender)
                        full[key][self.rows(p, sender)] = part.cpu()
                    if owner == SLICED:
                        full[key][self.rows(p)] = self.state[p][key].cpu()
                whole['state'][i] = {**full, **held[senders[0]][i]}
        whole['state'] = dict(sorted(whole['state'].items()))  # in parameter order, as one process's
        return whole if master else None

    def load_state_dict(self, state_dict):
        """A full state dict (full_state_dict's): after shard(), this process's share of it."""
        if self.owner is not None:
            params = [p for group in self.param_groups for p in group['params']]
            state = {}
            for i, saved in state_dict['state'].items():
                p = params[int(i)]
                if self.owns(p):
                    state[i] = {k: v[self.rows(p)] if torch.is_tensor(v) and v.shape == p.shape else v
                                for k, v in saved.items()}
            state_dict = {**state_dict, 'state': state}
        super().load_state_dict(state_dict)

    def zero_grad(self, set_to_none=True):
        """The gradients of the parameters the last step updated; Adam's wait for its step after a step without."""
        for group in self.stepped_groups():
            for p in group['params']:
                if set_to_none:
                    p.grad = None
                elif p.grad is not None:
                    p.grad.zero_()


SLICED = -1  # owners' mark of a parameter whose rows the processes share out
# the collectives of SLICED parameters: torch 2.13 renamed them (the old names warn); torch 2.4 has the old alone
REDUCE_SCATTER = getattr(dist, 'reduce_scatter_single', dist.reduce_scatter_tensor)
ALL_GATHER = getattr(dist, 'all_gather_single', dist.all_gather_into_tensor)


def owners(param_groups, world):
    """{parameter: the rank of `world` that keeps and steps it, or SLICED}: Adam's parameters whose rows divide among
    the processes are SLICED, each process stepping its rows (the record's sharded Adam); the others whole, the
    largest state first (Adam's two moments an element, NorMuon's one), each to the rank holding the least so far,
    the ranks then numbered from the largest share down (the memory estimator traces rank 0); the embeddings group
    (the head, and wte, which takes its state at the split) as one."""
    owner, units = {}, []
    for group in param_groups:
        moments = 2 if group['kind'] == 'adam' else 1
        params = [group['params']] if group['label'] == 'embeddings' else [[p] for p in group['params']]
        for unit in params:
            if group['kind'] == 'adam' and all(p.size(0) % world == 0 for p in unit):
                owner.update((p, SLICED) for p in unit)
            else:
                units.append((moments * sum(p.numel() for p in unit), unit))
    shares = [[0, []] for _ in range(world)]
    for size, unit in sorted(units, key=lambda u: -u[0]):  # stable: equal sizes in the groups' order
        share = min(shares, key=lambda s: s[0])
        share[0] += size
        share[1] += unit
    shares.sort(key=lambda s: -s[0])
    return {**owner, **{p: rank for rank, (_, params) in enumerate(shares) for p in params}}


def updated(optimizer):
    """The parameters the optimizer's step updates: those of its stepped groups with a gradient, the same on every
    process."""
    return [p for group in optimizer.stepped_groups() for p in group['params'] if p.grad is not None]


def wait_all(works):
    for work in works:
        work.wait()


@torch.no_grad()
def sum_over_processes(optimizer):
    """{parameter: the gradient of its rows this process steps} for the parameters the step updates: their gradients
    summed over the processes (a collective, in step: every process calls it), on every process (all_reduce), or
    after shard() on each parameter's owner (reduce) or each process's rows of it (reduce_scatter). Those left to
    Adam's next step stay each process's own, which that step sums with its micro-batches' (a checkpoint sums them:
    training.checkpoint.pending_gradients)."""
    params = updated(optimizer)
    if world_size() == 1:
        return {p: p.grad for p in params}
    grads, works = {}, []
    for p in params:
        if optimizer.owner is None:
            works.append(dist.all_reduce(p.grad, async_op=True))
            grads[p] = p.grad
        elif optimizer.owner[p] == SLICED:  # into a tensor of its own: the input's rows may not be the output
            grads[p] = torch.empty_like(p.grad[optimizer.rows(p)])
            works.append(REDUCE_SCATTER(grads[p], p.grad, async_op=True))
        else:
            works.append(dist.reduce(p.grad, dst=optimizer.owner[p], async_op=True))
            if optimizer.owner[p] == optimizer.rank:
                grads[p] = p.grad
    wait_all(works)
    return grads


@torch.no_grad()
def share_updates(optimizer):
    """After shard(): each updated parameter sent to every process from its owner, or each process's rows of it
    (a collective, in step)."""
    if optimizer.owner is None:
        return
    works, rows = [], []
    for p in updated(optimizer):
        if optimizer.owner[p] == SLICED:
            rows.append(p[optimizer.rows(p)].clone())  # kept until the gather is done
            works.append(ALL_GATHER(p, rows[-1], async_op=True))
        else:
            works.append(dist.broadcast(p, src=optimizer.owner[p], async_op=True))
    wait_all(works)


@torch.no_grad()
def split_embedding(model, optimizer):
    """The record's split, after SPLIT_STEP's update: the model's embedding becomes a copy of the head
    (GPT2026.untie_embedding) and takes the head's Adam state, moments and step count, to train on its own."""
    model.untie_embedding()
    head = optimizer.state.get(model.lm_head.weight)
    if head:  # after shard(), on the head's owner alone
        optimizer.state[model.transformer.wte.weight] = {k: v.clone() if torch.is_tensor(v) else v
                                                         for k, v in head.items()}
