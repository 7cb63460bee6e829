"""GPT-2's BPE is helpers.tiny_encoding(), a tiny byte-level BPE with <|endoftext|>: no download."""
import helpers
import training.data

training.data.get_encoding = lambda name: helpers.tiny_encoding()
