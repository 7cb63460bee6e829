"""training/runs.py: what train.py does per model file. gpt2026.py's run takes the record's step as
docs/record_2026.md's loop writes it (the same weights after two steps through train_step, in float64), with its
micro-steps growing with the record's batch, its rotary, lrs and Adam's turn scheduled, the final validation's window
and the split after SPLIT_STEP; model.py's keeps train.py's schedule; each model file's model is built from its
model_args, nanoGPT's being model.py's."""
import copy
import itertools

import pytest
import torch

from training import attention
from training import configurator
import gpt2026
from helpers import tiny_gpt
from model import GPT
from training import record2026, runs
from training.schedule import scheduled_lr
from training.step import Prefetcher, train_step

RECORD = {**configurator.train_defaults(), 'model_file': 'gpt2026.py', 'n_layer': 11, 'n_head': 2, 'n_embd': 16,
          'doc_token': 0, 'block_size': 24, 'batch_size': 2, 'gradient_accumulation_steps': 2, 'device': 'cpu',
          'dtype': 'float32', 'max_iters': 1600}


def record_run():
    """gpt2026.py's run of RECORD in float64 (Polar Express too), its weights off their start, so that every piece
    acts."""
    torch.manual_seed(0)
    args = runs.record_model_args(RECORD, 20)
    model = runs.new_model(args, **runs.record_options(RECORD, args)).double()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p), alpha=0.1)
    return runs.make_run(RECORD, model, record2026.NorMuonAdam(model, orthogonalization_dtype=None))


def micro_batches(n):
    """n micro-batches of RECORD's 2 rows, documents starting at token 0 (each row at one)."""
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(1, 20, (n, 2, 25), generator=g)
    tokens[:, :, [0, 7, 15]] = 0
    return [(t[:, :-1], t[:, 1:]) for t in tokens]


def test_a_record_iterations_micro_steps_grow_with_the_records_batch():
    """gradient_accumulation_steps over the first third, then twice and three times as many, at the same micro-batch:
    the record's tokens a step in proportion at every step."""
    run = runs.make_run(RECORD, None, None)
    assert [run.micro_steps(it) for it in (0, 519, 520, 1039, 1040, 1599, 1600)] == [2, 2, 4, 4, 6, 6, 6]
    assert all(run.micro_steps(it) * record2026.BATCH_SIZES[0] == 2 * record2026.batch_size_at(it)
               for it in range(record2026.NUM_ITERATIONS + 1))


def test_two_steps_through_train_step_are_the_records_loop():
    """Steps 700 (NorMuon alone: Adam's gradients wait) and 701 (Adam on both steps' gradients): the weights after
    them, and the gradients kept between, are those of the loop docs/record_2026.md writes (each micro-batch's summed
    loss times GRADIENT_SCALE); the logged loss is the mean over positions of the step's weighted losses."""
    run, batches = record_run(), micro_batches(4)
    reference = copy.deepcopy(run.model)
    optimizer = record2026.NorMuonAdam(reference, orthogonalization_dtype=None)
    fed = Prefetcher(itertools.cycle(batches))
    for step in (700, 701):
        run.start_step(step)
        loss, _ = train_step(run.model, run.optimizer, fed, run.micro_steps(step), forward_args=run.forward_args(step),
                             gradient_scale=run.gradient_scale)
        reference.fit_rotary(record2026.windows_at(step)[1])
        optimizer.schedule(step)
        losses = []
        for x, y in batches:
            _, summed = reference(x, y, windows=record2026.windows_at(step),
                                  mtp_weights=record2026.mtp_weights_at(step), reduction='sum')
            (summed * record2026.GRADIENT_SCALE).backward()
            losses.append(summed.item() / x.numel())
        optimizer.step()
        optimizer.zero_grad()
        assert loss.item() == pytest.approx(sum(losses) / 4, rel=1e-12)
        pending = {n: p.grad for n, p in run.model.named_parameters() if p.grad is not None}
        assert pending.keys() == {n for n, p in reference.named_parameters() if p.grad is not None}
        assert bool(pending) == (step == 700) and all(record2026.label(n) in record2026.ADAM_TABLE for n in pending)
        kept = dict(reference.named_parameters())
        assert all(torch.allclose(grad, kept[name].grad, rtol=1e-12, atol=0) for name, grad in pending.items())
        for (name, p), q in zip(run.model.named_parameters(), reference.parameters()):
            assert torch.allclose(p, q, rtol=0, atol=1e-12), name


