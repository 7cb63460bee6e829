"""export_hf.py in a subprocess: a character model's tokenizer is its dataset's, one without its meta.pkl is
refused before writing, train.py finetunes from the export, and a speedrun-architecture model goes to transformers
with its own modeling code and back; it and gpt2026.py's model go through lm-evaluation-harness (scoring, and
generating in left-padded batches)."""
import importlib.util
import json
import math
import shutil

import pytest
import torch

from helpers import (HF_ARGS, MODERN_ARCH_ARGS, RECORD_2026_ARGS, TEXT, TINY_ARGS, assert_same_model, run_python,
                     run_script, trained_like_gpt, write_char_dataset, write_checkpoint)
from training.checkpoint import load_checkpoint, load_model
from training.meta import load_meta


def test_character_tokenizer_is_the_datasets(tmp_path):
    data = write_char_dataset(tmp_path / 'data', vocab_size=HF_ARGS['vocab_size'])
    write_checkpoint(tmp_path / 'out', trained_like_gpt(0), data_dir=tmp_path / 'data')
    result = run_script('export_hf.py', f'--out_dir={tmp_path / "out"}', f'--hf_dir={tmp_path / "hf"}')
    assert result.returncode == 0, result.stderr
    assert 'the tokenizer maps each character to its id as' in result.stdout
    meta = load_meta(str(data / 'meta.pkl'))
    from transformers import AutoTokenizer  # here, not at collection: seconds to import
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / 'hf')
    text = 'First Citizen:\nSpeak,  speak.\n'
    ids = tokenizer.encode(text)
    assert ids == [meta['stoi'][c] for c in text] and tokenizer.decode(ids) == text


def test_a_character_model_without_its_meta_is_refused_before_writing(tmp_path):
    write_checkpoint(tmp_path / 'out', trained_like_gpt(0), data_dir=tmp_path / 'gone')
    result = run_script('export_hf.py', f'--out_dir={tmp_path / "out"}')
    assert result.returncode == 2 and result.stderr.count('\n') == 1
    assert "the model's vocab_size is 40, too small for GPT-2's tokens" in result.stderr
    assert not (tmp_path / 'out' / 'hf').exists()


def test_train_exports_and_finetunes_from_the_export(tmp_path):
    """The quick start's road: train, export, load in transformers; then train.py --init_from=the export."""
    write_char_dataset(tmp_path / 'data')
    common = [*TINY_ARGS, f'--data_dir={tmp_path / "data"}', '--eval_interval=5']
    result = run_script('train.py', *common, f'--out_dir={tmp_path / "out"}', '--max_iters=5')
    assert result.returncode == 0, result.stderr
    result = run_script('export_hf.py', f'--out_dir={tmp_path / "out"}')
    assert result.returncode == 0, result.stderr
    ours, _ = load_model('resume', str(tmp_path / 'out'), 'cpu')
    from transformers import AutoModelForCausalLM
    assert_same_model(ours, AutoModelForCausalLM.from_pretrained(tmp_path / 'out' / 'hf'))
    result = run_script('train.py', *common, f'--out_dir={tmp_path / "again"}', '--max_iters=2',
                        f'--init_from={tmp_path / "out" / "hf"}')
    assert result.returncode == 0, result.stderr
    assert f'Initializing from GPT-2 weights: {tmp_path / "out" / "hf"}' in result.stdout


def trained_and_exported(tmp, *train_args):
    """(tmp, out_dir, hf_dir, export_hf.py's stdout): a model of train_args trained by train.py on the character
    dataset for 4 iterations and exported by export_hf.py."""
    write_char_dataset(tmp / 'data')
    trained = run_script('train.py', *train_args, f'--data_dir={tmp / "data"}', f'--out_dir={tmp / "out"}',
                         '--max_iters=4', '--eval_interval=4')
    assert trained.returncode == 0, trained.stderr
    exported = run_script('export_hf.py', f'--out_dir={tmp / "out"}', f'--hf_dir={tmp / "hf"}')
    assert exported.returncode == 0, exported.stderr
    return tmp, tmp / 'out', tmp / 'hf', exported.stdout


