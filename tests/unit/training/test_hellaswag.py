"""training/hellaswag.py on small files in HellaSwag's format written here: the batched, chunked scores against
full logits, acc and acc_norm on a rigged model, the DDP split, the cached download, and one-line errors.

No network: a tiny byte-level tiktoken encoding stands in for GPT-2's BPE."""
import json

import pytest
import torch
import torch.nn.functional as F

from helpers import tiny_encoding, tiny_gpt
from helpers import HELLASWAG_EXAMPLES as EXAMPLES, write_jsonl
import gpt2026
from model import GPT, GPTConfig
from training import hellaswag
from training.errors import ConfigError
from training.hellaswag import HellaSwagError, cached_val_file, ending_losses, evaluate, read_examples, render


def scoring_gpt(block_size=64, **config):
    """The tiny GPT, 32 wide, over tiny_encoding's 320 tokens, in float64 with large embeddings, so its next-token
    distributions are far from uniform and no two endings tie."""
    model = tiny_gpt(block_size=block_size, vocab_size=320, n_embd=32, **config).double().eval()
    with torch.no_grad():
        model.transformer.wte.weight.normal_(0.0, 1.0)
    return model


def reference_losses(model, example, enc):
    """(summed, mean) loss of each ending, from the full logits of context + ending, one ending at a time."""
    ctx = enc.encode(example['ctx'])
    endings = [enc.encode(' ' + ending) for ending in example['endings']]
    ctx = ctx[-(model.config.block_size + 1 - max(map(len, endings))):]  # crop the oldest context tokens to fit
    sums, means = [], []
    for ending in endings:
        tokens = torch.tensor([ctx + ending])
        x = model.transformer.wte(tokens[:, :-1]) + model.transformer.wpe(torch.arange(tokens.shape[1] - 1))
        for block in model.transformer.h:
            x, _ = block(x)
        logits = model.lm_head(model.transformer.ln_f(x))[0]
        losses = F.cross_entropy(logits[len(ctx) - 1:], tokens[0, len(ctx):], reduction='none')
        sums.append(losses.sum())
        means.append(losses.mean())
    return torch.stack(sums), torch.stack(means)


