"""train.py on config/speedrun2026_gpt2_12gb.py (model_file='gpt2026.py': the 24 Jan 2026 record's model and
training), scaled down on a CPU: the record's 11 layers 32 wide, rows of 32 characters, a document at each newline.
It trains, evaluates and checkpoints; a resume repeats the uninterrupted run from a checkpoint taken after an even
iteration (Adam's gradients, kept for its next step, saved with it) and across the record's batch growth and split;
sample.py samples from its checkpoint, export_hf.py exports it (transformers computes its logits), and train.py
scores it on HellaSwag; under torchrun two processes train as one.
"""
import json

import numpy as np
import torch

from helpers import EOT, HELLASWAG_EXAMPLES, RECORD_2026_ARGS, assert_same_losses, load, logged_losses, patched_env
from helpers import run_script, tiny_encoding, torchrun, write_char_dataset, write_jsonl
from training import record2026, runs
from training.checkpoint import save_checkpoint
from training.hellaswag import evaluate




def train(data_dir, out_dir, *args):
    result = run_script('train.py', *RECORD_2026_ARGS, f'--data_dir={data_dir}', f'--out_dir={out_dir}', *args)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def same_weights(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) if torch.is_tensor(a[k]) else a[k] == b[k] for k in a)


def test_the_record_trains_evaluates_checkpoints_and_resumes_exactly(tmp_path):
    """Iterations 0 to 6, evaluated at 0, 3 and 6: the validation loss falls; stopped at 3 and resumed, the same
    losses and weights. The checkpoint at 3 holds the gradients of Adam's parameters from iteration 2. sample.py
    samples from it, export_hf.py exports it; hellaswag.py refuses it in one line, for its characters (not GPT-2's
    tokens)."""
    data = tmp_path / 'data'
    write_char_dataset(data)
    whole = train(data, tmp_path / 'whole', '--max_iters=6', '--eval_interval=3')
    train(data, tmp_path / 'split', '--max_iters=3', '--eval_interval=3')
    checkpoint = load(tmp_path / 'split')
    assert checkpoint['iter_num'] == 3 and checkpoint['model_args']['model_file'] == 'gpt2026.py'
    assert checkpoint['pending_gradients'] and all(record2026.label(name) in record2026.ADAM_TABLE
                                                   for name in checkpoint['pending_gradients'])
    resumed = train(data, tmp_path / 'split', '--max_iters=6', '--eval_interval=3', '--init_from=resume')
    expected = logged_losses(whole.stdout)
    assert logged_losses(resumed.stdout) == {i: expected[i] for i in range(3, 7)}
    validation = logged_losses(whole.stdout, 'step')
    assert logged_losses(resumed.stdout, 'step') == {i: validation[i] for i in (3, 6)} and validation[6] < validation[0]
    assert same_weights(load(tmp_path / 'whole')['model'], load(tmp_path / 'split')['model'])
    sampled = run_script('sample.py', f'--out_dir={tmp_path / "split"}', '--device=cpu', '--dtype=float32',
                         '--num_samples=1', '--max_new_tokens=20')
    assert sampled.returncode == 0 and '20 tokens in ' in sampled.stdout, sampled.stderr[-3000:]
    exported = run_script('export_hf.py', f'--out_dir={tmp_path / "split"}', f'--hf_dir={tmp_path / "hf"}')
    assert exported.returncode == 0 and 'trust_remote_code=True' in exported.stdout, exported.stderr[-3000:]
    from transformers import AutoModelForCausalLM, AutoTokenizer  # here, not at collection: seconds to import
    theirs = AutoModelForCausalLM.from_pretrained(tmp_path / 'hf', trust_remote_code=True)
    ids = AutoTokenizer.from_pretrained(tmp_path / 'hf', trust_remote_code=True)('First Citizen:\nBefore',
                                                                                 return_tensors='pt').input_ids
    saved = load(tmp_path / 'split')  # the resumed run's, at iteration 6
    model = runs.new_model(saved['model_args'])
    model.load_state_dict(saved['model'])
    with torch.no_grad():
        torch.testing.assert_close(theirs(ids).logits[:, -1:], model.eval()(ids)[0], atol=1e-5, rtol=0)
    (tmp_path / 'hellaswag.jsonl').write_text(json.dumps(dict(ctx='The cat', endings=['a', 'b', 'c', 'd'], label=0)))
    scored = run_script('hellaswag.py', f'--out_dir={tmp_path / "split"}', '--device=cpu', '--dtype=float32',
                        f'--data_path={tmp_path / "hellaswag.jsonl"}')
    assert scored.returncode == 2 and "vocab_size is" in scored.stderr and "GPT-2's BPE" in scored.stderr