@pytest.fixture(scope='module')
def speedrun_export(tmp_path_factory):
    """A model of the speedrun preset's architecture (every modern option: MODERN_ARCH_ARGS), scaled down, trained
    and exported (trained_and_exported's)."""
    return trained_and_exported(tmp_path_factory.mktemp('speedrun'), *TINY_ARGS, *MODERN_ARCH_ARGS)


@pytest.fixture(scope='module')
def record2026_export(tmp_path_factory):
    """gpt2026.py's model on its preset, scaled down, trained and exported (trained_and_exported's)."""
    return trained_and_exported(tmp_path_factory.mktemp('record2026'), *RECORD_2026_ARGS)


# the exports that lm-evaluation-harness runs: model.py's GPT of the speedrun architecture, gpt2026.py's model
EXPORTS = pytest.mark.parametrize('export', ['speedrun_export', 'record2026_export'], ids=['model.py', 'gpt2026.py'])


def test_a_speedrun_architecture_model_leaves_and_comes_back(speedrun_export):
    tmp, out_dir, hf_dir, stdout = speedrun_export
    assert f"from_pretrained('{hf_dir}', trust_remote_code=True)" in stdout
    ours, _ = load_model('resume', str(out_dir), 'cpu')
    from transformers import AutoModelForCausalLM, AutoTokenizer  # here, not at collection: seconds to import
    theirs = AutoModelForCausalLM.from_pretrained(hf_dir, trust_remote_code=True)
    assert_same_model(ours, theirs)  # logits at every position, greedy tokens
    tokenizer = AutoTokenizer.from_pretrained(hf_dir, trust_remote_code=True)
    stoi = load_meta(str(tmp / 'data' / 'tiny_char' / 'meta.pkl'))['stoi']
    assert tokenizer.encode(TEXT[:50]) == [stoi[c] for c in TEXT[:50]]
    # the way back: train.py finetunes the export, with its architecture
    result = run_script('train.py', *TINY_ARGS, f'--data_dir={tmp / "data"}', f'--out_dir={tmp / "again"}',
                        '--max_iters=2', '--eval_interval=2', f'--init_from={hf_dir}')
    assert result.returncode == 0, result.stderr
    assert f'loading weights from the Hugging Face folder {hf_dir}' in result.stdout
    finetuned = load_checkpoint(str(tmp / 'again'), 'cpu')['model_args']
    assert finetuned == load_checkpoint(str(out_dir), 'cpu')['model_args'] and finetuned['pos_emb'] == 'rope'


TASK = """task: tiny_shakespeare_lines
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: loglikelihood
doc_to_text: "{{{{context}}}}"
doc_to_target: "{{{{continuation}}}}"
target_delimiter: ""
metric_list:
  - metric: perplexity
    aggregation: perplexity
    higher_is_better: false
"""
# the harness moves a context's trailing spaces to the continuation: here none has any
LINES = [dict(context='First', continuation=' Citizen:'), dict(context='All:', continuation='\nSpeak,'),
         dict(context='Yo', continuation='u are')]


LM_EVAL_MISSING = 'lm-evaluation-harness is not installed (pip install -r requirements-dev.txt)'
needs_lm_eval = pytest.mark.skipif(importlib.util.find_spec('lm_eval') is None, reason=LM_EVAL_MISSING)


def run_lm_eval(hf_dir, task, tmp_path, *options, model_args=''):
    """lm_eval's command, offline, on `task` (a task's YAML) over LINES, with more `options` and `model_args` (',...'):
    the results' folder."""
    (tmp_path / 'lines.jsonl').write_text(''.join(json.dumps(line) + '\n' for line in LINES))
    (tmp_path / 'tasks').mkdir()
    (tmp_path / 'tasks' / 'tiny.yaml').write_text(task.format(data=tmp_path / 'lines.jsonl'))
    result = run_python('-m', 'lm_eval', '--model', 'hf', '--model_args',
                        f'pretrained={hf_dir},trust_remote_code=True{model_args}', '--tasks', 'tiny_shakespeare_lines',
                        '--include_path', tmp_path / 'tasks', '--device', 'cpu',
                        *options, '--output_path', tmp_path / 'results', cwd=tmp_path,
                        env={'HF_HOME': str(tmp_path / 'hf_home'), 'HF_HUB_OFFLINE': '1', 'HF_DATASETS_OFFLINE': '1'})
    assert result.returncode == 0, result.stderr
    return tmp_path / 'results'