@pytest.mark.parametrize('block_size', [64, 32])  # 32: four of the seven contexts are cropped
def test_batched_scores_match_full_logits_reference(tmp_path, block_size):
    enc = tiny_encoding()
    model = scoring_gpt(block_size)
    examples = read_examples(write_jsonl(tmp_path / 'val.jsonl', EXAMPLES))
    with torch.no_grad():
        ref = [reference_losses(model, example, enc) for example in examples]
    ref_sums = torch.stack([sums for sums, _ in ref])
    ref_means = torch.stack([means for _, means in ref])

    rendered = [render(example, enc, block_size) for example in examples]
    sums, counts = ending_losses(model, rendered, 'cpu')  # all 7 examples padded into one batch
    torch.testing.assert_close(sums, ref_sums, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(sums / counts, ref_means, rtol=1e-10, atol=1e-10)

    labels = torch.tensor([example['label'] for example in examples])
    expected_correct = (ref_sums.argmin(1) == labels).sum().item()
    expected_correct_norm = (ref_means.argmin(1) == labels).sum().item()
    assert ref_sums.argmin(1).tolist() != ref_means.argmin(1).tolist()  # the two accuracies are told apart here
    for batch_size in (1, 3, 8):
        result = evaluate(model, examples, enc, 'cpu', batch_size=batch_size)
        assert result == dict(acc=expected_correct / 7, acc_norm=expected_correct_norm / 7, n=7,
                              correct=expected_correct, correct_norm=expected_correct_norm)


def test_gpt2026_is_scored_by_its_capped_logits_and_no_context_is_cut(tmp_path):
    """gpt2026.py's GPT2026 has no block size (its windows bound what a position sees): no context is cut, and each
    ending's summed loss, from the per-position losses of the padded batch, is the cross-entropy of the capped
    logits the model gives for each of its tokens, one prefix at a time."""
    enc = tiny_encoding()
    config = gpt2026.GPT2026Config(vocab_size=320, bigram_vocab_size=5 * 320, n_head=2, n_embd=32)
    model = gpt2026.GPT2026(config, loss_chunk_rows=7).double().eval()
    with torch.no_grad():  # far from the record's zeros, so that the endings' losses differ
        for p in model.parameters():
            p.normal_(0.0, 0.5)
    examples = read_examples(write_jsonl(tmp_path / 'val.jsonl', EXAMPLES))
    rendered = [render(example, enc, hellaswag.context_limit(model)) for example in examples]
    assert [ctx for ctx, _ in rendered] == [enc.encode(example['ctx']) for example in examples]
    sums, counts = ending_losses(model, rendered, 'cpu')

    def prefix_by_prefix(ctx, ending):  # the capped logits of the last position of each prefix (generate's)
        tokens = torch.tensor([ctx + ending])
        return sum(F.cross_entropy(model(tokens[:, :t])[0][0, -1], tokens[0, t])
                   for t in range(len(ctx), tokens.size(1)))
    with torch.no_grad():
        expected = torch.stack([torch.stack([prefix_by_prefix(ctx, ending) for ending in endings])
                                for ctx, endings in rendered])
    torch.testing.assert_close(sums, expected, rtol=1e-9, atol=1e-9)
    assert counts.tolist() == [[len(ending) for ending in endings] for _, endings in rendered]
    result = evaluate(model, examples, enc, 'cpu', batch_size=3)
    assert result['n'] == 7 and result['correct'] == (sums.argmin(1) == torch.tensor([e['label'] for e in examples])
                                                      ).sum().item()


def rigged_gpt(next_token_logits):
    """A GPT whose next-token logits are `next_token_logits` at every position, whatever the input: the final
    layer norm outputs its bias, e_0, and the head's column 0 holds the logits."""
    model = GPT(GPTConfig(block_size=64, vocab_size=len(next_token_logits), n_layer=1, n_head=2, n_embd=16,
                          bias=True)).eval()
    with torch.no_grad():
        model.transformer.ln_f.weight.zero_()
        model.transformer.ln_f.bias.zero_()[0] = 1.0
        model.lm_head.weight[:, 0] = next_token_logits
    return model


def test_acc_sums_and_acc_norm_averages_the_ending_losses():
    """Every token costs lse - z[token], lse = log(sum(exp(z))) ~ 6.4, with z = 5 for ' ' and 'b', 3 for 'a', 0 for
    the rest. ' a' costs 2 lse - 8 ~ 4.7 in all, lse - 4 ~ 2.4 a token: the lowest sum. ' bbbbbbbb' costs 9 lse - 45 ~
    12.2 in all, lse - 5 ~ 1.4 a token: the lowest mean. ' zzz' and ' zz' are worse in both."""
    enc = tiny_encoding()
    z = torch.zeros(320)
    z[enc.encode(' ')] = 5.0
    z[enc.encode('b')] = 5.0
    z[enc.encode('a')] = 3.0
    model = rigged_gpt(z)
    context = 'It is'
    cases = [  # (endings, label, (acc, acc_norm))
        (['zzz', 'a', 'bbbbbbbb', 'zz'], 1, (1.0, 0.0)),  # the label has the lowest sum, not the lowest mean
        (['bbbbbbbb', 'zzz', 'zz', 'a'], 0, (0.0, 1.0)),  # the label has the lowest mean, not the lowest sum
        (['zzz', 'zz', 'zzzz', 'a'], 3, (1.0, 1.0)),  # both
        (['zz', 'bbbbbbbb', 'zzz', 'a'], 2, (0.0, 0.0)),  # neither
    ]
    for endings, label, (acc, acc_norm) in cases:
        result = evaluate(model, [dict(ctx=context, endings=endings, label=label)], enc, 'cpu')
        assert (result['acc'], result['acc_norm']) == (acc, acc_norm), endings


def test_ddp_shares_add_up_with_the_same_forwards_on_every_rank():
    enc = tiny_encoding()
    model = scoring_gpt()
    examples = [dict(ctx=e['ctx'], endings=e['endings'], label=e['label']) for e in EXAMPLES]
    sums, _ = ending_losses(model, [render(example, enc, 64) for example in examples], 'cpu')
    # labels the model gets right by acc: a top-up example that counted would show in the sums
    examples = [dict(example, label=int(label)) for example, label in zip(examples, sums.argmin(1))]
    whole = evaluate(model, examples, enc, 'cpu', batch_size=2)
    assert whole['correct'] == 7
    forwards = []
    model.register_forward_hook(lambda module, args, output: forwards.append(args[0].shape[0]))
    shares = []
    for rank in range(3):  # 7 examples: 3, 2 and 2 of them, each rank 2 forwards (the short ones topped up)
        forwards.clear()
        shares.append(evaluate(model, examples, enc, 'cpu', batch_size=2, rank=rank, world_size=3))
        assert forwards == [8, 4]
    assert [share['n'] for share in shares] == [3, 2, 2]
    for key in ('n', 'correct', 'correct_norm'):
        assert sum(share[key] for share in shares) == whole[key]


def test_evaluate_scores_without_dropout_and_restores_train_mode():
    enc = tiny_encoding()
    model = scoring_gpt(dropout=0.5)
    examples = [dict(ctx=e['ctx'], endings=e['endings'], label=e['label']) for e in EXAMPLES]
    expected = evaluate(model, examples, enc, 'cpu')
    model.train()
    assert evaluate(model, examples, enc, 'cpu') == expected
    assert model.training


def test_an_ending_longer_than_the_block_is_an_error():
    with pytest.raises(HellaSwagError, match="block_size of 4"):
        render(dict(ctx='The cat', endings=['sat on the mat', 'a', 'b', 'c'], label=0), tiny_encoding(), 4)


def test_cut_contexts_are_counted_once(capsys):
    """Byte-level tokens: a context of n letters is n tokens, each ending ' b' 2; block_size 10 holds 9 + 2 - 1."""
    examples = [dict(ctx='a' * n, endings=['b', 'c', 'd', 'e'], label=0) for n in (5, 9, 10, 20)]
    hellaswag.report_cut_contexts(examples, tiny_encoding(), 10)
    assert capsys.readouterr().out == ('hellaswag: 2 of the 4 examples are longer than block_size=10: their contexts '
                                       'lose their oldest tokens, so the scores are not those of whole contexts\n')
    hellaswag.report_cut_contexts(examples, tiny_encoding(), 21)
    assert capsys.readouterr().out == ''


def test_max_examples_reads_only_the_first(tmp_path):
    path = write_jsonl(tmp_path / 'val.jsonl', EXAMPLES[:3])
    with open(path, 'a') as f:
        f.write('not json\n')
    assert [example['ctx'] for example in read_examples(path, max_examples=2)] == [e['ctx'] for e in EXAMPLES[:2]]
    assert read_examples(path, max_examples=2)[1] == dict(ctx=EXAMPLES[1]['ctx'], endings=EXAMPLES[1]['endings'],
                                                          label=EXAMPLES[1]['label'])


BAD_LINES = [  # (second line of the file, what the message says)
    ('{"ctx": "A", "endings": ["a", "b", "c", "d"]', 'not valid JSON'),
    ('[1, 2]', 'expected a JSON object'),
    ('{"ctx": "A", "label": 0}', "no field 'endings'"),
    ('{"endings": ["a", "b", "c", "d"], "label": 0}', "no field 'ctx'"),
    ('{"ctx": "A", "endings": ["a", "b", "c", "d"]}', "no field 'label'"),
    ('{"ctx": "", "endings": ["a", "b", "c", "d"], "label": 0}', "field 'ctx' must be a non-empty string"),
    ('{"ctx": "A", "endings": ["a", "b", "c"], "label": 0}', "field 'endings' must be a list of 4 strings"),
    ('{"ctx": "A", "endings": ["a", "b", "c", 4], "label": 0}', "field 'endings' must be a list of 4 strings"),
    ('{"ctx": "A", "endings": ["a", "b", "c", "d"], "label": 4}', "field 'label' must be 0, 1, 2 or 3, got 4"),
    ('{"ctx": "A", "endings": ["a", "b", "c", "d"], "label": "1"}', "field 'label' must be 0, 1, 2 or 3, got '1'"),
]


@pytest.mark.parametrize('line, message', BAD_LINES)
def test_bad_lines_name_the_file_line_and_field(tmp_path, line, message):
    path = tmp_path / 'val.jsonl'
    path.write_text(json.dumps(EXAMPLES[0]) + '\n' + line + '\n', encoding='utf-8')
    with pytest.raises(HellaSwagError) as error:
        read_examples(path)
    assert str(error.value).startswith(f'{path} line 2: {message}') and '\n' not in str(error.value)


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(HellaSwagError, match='cannot read .*nothing.jsonl'):
        read_examples(tmp_path / 'nothing.jsonl')
    (tmp_path / 'empty.jsonl').write_text('\n')
    with pytest.raises(HellaSwagError, match='empty.jsonl has no examples'):
        read_examples(tmp_path / 'empty.jsonl')


def test_the_download_is_cached_and_a_failed_one_leaves_nothing(tmp_path):
    source = write_jsonl(tmp_path / 'source.jsonl', EXAMPLES)
    cache = tmp_path / 'data' / 'hellaswag'
    path = cached_val_file(cache, url=source.as_uri())
    assert path == str(cache / 'hellaswag_val.jsonl') and len(read_examples(path)) == len(EXAMPLES)
    assert cached_val_file(cache, url='file:///nonexistent/hellaswag_val.jsonl') == path  # no second download
    elsewhere = tmp_path / 'elsewhere'
    with pytest.raises(ConfigError, match='could not download .*--data_path=PATH'):
        cached_val_file(elsewhere, url='file:///nonexistent/hellaswag_val.jsonl',
                        offline_fix='offline, pass --data_path=PATH')
    assert not elsewhere.exists() or not any(elsewhere.iterdir())


def test_the_failed_download_says_where_the_file_goes_unless_the_script_says_otherwise(tmp_path):
    """train.py has no --data_path: its fix is the file's place, data_dir/hellaswag/."""
    with pytest.raises(ConfigError) as error:
        cached_val_file(tmp_path / 'hellaswag', url='file:///nonexistent/hellaswag_val.jsonl')
    assert str(error.value).endswith(f"offline, put a copy of hellaswag_val.jsonl at "
                                     f"{tmp_path / 'hellaswag' / 'hellaswag_val.jsonl'}")
    assert '--data_path' not in str(error.value)
    assert hellaswag.DATA_URL == 'https://raw.githubusercontent.com/rowanz/hellaswag/master/data/hellaswag_val.jsonl'


def test_an_ending_longer_than_the_block_is_one_line_naming_the_fix():
    with pytest.raises(hellaswag.HellaSwagError, match=r"^a HellaSwag ending of 5 tokens leaves no room for its "
                                                       r"context in the model's block_size of 4: .*--block_size"):
        hellaswag.fit([1, 2], [[3] * 5, [3], [3], [3]], 4)
    assert hellaswag.fit([1, 2, 3], [[4] * 3] * 4, 4) == ([2, 3], [[4] * 3] * 4)  # the context cut to fit
