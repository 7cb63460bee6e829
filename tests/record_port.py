"""What the record ports' tests (tests/unit/test_record_port*.py) share: our GPT and optimizer, built by
training.step.build from a preset's keys, taken through two of train.py's iterations from given weights, and the
results compared with a reference's under the record's parameter names."""
import math

import torch

from training import rules, step
from training.optim import schedule_groups
from training.schedule import scheduled_lr, scheduled_window


class KeepsGradients:
    """The optimizer, keeping a copy of the gradients of each step (train_step frees them after it)."""

    def __init__(self, optimizer, model):
        self.optimizer, self.names, self.grads = optimizer, {p: n for n, p in model.named_parameters()}, []

    def step(self):
        self.grads.append({self.names[p]: p.grad.clone() for p in self.names if p.grad is not None})
        self.optimizer.step()

    def zero_grad(self, set_to_none=True):
        self.optimizer.zero_grad(set_to_none=set_to_none)


def relative_error(a, b):
    return ((a - b).abs().max() / b.abs().max().clamp(min=1e-30)).item()


def our_steps(config, vocab_size, weights, first, x, y):
    """(loss, gradients, weights after) of each of two of train.py's iterations from `first`, as each is taken, under
    our names, for the model and optimizer of `config` from `weights` (ours: {name: tensor}; those the model has), in
    float64; x, y: 2 rows, one a micro-step."""
    model_args, _ = rules.model_args(config, vocab_size)
    model, optimizer = step.build(config, model_args, 'cpu', 'cpu')
    model.double()
    state = model.state_dict()
    with torch.no_grad():
        for name, t in weights.items():
            if name in state:  # a mutated config's model may lack some
                state[name].copy_(t)
    optimizer = KeepsGradients(optimizer, model)
    batches = step.Prefetcher(iter([(x[:1], y[:1]), (x[1:], y[1:])] * 3))  # the 2 rows as 2 micro-steps, and ahead
    for it in (first, first + 1):
        schedule_groups(optimizer.optimizer, it, scheduled_lr(it, config), config)  # as train.py's loop
        window = scheduled_window(it, config)
        with torch.no_grad():
            _, loss = model(x, y, attn_window=window)  # in float64: train_step sums the losses it logs in fp32
        logged, _ = step.train_step(model, optimizer, batches, config['gradient_accumulation_steps'],
                                    grad_clip=config['grad_clip'], forward_args=dict(attn_window=window))
        assert relative_error(logged.double(), loss) < 1e-6
        after = {n: p.detach().clone() for n, p in model.named_parameters()}
        yield loss, optimizer.grads[-1], after


def disagreements(config, vocab_size, weights, x, y, first_steps, reference_step, to_ours, to_record, tolerance,
                  references=None):
    """(what, relative error) over `tolerance` between our_steps and the reference's two steps from each of
    `first_steps`, from the same `weights` (the record's names): the loss, the gradients and the weights after each
    step, of the parameters both have, under the record's names. Yielded as found, step by step, so that a caller
    asking whether there is any stops at the first step that has one. reference_step(weights, state, x, y, it) ->
    (loss, grads, weights, state); to_ours, to_record: the weight map each way. references: a dict that keeps the
    reference's steps by first step, for callers whose every call has the same weights and batch (a test module's
    cases, each changing only the port)."""
    references = {} if references is None else references
    for first in first_steps:
        if first not in references:
            steps, state, w = [], {}, weights
            for it in (first, first + 1):
                loss, grads, w, state = reference_step(w, state, x, y, it)
                steps.append((loss, grads, w))
            references[first] = steps
        ours = our_steps(config, vocab_size, to_ours(weights), first, x, y)
        for i, ((loss, grads, after), b_step) in enumerate(zip(ours, references[first])):
            a_step = loss, to_record(grads), to_record(after)
            for kind, a, b in [('loss', a_step[0], b_step[0]),
                               *((f'grad {n}', a_step[1][n], b_step[1][n]) for n in b_step[1] if n in a_step[1]),
                               *((f'weight {n}', a_step[2][n], b_step[2][n]) for n in b_step[2] if n in a_step[2])]:
                error = relative_error(a.double(), b)
                if error > tolerance or math.isnan(error):
                    yield f'step {first + i}: {kind}', error
