"""export_hf.py in a subprocess: a character model's tokenizer is its dataset's, one without its meta.pkl is
refused before writing, and train.py finetunes from the export."""

from helpers import TINY_ARGS, assert_same_model, run_script, trained_like_gpt, write_char_dataset, write_checkpoint
from training.checkpoint import load_model
from training.meta import load_meta


def test_character_tokenizer_is_the_datasets(tmp_path):
    data = write_char_dataset(tmp_path / 'data')
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
