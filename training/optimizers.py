"""
The optimizer classes training/optim.py builds for train.py's `optim` key: AdamW a slice at a time with bf16 moments
or bf16 weights (stochastic rounding), torchao's 8-bit AdamW adapted to train.py, torch's Muon with modded-nanogpt's
momentum forms and split matrices, MuonAdamW (both as one optimizer), and the step fused into backward. Every AdamW
variant computes torch.optim.AdamW's update in fp32. docs/memory.md says what each saves and costs.
"""
import contextlib
import math

import torch

# Muon's momentum (muon_momentum_form), the default first: 'ema' torch's, 'sum' and 'ema_eps' modded-nanogpt's of
# Nov 2024 and of Dec 2024 on (Muon's docstring)
MUON_MOMENTUM_FORMS = ('ema', 'sum', 'ema_eps')


# Elements updated at once by the non-fused steps below: their temporaries (about 16 bytes an element for
# adamw_bf16, 40 for torchao's eager 8-bit step) stay within a few tens of MiB even for GPT-2's (50257, 1600)
# embedding; a multiple of torchao's 8-bit block of 256.
CHUNK_ELEMENTS = 2 ** 20


# Set by estimate_memory.py's trace, under FakeTensorMode, where tensors have no values: which parameters the sliced
# steps below update, 'all', 'representative' (representative_updates_only) or 'none' (states_only).
_updates = 'all'


@contextlib.contextmanager
def _updating(which):
    global _updates
    previous, _updates = _updates, which
    try:
        yield
    finally:
        _updates = previous


def representative_updates_only():
    """The sliced steps below update only the last parameter of each shape (the others get their state, no update)
    and of it only the first two chunks and the last: the same memory peak, in a fraction of the time, for
    estimate_memory.py's trace (fake tensors: no values to get wrong)."""
    return _updating('representative')


def states_only():
    """The sliced steps below create each parameter's state and count its step, and update nothing: the trace's
    warm-up step, whose peak is not measured, in a fraction of the time."""
    return _updating('none')


def _chunks(*tensors):
    """Matching flat slices (views) of tensors of one shape, CHUNK_ELEMENTS elements at a time."""
    flat = [t.reshape(-1) for t in tensors]  # views: parameters, gradients and states are contiguous
    starts = range(0, flat[0].numel(), CHUNK_ELEMENTS)
    if _updates == 'representative' and len(starts) > 3:
        # exact: a chunk's memory depends only on its size and the previous chunk's (whose results it frees), and
        # these chunks make every (previous, current) pair of sizes that all make; the states exist in full already
        starts = (starts[0], starts[1], starts[-1])
    for start in starts:
        yield [t[start:start + CHUNK_ELEMENTS] for t in flat]


def _store_bf16_stochastic(dst, x):
    """dst (bf16) = x (fp32, overwritten) rounded up or down at random, in proportion to the distance, so that the
    expected value is x. Round-to-nearest would drop every update smaller than half a bf16 step (1/512 relative):
    a second moment with beta2 = 0.99 or more could stop decaying. The noise comes from torch's RNG, which
    train.py's checkpoints save, so resumed runs repeat."""
    bits = x.view(torch.int32)
    bits.add_(torch.randint_like(bits, 0, 1 << 16)).bitwise_and_(-65536)  # low 16 bits cleared: the cast is exact
    dst.copy_(x)


def _closure_loss(closure):
    """What torch's optimizers do with step's closure: the loss it returns, computed with gradients enabled."""
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()


def _params_to_step(optimizer, new_moments):
    """(group, parameter, state) for each of `optimizer`'s parameters that has a gradient, its state created on first
    use (a step counter and the moments exp_avg, exp_avg_sq = new_moments(parameter)) and its step counted. Under
    representative_updates_only, only the last parameter of each shape and dtype: an update's memory depends on those
    alone, and the states created so far only grow, so the last one's peak is the highest of them all."""
    params = [(group, p) for group in optimizer.param_groups for p in group['params'] if p.grad is not None]
    last = {(p.shape, p.dtype, p.grad.dtype): i for i, (_, p) in enumerate(params)}
    for i, (group, p) in enumerate(params):
        state = optimizer.state[p]
        if not state:
            state['step'] = torch.tensor(0.0)
            state['exp_avg'], state['exp_avg_sq'] = new_moments(p)
        state['step'] += 1
        if _updates == 'all' or (_updates == 'representative' and last[(p.shape, p.dtype, p.grad.dtype)] == i):
            yield group, p, state