def test_each_iteration_fits_the_rotary_and_schedules_the_optimizer():
    """YaRN at each growth of the long window, the lrs of the lr factor, NorMuon's momentum and Adam's turn; the
    matrices' lr logged."""
    run = record_run()
    for it in (0, 519, 520, 1039, 1040):
        lr = run.start_step(it)
    assert run.model.rotary_windows == [384, 896, 1408]
    assert lr == record2026.NORMUON_LR * record2026.lr_factor_at(1040) and not run.optimizer.adam_steps
    assert all(g['lr'] == g['base_lr'] * record2026.lr_factor_at(1040) and
               g['momentum'] == record2026.momentum_at(1040) for g in run.optimizer.param_groups)
    run.start_step(1041)
    assert run.optimizer.adam_steps


def test_the_forward_gets_the_steps_windows_and_mtp_weights_and_validation_the_final_window():
    run = record_run()
    args = run.forward_args(300)
    assert args['windows'] == (128, 384) and torch.equal(args['mtp_weights'], torch.tensor(
        record2026.mtp_weights_at(300))) and args['mtp_weights'].dtype == torch.float32
    assert run.forward_args(1000, training=False) == dict(windows=(384, 896))
    assert run.forward_args(1600, training=False) == dict(windows=(768, 2560))
    assert run.gradient_scale == record2026.GRADIENT_SCALE * 2 * 24


def test_the_embedding_splits_from_the_head_after_the_split_steps_update_alone():
    run = record_run()
    run.start_step(1041)
    for p in run.model.parameters():
        p.grad = torch.ones_like(p) if p is not run.model.transformer.wte.weight else None
    run.optimizer.step()
    run.end_step(1040)
    assert run.model.embedding_tied
    run.end_step(1041)
    wte, head = run.model.transformer.wte.weight, run.model.lm_head.weight
    assert not run.model.embedding_tied and torch.equal(wte, head)
    assert all(torch.equal(a, b) for a, b in zip(run.optimizer.state[wte].values(), run.optimizer.state[head].values())
               if torch.is_tensor(a))


def test_model_pys_run_keeps_train_pys_schedule():
    """nanoGPT's lr (lr_schedule's), the window of its warmup, gradient_accumulation_steps micro-steps each a mean
    (gradient_scale None: 1 / the micro-steps); the estimator traces where the window is largest."""
    config = {**configurator.train_defaults(), 'attn_window_warmup_iters': 8, 'attn_window_warmup_start': 4,
              'gradient_accumulation_steps': 3}
    model = tiny_gpt(attn_window=16)
    optimizer = model.configure_optimizers(0.1, config['learning_rate'], (0.9, 0.95), 'cpu')
    run = runs.make_run(config, model, optimizer)
    assert run.start_step(5) == scheduled_lr(5, config) == optimizer.param_groups[0]['lr']
    assert [run.forward_args(it)['attn_window'] for it in (0, 4, 8, 100)] == [4, 8, 16, 16]
    assert run.micro_steps(7) == 3 and run.gradient_scale is None and run.traced_steps == (8, 9)


def test_each_model_file_builds_its_model_from_model_args():
    """nanoGPT's model_args (no model_file) build model.py's GPT; gpt2026.py's a GPT2026, its attention the varlen
    kernel where it runs (bf16 or fp16 autocast, heads it takes, attention_kernel not 'masked'), its loss in chunks of
    loss_chunk_mib."""
    assert isinstance(runs.new_model(dict(tiny_gpt().config.__dict__)), GPT)
    args = runs.record_model_args(RECORD, 64)
    assert isinstance(runs.new_model(args), gpt2026.GPT2026) and runs.model_file(args) == 'gpt2026.py'
    on_cuda = {**RECORD, 'dtype': 'bfloat16'}
    options = runs.record_options(on_cuda, args, flash_kernel=True)
    assert options['attend'] is attention.window_document_attention
    assert options['segments'] is attention.position_segments
    for config, flash_kernel in ((on_cuda, None), (on_cuda, False), (RECORD, True),
                                 ({**on_cuda, 'attention_kernel': 'masked'}, True),
                                 ({**on_cuda, 'n_embd': 12, 'n_head': 2}, True)):
        assert runs.record_options(config, runs.record_model_args(config, 64), flash_kernel)['attend'] is \
            gpt2026.attend
    assert runs.record_options({**RECORD, 'loss_chunk_mib': 3}, args)['loss_chunk_rows'] == 3 * 2 ** 20 // (12 * 64)