def test_train_py_scores_the_record_on_hellaswag(tmp_path):
    """--hellaswag=True on GPT-2 tokens (the tiny encoding for GPT-2's BPE, documents ended by <|endoftext|>): a
    score at each evaluation, the one at 2 that of the checkpoint then, by the model's per-token losses."""
    data = tmp_path / 'data'
    for folder in ('bpe', 'hellaswag'):
        (data / folder).mkdir(parents=True)
    documents = [tiny_encoding().encode_ordinary(example['ctx']) + [EOT] for example in HELLASWAG_EXAMPLES] * 20
    ids = np.array([token for document in documents for token in document], dtype=np.uint16)
    ids.tofile(data / 'bpe' / 'train.bin')
    ids.tofile(data / 'bpe' / 'val.bin')
    write_jsonl(data / 'hellaswag' / 'hellaswag_val.jsonl', HELLASWAG_EXAMPLES)
    result = run_script('train.py', *RECORD_2026_ARGS, '--dataset=bpe', f'--doc_token={EOT}', f'--data_dir={data}',
                        f'--out_dir={tmp_path / "out"}', '--hellaswag=True', '--max_iters=2', '--eval_interval=2',
                        env=patched_env('tiny_bpe'))
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line for line in result.stdout.splitlines() if line.startswith('hellaswag ')]
    assert [line.split(':')[0] for line in lines] == ['hellaswag 0', 'hellaswag 2']
    assert 'longer than block_size' not in result.stdout  # no block size: no context cut
    checkpoint = load(tmp_path / 'out')
    model = runs.new_model(checkpoint['model_args'])
    model.load_state_dict(checkpoint['model'])
    expected = evaluate(model, [dict(e) for e in HELLASWAG_EXAMPLES], tiny_encoding(), 'cpu')
    assert lines[1] == (f"hellaswag 2: acc {expected['acc']:.4f}, acc_norm {expected['acc_norm']:.4f} "
                        f"({len(HELLASWAG_EXAMPLES)} examples)")


def checkpoints_before_the_split(tmp_path, *names):
    """(the character dataset's folder, a checkpoint): a 2-iteration run's checkpoint set to iteration 1,039 (what
    counts here is the schedule), saved in each of tmp_path's folders `names`."""
    data = tmp_path / 'data'
    write_char_dataset(data)
    train(data, tmp_path / 'start', '--max_iters=2', '--eval_interval=2')
    checkpoint = load(tmp_path / 'start')
    for name in names:
        save_checkpoint({**checkpoint, 'iter_num': record2026.SPLIT_STEP - 2}, str(tmp_path / name))
    return data, checkpoint


