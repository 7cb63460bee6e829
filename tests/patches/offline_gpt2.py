"""GPT-2 without the network: its BPE is a tiny byte-level BPE of GPT-2's 50257 tokens (so a GPT-2-sized model's
samples decode), and OpenAI's weights of every size are random GPT-2s of 2 layers, 2 heads, 32 wide, built by
transformers from their config as GPT2LMHeadModel.from_pretrained would load them. transformers is patched only when
GPT.from_pretrained first asks for it: importing it takes seconds, in processes that mostly never do."""
import helpers
import model
import training.data

TINY = dict(n_layer=2, n_head=2, n_embd=32)
training.data.get_encoding = lambda name: helpers.tiny_encoding(vocab_size=50257)
model.GPT.PRETRAINED_ARGS.update({name: TINY for name in model.GPT.PRETRAINED_ARGS})
from_pretrained = model.GPT.from_pretrained.__func__


def tiny_from_pretrained(cls, *args, **kwargs):
    import transformers
    transformers.GPT2LMHeadModel.from_pretrained = staticmethod(
        lambda name, **options: transformers.GPT2LMHeadModel(transformers.GPT2Config(**TINY)))
    return from_pretrained(cls, *args, **kwargs)


model.GPT.from_pretrained = classmethod(tiny_from_pretrained)