class SlicedAdamW(torch.optim.Optimizer):
    """torch's AdamW update (decoupled weight decay, bias correction) in fp32, a slice of a parameter at a time, with
    the moments stored in `moment_dtype` and the parameter in its own dtype: bf16 values (bf16 moments, bf16 weights)
    are written back with stochastic rounding, so that updates smaller than half a bf16 step are not lost (the
    weights keep no fp32 copy). Slice by slice, the fp32 temporaries stay small: a foreach version would hold fp32
    copies of all the moments at once, the memory this optimizer exists to save."""
    moment_dtype = torch.float32

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    def load_state_dict(self, state_dict):
        """torch's load_state_dict casts the moments to their parameter's dtype: cast back to the one kept here."""
        super().load_state_dict(state_dict)
        for state in self.state.values():
            for key in ('exp_avg', 'exp_avg_sq'):
                if key in state:
                    state[key] = state[key].to(self.moment_dtype)

    @torch.no_grad()
    def step(self, closure=None):
        def new_moments(p):
            exp_avg = torch.zeros_like(p, dtype=self.moment_dtype, memory_format=torch.preserve_format)
            return exp_avg, torch.zeros_like(exp_avg)

        loss = _closure_loss(closure)
        for group, p, state in _params_to_step(self, new_moments):
            lr, (beta1, beta2), eps, weight_decay = group['lr'], group['betas'], group['eps'], group['weight_decay']
            step = state['step'].item()
            bias_correction1, bias_correction2 = 1 - beta1 ** step, 1 - beta2 ** step
            for param, grad, m, v in _chunks(p, p.grad, state['exp_avg'], state['exp_avg_sq']):
                grad = grad.float()  # fp32 tensors are updated in place, the others through an fp32 copy
                exp_avg, exp_avg_sq, weights = m.float().lerp_(grad, 1 - beta1), v.float(), param.float()
                exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                weights.mul_(1 - lr * weight_decay)
                denom = exp_avg_sq.sqrt().div_(math.sqrt(bias_correction2)).add_(eps)
                weights.addcdiv_(exp_avg, denom, value=-lr / bias_correction1)
                del denom
                for stored, value in ((m, exp_avg), (v, exp_avg_sq), (param, weights)):
                    if stored.dtype == torch.bfloat16:
                        _store_bf16_stochastic(stored, value)
        return loss


class AdamWBF16(SlicedAdamW):
    """SlicedAdamW with both moments in bf16: 4 bytes a parameter instead of 8."""
    moment_dtype = torch.bfloat16


def warm_up(optim):
    """What `optim` computes once on real tensors: torchao's 8-bit code maps (lists of floats, cached), which cannot
    be computed under estimate_memory.py's FakeTensorMode."""
    if optim == 'adamw_8bit':
        from torchao.optim.subclass_8bit import get_qmap_signed, get_qmap_unsigned
        get_qmap_signed(), get_qmap_unsigned()


def torchao_adamw8bit(bf16_weights):
    """torchao.optim.AdamW8bit (moments in 8 bits with one fp32 scale per block of 256; tensors under 4096 elements
    stay fp32), with two adaptations to train.py: the learning rate may be set as a float (torchao wants a tensor),
    and off CUDA the update runs eagerly, slice by slice: torchao compiles it for each parameter shape, minutes on a
    CPU, and compiled code cannot be traced by estimate_memory.py. The update is torchao's own single_param_adam."""
    from torchao.optim import AdamW8bit
    from torchao.optim.adam import single_param_adam

    class TorchaoAdamW8bit(AdamW8bit):
        @torch.no_grad()
        def step(self, closure=None):
            for group in self.param_groups:  # train.py assigns the scheduled lr as a float
                if not isinstance(group['lr'], torch.Tensor):
                    group['lr'] = torch.tensor(group['lr'], dtype=torch.float32)
            params = [p for group in self.param_groups for p in group['params'] if p.grad is not None]
            if all(p.device.type == 'cuda' for p in params):
                return super().step(closure)
            def new_moments(p):  # torchao's 8-bit buffers: signed for exp_avg, unsigned for exp_avg_sq
                return self._new_buffer(p, True), self._new_buffer(p, False)

            loss = _closure_loss(closure)
            for group, p, state in _params_to_step(self, new_moments):  # torchao's step, eager
                for param, grad, m, v in _chunks(p.detach(), p.grad, state['exp_avg'], state['exp_avg_sq']):
                    single_param_adam(param, grad, state['step'], m, v, None, group['lr'], group['betas'][0],
                                      group['betas'][1], group['weight_decay'], group['eps'], True,
                                      self.bf16_stochastic_round)
            return loss

    if bf16_weights:
        class TorchaoAdamW8bitSR(TorchaoAdamW8bit):
            """bf16 weights: torchao writes each update back with stochastic rounding."""
            def __init__(self, params, **options):
                super().__init__(params, **{'bf16_stochastic_round': True, **options})
        return TorchaoAdamW8bitSR
    return TorchaoAdamW8bit


