# GPT-2 quality from 0.42B tokens on one 12 GB card (e.g. RTX 3060 12GB): modded-nanogpt's single-GPU run of
# 24 Jan 2026 (records/track_1_short/2026-01-24_ImprovedLMHead/single_gpu_improved_with_softcapping.txt), its model
# (gpt2026.py) and training (training/record2026.py), each proven equal to the record in float64 (docs/record_2026.md).
# The record's run on one H100: 1,600 steps, 424,673,280 tokens (131,072, 262,144, then 393,216 a step over thirds of
# 1,560 steps, then 40 more at the last size), FineWeb validation loss 3.2787 at step 1,600 after 727,977 ms (12.1
# minutes) of training; one run, so 3.28 is what it reached, not a guarantee. What one card changes, each with its
# reason in docs/record_2026.md: the record's micro-batches of 16,384 to 49,152 tokens as rows of 4,096 (32, 64, then
# 96 a step), FlashAttention 3 as FlashAttention's variable-length kernel in torch (FA2, the same windows by position;
# SDPA under a mask without one), bf16 autocast for the FP8 head, torch operations for the Triton kernels.
# $ python prepare/openwebtext.py --dataset HuggingFaceFW/fineweb --name sample-10BT \
#       --max_tokens 1_500_000_000 --out_dir data/fineweb
# $ python estimate_memory.py config/speedrun2026_gpt2_12gb.py --gpu_memory_gb=12
# $ python train.py config/speedrun2026_gpt2_12gb.py
# How long it takes on your card: python bench.py --mode=card

model_file = 'gpt2026.py'  # the record's model, optimizer and schedules: no model.py key applies
dataset = 'fineweb'
out_dir = 'out-speedrun2026-gpt2'

# the record's model: 11 layers, 6 heads of 128, 768 wide, GPT-2's vocabulary padded to 50,304 (461.8M parameters, a
# bigram table of 251,520 rows and three value-embedding tables among them); each document starts at <|endoftext|>
n_layer = 11
n_head = 6
n_embd = 768
doc_token = 50256

# the record's data: rows that start at a document, each document cut to 2,048 tokens, read in order, each once. Rows
# of 4,096 tokens, 32 a step over the first third (the record's 131,072 tokens), 64 and 96 as its batch grows: the
# estimate, 10.52 GiB of the 11.5 a 12 GB card leaves (with loss chunks of 256 MiB, where the default 1 GiB's take
# 11.47), fits where rows of 8,192 (12.39) and the record's 16,384 (17.09) do not
block_size = 4096
batch_size = 1
gradient_accumulation_steps = 32
batch_order = 'sequential'
loss_chunk_mib = 256
# train.py trains iteration max_iters too, after its evaluation: the record's 1,600 steps, then one more, unsaved
max_iters = 1600
grad_clip = 0.0  # the record clips nothing

# every 200 steps, the last at step 1,600 with the final validation's longer window (the record: every 250 and at the
# end): val loss on 200 * 4,096 held-out FineWeb tokens (about all of val.bin; the record: 10,485,760 of its own
# validation shard), in micro-batches of 4 rows (8.28 GiB by the estimate); the checkpoint at each, after Adam's step
eval_interval = 200
eval_iters = 200
eval_batch_size = 4
log_interval = 10

compile = True  # needs Triton (not on native Windows): compile = False there
