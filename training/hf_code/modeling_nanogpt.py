"""A model that this project's export_hf.py wrote, in transformers: NanoGPTForCausalLM runs model.py's GPT, the
training code's own (copied beside this file), so it computes what the checkpoint computes. Load it with
AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)."""
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutput

from .configuration_nanogpt import NanoGPTConfig
from .model import GPT


def all_position_logits(gpt, idx, positions=None):
    """GPT.forward's logits (B, T, vocab) at every position of idx, not only the last: the final norm's output at all
    positions goes to lm_head in place of the last position's, so the head and the soft-cap run forward's own code.
    positions: forward's (row_positions')."""
    hidden = []
    with gpt.transformer.ln_f.register_forward_hook(lambda module, args, output: hidden.append(output)), \
            gpt.lm_head.register_forward_pre_hook(lambda module, args: (hidden[0],)):
        logits, _ = gpt(idx, positions=positions)
    return logits


def row_positions(attention_mask):
    """GPT.forward's positions for transformers' attention_mask (B, T), 0 at padding (left, right or anywhere): each
    token's counted from its row's first token, as GPT2LMHeadModel counts them, and -1 at padding, which no token
    attends to; None where nothing is padded (forward's plain path)."""
    if attention_mask is None or attention_mask.all():
        return None
    tokens = attention_mask.bool()
    return (tokens.cumsum(-1) - 1).masked_fill(~tokens, -1)


class NanoGPTForCausalLM(PreTrainedModel, GenerationMixin):
    config_class = NanoGPTConfig
    base_model_prefix = 'gpt'
    _tied_weights_keys = {'gpt.lm_head.weight': 'gpt.transformer.wte.weight'}  # with tie_word_embeddings

    def __init__(self, config):
        super().__init__(config)
        self.gpt = GPT(config.gpt_config())
        self.post_init()

    def _init_weights(self, module):
        """Nothing: GPT.__init__ initializes every weight (GPT-2's scheme and its options' own), which transformers'
        generic initialization would overwrite."""

    def get_input_embeddings(self):
        return self.gpt.transformer.wte

    def get_output_embeddings(self):
        return self.gpt.lm_head

    def forward(self, input_ids, attention_mask=None, labels=None, **kwargs):
        """CausalLMOutput with the logits of every position and, given labels, the mean cross-entropy of predicting
        labels[:, 1:] (-100: ignored), as transformers' causal LMs compute it. attention_mask: 0 at padding, which
        no position attends to, on either side: a row's logits are those it has alone. kwargs: transformers' other
        arguments (Trainer's num_items_in_batch reaches the loss); there is no cache (past_key_values)."""
        positions = row_positions(attention_mask)
        if positions is not None:  # padding's ids are never seen: any, one past the vocabulary too (an added <|pad|>)
            input_ids = input_ids.masked_fill(positions < 0, 0)
        logits = all_position_logits(self.gpt, input_ids, positions)
        loss = None if labels is None else self.loss_function(logits, labels, self.config.vocab_size, **kwargs)
        return CausalLMOutput(loss=loss, logits=logits)

    def prepare_inputs_for_generation(self, input_ids, attention_mask=None, **kwargs):
        """Each step runs the whole sequence and its mask (no cache, whatever use_cache says); past block_size, their
        last block_size tokens, as GPT.generate crops it."""
        context = slice(-self.config.block_size, None)
        return {'input_ids': input_ids[:, context],
                'attention_mask': None if attention_mask is None else attention_mask[:, context]}