def newton_schulz(g, coefficients, steps, eps, clamp):
    """Muon's orthogonalization of the matrix g: torch's _zeropower_via_newtonschulz, the same operations in bf16, or
    in float64 for float64 g (an exact comparison's). clamp: g divided by max(norm, eps) as torch's, else by norm + eps
    as modded-nanogpt's."""
    a, b, c = coefficients
    x = g.to(torch.float64 if g.dtype == torch.float64 else torch.bfloat16)
    tall = g.size(0) > g.size(1)
    if tall:
        x = x.T
    norm = x.norm()
    x = x / (norm.clamp(min=eps) if clamp else norm + eps)
    for _ in range(steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.T if tall else x


class Muon(torch.optim.Muon):
    """torch's Muon (its hyperparameters, state and update, to the bit), and two more keys a group may set:
    'momentum_form' (muon_momentum_form): 'ema', torch's, the momentum an average, buf = lerp(buf, g, 1 - mu) and
    Nesterov's lerp(g, buf, mu), orthogonalized after dividing by max(norm, eps); 'sum', modded-nanogpt's until
    Nov 2024, buf = mu * buf + g and g + mu * buf, divided by norm + eps; 'ema_eps', its records' from Dec 2024,
    'ema' divided by norm + eps. For a constant mu they point the same way; while mu warms up, 'ema' and 'ema_eps'
    weigh each gradient by its step's 1 - mu. 'split' (k): the matrix's k blocks of rows orthogonalized each on its
    own, each with its own lr adjustment (muon_split_qkv: c_attn's q, k and v)."""

    def __init__(self, params, momentum_form=MUON_MOMENTUM_FORMS[0], split=1, **options):
        super().__init__(params, **options)
        self.defaults.update(momentum_form=momentum_form, split=split)
        fill_defaults(self.param_groups, self.defaults)

    @torch.no_grad()
    def step(self, closure=None):
        loss = _closure_loss(closure)
        for group in self.param_groups:
            lr, mu, nesterov, form = group['lr'], group['momentum'], group['nesterov'], group['momentum_form']
            for p in group['params']:
                if p.grad is None:
                    continue
                grad, state = p.grad, self.state[p]
                if 'momentum_buffer' not in state:
                    state['momentum_buffer'] = torch.zeros_like(grad, memory_format=torch.preserve_format)
                buf = state['momentum_buffer']
                if form == 'sum':
                    buf.mul_(mu).add_(grad)
                    update = grad.add(buf, alpha=mu) if nesterov else buf
                else:
                    buf.lerp_(grad, 1 - mu)
                    update = grad.lerp(buf, mu) if nesterov else buf
                p.mul_(1 - lr * group['weight_decay'])
                for rows, block in zip(p.chunk(group['split']), update.chunk(group['split'])):
                    ortho = newton_schulz(block, group['ns_coefficients'], group['ns_steps'], group['eps'],
                                          clamp=form == 'ema')  # 'sum' and 'ema_eps': norm + eps
                    rows.add_(ortho, alpha=-lr * math.sqrt(max(1, block.size(0) / block.size(1))))  # torch's adjustment
        return loss


def fill_defaults(groups, defaults):
    """Give `groups` the `defaults` they lack: a checkpoint's groups replace an optimizer's own on loading, and one
    written before a key existed lacks it."""
    for group in groups:
        for key, value in defaults.items():
            group.setdefault(key, value)


class MuonAdamW(torch.optim.Optimizer):
    """Muon (torch's, as above) for the parameter groups marked 'muon': True (2-D matrices only), torch's AdamW for the
    others, as one optimizer. Both optimizers work on this one's group dicts and share its `state` (parameter ->
    state; the parameters are disjoint), so everything that takes an optimizer takes this one as it is: setting 'lr'
    in param_groups schedules both, GradScaler unscales and steps it, ZeroRedundancyOptimizer builds one over its
    share of each group, and state_dict() is torch's layout, indexed through the groups in order, holding Muon's
    momentum_buffer for the matrices and AdamW's step, exp_avg and exp_avg_sq for the rest. Each group keeps its own
    hyperparameters: Muon's momentum (nesterov, 5 Newton-Schulz steps and its lr adjustment max(1, rows/cols)^0.5
    are torch's defaults, Keller Jordan's), AdamW's betas."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.95), weight_decay=0.0, momentum=0.95, fused=None):
        super().__init__(params, dict(lr=lr, weight_decay=weight_decay, muon=False))
        muon_groups = [group for group in self.param_groups if group['muon']]
        adamw_groups = [group for group in self.param_groups if not group['muon']]
        # each takes the groups given (the same dicts, adding its defaults); empty kinds get no optimizer
        self.parts = ([Muon(muon_groups, lr=lr, momentum=momentum)] if muon_groups else []) + \
            ([torch.optim.AdamW(adamw_groups, lr=lr, betas=betas, fused=fused)] if adamw_groups else [])
        self._share()

    def _share(self):
        """Point the parts at this optimizer's groups and state (again after load_state_dict, which replaces both)."""
        for part in self.parts:
            muon = isinstance(part, Muon)
            part.param_groups = [group for group in self.param_groups if group['muon'] == muon]
            fill_defaults(part.param_groups, part.defaults)
            part.state = self.state

    @torch.no_grad()
    def step(self, closure=None):
        loss = _closure_loss(closure)
        for part in self.parts:
            part.step()
        return loss

    def load_state_dict(self, state_dict):
        super().load_state_dict(state_dict)
        self._share()


class OptimizerInBackward:
    """The optimizer's step fused into backward: one optimizer of the same class and hyperparameters per parameter,
    run by a post-accumulate-grad hook as soon as backward has finished that parameter's gradient, which is then
    freed. The update is the same as the standard loop's; only the gradients' lifetime changes. It cannot honour
    gradient accumulation (the step would come after the first micro-batch), clipping by the global norm (no norm
    exists until every gradient does), GradScaler's fp16 loss scaling (it unscales and skips steps after backward)
    or DDP (the hook fires before the gradients are all-reduced): train.py refuses those. Under torch.compile the
    compiled backward returns its gradients together, which can take back much of the saving: use compile=False.

    It stands in for the optimizer in train.py's loop: `param_groups` lists every parameter's group (setting 'lr'
    there schedules the learning rate), step() updates only parameters whose gradient backward did not consume
    (none in training), zero_grad() frees any left, and state_dict() is nanoGPT-shaped: the state dict of the single
    optimizer over configure_optimizers' two groups, so checkpoints load either way."""

    def __init__(self, optimizer):
        self.groups = []  # configure_optimizers' groups: (hyperparameters, parameters)
        self.optimizers = {}  # parameter -> its own optimizer
        for group in optimizer.param_groups:
            options = {k: (float(v) if k == 'lr' else v) for k, v in group.items() if k != 'params'}
            self.groups.append((options, list(group['params'])))
            for p in group['params']:
                self.optimizers[p] = type(optimizer)([{**options, 'params': [p]}], lr=options['lr'])
                p.register_post_accumulate_grad_hook(self._step)

    def _step(self, p):
        self.optimizers[p].step()
        p.grad = None

    @property
    def param_groups(self):
        return [group for opt in self.optimizers.values() for group in opt.param_groups]

    @property
    def state(self):
        return {p: opt.state[p] for p, opt in self.optimizers.items() if p in opt.state}

    def step(self, closure=None):
        assert closure is None, 'optimizer_in_backward steps in backward: no closure'
        for p, opt in self.optimizers.items():
            if p.grad is not None:
                opt.step()

    def zero_grad(self, set_to_none=True):
        for p in self.optimizers:
            p.grad = None

    def state_dict(self):
        """{'state': {index: state}, 'param_groups': [group with 'params': [indices]]}, indices counting the
        parameters through configure_optimizers' groups in order, as torch.optim.Optimizer.state_dict does."""
        state, param_groups, index = {}, [], 0
        for options, params in self.groups:
            for offset, p in enumerate(params):
                saved = self.optimizers[p].state_dict()
                if saved['state']:
                    state[index + offset] = saved['state'][0]
            first = self.optimizers[params[0]].state_dict()['param_groups'][0] if params else dict(options)
            param_groups.append({**{k: v for k, v in first.items() if k != 'params'},
                                 'params': list(range(index, index + len(params)))})
            index += len(params)
        return {'state': state, 'param_groups': param_groups}

    def load_state_dict(self, state_dict):
        saved_groups = state_dict['param_groups']
        if [len(g['params']) for g in saved_groups] != [len(params) for _, params in self.groups]:
            raise ValueError("loaded state dict's parameter groups do not match the model's")
        for (_, params), saved in zip(self.groups, saved_groups):
            options = {k: v for k, v in saved.items() if k != 'params'}
            for p, index in zip(params, saved['params']):
                own = {0: state_dict['state'][index]} if index in state_dict['state'] else {}
                self.optimizers[p].load_state_dict({'state': own, 'param_groups': [{**options, 'params': [0]}]})