@needs_lm_eval
@EXPORTS
def test_lm_eval_scores_an_export(export, request, tmp_path):
    """lm_eval's command on a local task, offline: its perplexity is the one of our model's log-likelihoods."""
    tmp, out_dir, hf_dir, _ = request.getfixturevalue(export)
    # a character vocabulary has no <|endoftext|> for the harness to put before an empty context: any token does
    results = run_lm_eval(hf_dir, TASK, tmp_path, '--batch_size', '1', model_args=',prefix_token_id=0')
    results, = results.rglob('results_*.json')
    perplexity = json.loads(results.read_text())['results']['tiny_shakespeare_lines']['perplexity,none']
    ours, _ = load_model('resume', str(out_dir), 'cpu')
    stoi = load_meta(str(tmp / 'data' / 'tiny_char' / 'meta.pkl'))['stoi']
    likelihoods = []
    with torch.no_grad():
        for line in LINES:
            ids = torch.tensor([[stoi[c] for c in line['context'] + line['continuation']]])
            _, losses = ours(ids[:, :-1], targets=ids[:, 1:], reduction='none')
            likelihoods.append(-losses[0, -len(line['continuation']):].sum().item())
    assert math.log(perplexity) == pytest.approx(-sum(likelihoods) / len(likelihoods), abs=1e-4)


GENERATE_TASK = TASK.split('output_type')[0] + """output_type: generate_until
doc_to_text: "{{{{context}}}}"
doc_to_target: "{{{{continuation}}}}"
generation_kwargs:
  until: ["z"]
  do_sample: false
  max_gen_toks: 8
metric_list:
  - metric: exact_match
"""


@needs_lm_eval
@EXPORTS
def test_lm_eval_generates_with_an_export_in_left_padded_batches(export, request, tmp_path):
    """A generation task, its contexts of different lengths in one batch (left-padded by the harness): each
    continuation is our model's greedy one for its context alone, up to the first stop string."""
    tmp, out_dir, hf_dir, _ = request.getfixturevalue(export)
    # the harness's generation needs the tokenizer's end of text, which a character vocabulary lacks: one added to the
    # tokenizer (an id past the model's vocabulary) is also the harness's padding
    shutil.copytree(hf_dir, tmp_path / 'hf')
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / 'hf', trust_remote_code=True)
    tokenizer.add_special_tokens({'eos_token': '<|endoftext|>'})
    tokenizer.save_pretrained(tmp_path / 'hf')
    results = run_lm_eval(tmp_path / 'hf', GENERATE_TASK, tmp_path, '--batch_size', str(len(LINES)), '--log_samples')
    samples, = results.rglob('samples_*.jsonl')
    continuations = {json.loads(line)['doc']['context']: json.loads(line)['resps'][0][0]
                     for line in samples.read_text().splitlines()}
    ours, _ = load_model('resume', str(out_dir), 'cpu')
    stoi = load_meta(str(tmp / 'data' / 'tiny_char' / 'meta.pkl'))['stoi']
    itos = {i: c for c, i in stoi.items()}
    for line in LINES:
        ids = torch.tensor([[stoi[c] for c in line['context']]])
        with torch.no_grad():
            greedy = ''.join(itos[i] for i in ours.generate(ids, 8, top_k=1)[0, ids.shape[1]:].tolist())
        assert continuations[line['context']] == greedy.split('z')[0], line
    assert len(set(continuations.values())) == len(LINES)  # three continuations, not one
