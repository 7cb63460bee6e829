"""training/hf.py on gpt2026.py's model: a checkpoint exported to a transformers folder with its own modeling code
(gpt2026.py itself and the hf_code/ wrappers) computes the checkpoint's capped logits at every position, its loss and
its greedy tokens, with the state it keeps beside its weights (the embedding's tie, YaRN's windows) in config.json;
a padded batch's rows are those rows alone; the folder is refused as an init_from in one line."""
import json

import pytest
import torch

import gpt2026
from helpers import ROOT, TEXT, write_char_dataset
from training import hf
from training.checkpoint import load_checkpoint, pretrained_model
from training.errors import ConfigError

VOCAB = len(set(TEXT))  # the character dataset's; id 0 is the newline, which starts each document


def trained_like_gpt2026(tied):
    """The record's 11 layers, 32 wide, windows (6, 12) shorter than the tests' rows, random weights, after YaRN's
    rescaling and (unless tied) the embedding's split, its wte then trained apart from the head."""
    torch.manual_seed(0)
    config = gpt2026.GPT2026Config(vocab_size=VOCAB, bigram_vocab_size=5 * VOCAB, n_head=2, n_embd=32, doc_token=0,
                                   short_window=6, long_window=12)
    model = gpt2026.GPT2026(config, loss_chunk_rows=16)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    for window in (6, 12):
        model.fit_rotary(window)
    if not tied:
        model.untie_embedding()
        with torch.no_grad():
            model.transformer.wte.weight.add_(torch.randn_like(model.transformer.wte.weight))
    return model.eval()


def export(tmp_path, model):
    """model's checkpoint, as train.py writes it (its model_args name gpt2026.py), exported as export_hf.py does,
    with the character dataset's tokenizer; its folder loaded as AutoModelForCausalLM loads it."""
    data = write_char_dataset(tmp_path / 'data')
    (tmp_path / 'out').mkdir()
    model_args = dict(vars(model.config), model_file='gpt2026.py')
    torch.save({'model': model.state_dict(), 'model_args': model_args, 'config': {'block_size': 24}},
               tmp_path / 'out' / 'ckpt.pt')
    checkpoint = load_checkpoint(str(tmp_path / 'out'), 'cpu')
    hf.check_exportable(checkpoint, 'ckpt.pt')
    hf.export(checkpoint, hf.tokenizer_for(checkpoint['model_args'], str(data / 'meta.pkl')), str(tmp_path / 'hf'))
    from transformers import AutoModelForCausalLM  # here, not at collection: seconds to import
    return AutoModelForCausalLM.from_pretrained(tmp_path / 'hf', trust_remote_code=True).eval()


def rows(seed=1, length=24):
    """Two rows of characters with documents starting inside them (the newline, id 0): at 7 in the first, at 3 and
    (if the rows are that long) 15 in the second."""
    idx = torch.randint(1, VOCAB, (2, length), generator=torch.Generator().manual_seed(seed))
    idx[0, 7] = idx[1, 3] = 0
    idx[1, 15:16] = 0
    return idx


@pytest.mark.parametrize('tied', [True, False], ids=['tied', 'untied'])
def test_an_export_computes_the_checkpoints_logits_loss_and_tokens(tmp_path, tied):
    model = trained_like_gpt2026(tied)
    theirs = export(tmp_path, model)
    assert type(theirs).__name__ == 'GPT2026ForCausalLM'
    assert theirs.get_output_embeddings() is theirs.gpt.lm_head
    assert theirs.get_input_embeddings() is (theirs.gpt.lm_head if tied else theirs.gpt.transformer.wte)
    idx = rows()
    with torch.no_grad():
        ours = torch.cat([model(idx[:, :t])[0] for t in range(1, idx.size(1) + 1)], dim=1)
        torch.testing.assert_close(theirs(idx).logits, ours, atol=1e-5, rtol=0)
        _, loss = model(idx[:, :-1], targets=idx[:, 1:])
        torch.testing.assert_close(theirs(idx, labels=idx).loss, loss, atol=1e-5, rtol=0)
        prompt = idx[:1, :5]  # transformers' generate runs the whole sequence each step: as generate without a cache
        greedy = theirs.generate(prompt, max_new_tokens=15, do_sample=False)
        assert torch.equal(greedy, model.generate(prompt, 15, top_k=1, use_cache=False))
    saved = json.loads((tmp_path / 'hf' / 'config.json').read_text())
    assert saved['model_type'] == 'gpt2026' and saved['auto_map'] == hf.RECORD_2026_AUTO_MAP
    assert saved['embedding_tied'] == tied and saved['rotary_windows'] == [6, 12]
    # the folder's code: gpt2026.py as it is (it imports only torch) and its two wrappers, no other project module
    assert {path.name for path in (tmp_path / 'hf').glob('*.py')} == {
        'gpt2026.py', 'configuration_gpt2026.py', 'modeling_gpt2026.py'}
    assert (tmp_path / 'hf' / 'gpt2026.py').read_text() == (ROOT / 'gpt2026.py').read_text()


def test_a_padded_batch_gives_each_rows_own_logits_and_tokens(tmp_path):
    """Left and right padding, the padding's ids anything: each row's logits are those of its tokens alone (its
    first token starts its positions, bigrams and smear); transformers' generate on a left-padded batch gives each
    prompt the tokens it gets alone."""
    model = trained_like_gpt2026(tied=False)
    theirs = export(tmp_path, model)
    idx = rows(length=12)
    lengths = (12, 7)
    with torch.no_grad():
        for side in ('left', 'right'):
            mask = torch.zeros_like(idx)
            for row, length in enumerate(lengths):
                (mask[row, -length:] if side == 'left' else mask[row, :length]).fill_(1)
            padded = idx.masked_fill(mask == 0, VOCAB - 1)
            logits = theirs(padded, attention_mask=mask).logits
            for row, length in enumerate(lengths):
                tokens = padded[row][mask[row].bool()][None]
                assert tokens.size(1) == length
                torch.testing.assert_close(logits[row][mask[row].bool()], theirs(tokens).logits[0], atol=1e-5, rtol=0)
                assert (logits[row][~mask[row].bool()] == 0).all()
        mask = torch.ones_like(idx)
        mask[1, :5] = 0
        batch = theirs.generate(idx, attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=0)
        for row, prompt in enumerate((idx[:1], idx[1:, 5:])):
            assert torch.equal(batch[row, -8:], model.generate(prompt, 8, top_k=1, use_cache=False)[0, -8:])


def test_what_is_refused_is_one_line(tmp_path):
    """model_args gpt2026.py does not have, before anything is written; the export as init_from (the record trains
    from scratch)."""
    with pytest.raises(ConfigError) as e:
        hf.check_exportable({'model_args': {'model_file': 'gpt2026.py', 'vocab_size': 64, 'n_expert': 8}}, 'ckpt.pt')
    assert str(e.value) == ("ckpt.pt has model_args that this gpt2026.py does not have: n_expert=8; export it with "
                            "the code that trained it")
    export(tmp_path, trained_like_gpt2026(tied=True))
    with pytest.raises(ConfigError, match=r"^\S+ is an export of gpt2026.py's model, which init_from does not load"):
        pretrained_model(str(tmp_path / 'hf'))