def test_resume_across_the_batch_growth_and_the_split_repeats_the_run(tmp_path):
    """A short run's checkpoint set to iteration 1,039 (what counts here is the schedule) resumed to 1,044: through
    the last batch size from 1,040 and the split after 1,041, with a checkpoint at 1,041 between (Adam's gradients of
    1,040 pending) as without: the same losses and weights; the embedding its own after the split, with Adam's state."""
    data, checkpoint = checkpoints_before_the_split(tmp_path, 'whole', 'split')
    whole = train(data, tmp_path / 'whole', '--init_from=resume', '--max_iters=1044', '--eval_interval=3')
    train(data, tmp_path / 'split', '--init_from=resume', '--max_iters=1041', '--eval_interval=3')
    assert load(tmp_path / 'split')['pending_gradients']
    resumed = train(data, tmp_path / 'split', '--init_from=resume', '--max_iters=1044', '--eval_interval=3')
    expected = logged_losses(whole.stdout)
    assert sorted(expected) == list(range(1039, 1045))
    assert logged_losses(resumed.stdout) == {i: expected[i] for i in range(1041, 1045)}
    after = load(tmp_path / 'split')
    assert same_weights(load(tmp_path / 'whole')['model'], after['model'])
    assert not after['model']['_extra_state']['embedding_tied']
    assert not torch.equal(after['model']['transformer.wte.weight'], after['model']['lm_head.weight'])
    assert len(after['optimizer']['state']) == len(checkpoint['optimizer']['state']) + 1  # the embedding's Adam


def same_state(a, b):
    """Whether the (nested) checkpoint entries a and b are equal, tensor for tensor."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same_state(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same_state(x, y) for x, y in zip(a, b))
    return torch.equal(a, b) if torch.is_tensor(a) else a == b


def test_two_processes_train_as_one_across_the_batch_growth_and_the_split(tmp_path):
    """torchrun, 2 processes (gloo), each the whole model and the record's optimizer, which sums their gradients:
    from a checkpoint set to iteration 1,039, through the last batch size from 1,040 (3 micro-steps a process) and
    the split after 1,041, the losses of one process at the same global batch; its checkpoint at 1,041 (Adam's
    gradients of 1,040 pending, their sum over the processes) resumed by one process repeats the uninterrupted run's
    next iterations. Under zero1, each process the optimizer state of its share of the parameters and their update:
    the same checkpoint, to the bit (a sum of two gradients is the same in any order), and resumed by two processes
    under zero1 the same losses."""
    data, _ = checkpoints_before_the_split(tmp_path, 'single', 'double', 'sharded')
    single = train(data, tmp_path / 'single', '--init_from=resume', '--max_iters=1044', '--eval_interval=3')
    runs = {}
    for name, parallelism in (('double', 'ddp'), ('sharded', 'zero1')):
        runs[name] = torchrun(*RECORD_2026_ARGS, f'--data_dir={data}', f'--out_dir={tmp_path / name}',
                              '--init_from=resume', '--max_iters=1041', '--eval_interval=3',
                              f'--parallelism={parallelism}')
        assert runs[name].returncode == 0, runs[name].stderr[-3000:]
        assert_same_losses(runs[name].stdout, single.stdout, 'iter', range(1039, 1042))
        assert_same_losses(runs[name].stdout, single.stdout, 'step', (1041,))
    double, sharded = load(tmp_path / 'double'), load(tmp_path / 'sharded')
    assert double['pending_gradients']
    for key in ('model', 'optimizer', 'pending_gradients'):
        assert same_state(sharded[key], double[key]), key
    # the first iterations after it: later ones drift apart by the sums' rounding, which Adam's normalized updates
    # of the tables' near-zero gradients and Polar Express's bf16 magnify
    resumed = train(data, tmp_path / 'double', '--init_from=resume', '--max_iters=1043', '--eval_interval=3')
    assert_same_losses(resumed.stdout, single.stdout, 'iter', range(1041, 1044))
    resumed = torchrun(*RECORD_2026_ARGS, f'--data_dir={data}', f'--out_dir={tmp_path / "sharded"}',
                       '--init_from=resume', '--max_iters=1043', '--eval_interval=3', '--parallelism=zero1')
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_same_losses(resumed.stdout, single.stdout, 'iter', range(1041, 1044))
