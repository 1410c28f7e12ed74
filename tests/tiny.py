"""Tiny random models (fixed seed) of each architecture family, with a tiny trained tokenizer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

FAMILIES = ("llama", "qwen3", "gpt2", "gemma3", "gemma4")
SLIDING_WINDOW = 8
# The same families at sizes vLLM's CPU attention takes (head sizes 32 and up), for tests/vllm_gemma.py.
VLLM_FAMILIES = ("gemma3-vllm", "gemma4-vllm", "mistral-vllm")
VLLM_SLIDING_WINDOW = 48
_CORPUS = [
    "Problem: Mia has 12 apples. She gives 5 to Sam and buys 9 more. How many apples does she have now?",
    "Solution: After giving 5 away she has 12 - 5 = 7 apples. Buying 9 more gives 7 + 9 = 16 apples.",
    "The train travels 60 km per hour for 3 hours, then 40 km per hour for 2 hours. Answer: 260",
] * 4


def tokenizer(dirpath: Path) -> Any:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>", "<pad>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_CORPUS, trainer)
    from tokenizers import decoders

    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>")
    fast.save_pretrained(dirpath)
    return fast


def config(family: str, vocab: int) -> Any:
    import transformers as tf

    common: dict[str, Any] = {"vocab_size": vocab, "pad_token_id": 3, "bos_token_id": 1, "eos_token_id": 2}
    small = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
             "num_key_value_heads": 2, "max_position_embeddings": 512, **common}
    if family == "llama":
        return tf.LlamaConfig(**small, head_dim=8)
    if family == "qwen3":
        return tf.Qwen3Config(**small, head_dim=8)
    if family == "gpt2":
        return tf.GPT2Config(n_embd=32, n_layer=4, n_head=4, n_positions=512, **common)
    if family == "gemma3":
        return tf.Gemma3TextConfig(**small, head_dim=8, sliding_window=SLIDING_WINDOW,
                                   layer_types=["sliding_attention", "full_attention"] * 2)
    if family == "gemma4":
        return tf.Gemma4TextConfig(**{**small, "num_hidden_layers": 6}, head_dim=8, sliding_window=SLIDING_WINDOW,
                                   layer_types=["sliding_attention", "full_attention"] * 3, num_kv_shared_layers=2,
                                   hidden_size_per_layer_input=8, vocab_size_per_layer_input=vocab)
    vllm = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 2, "num_key_value_heads": 1,
            "head_dim": 32, "max_position_embeddings": 4096, "sliding_window": VLLM_SLIDING_WINDOW, **common}
    if family == "gemma3-vllm":
        return tf.Gemma3TextConfig(**vllm, num_hidden_layers=4, layer_types=["sliding_attention", "full_attention"] * 2)
    if family == "gemma4-vllm":
        return tf.Gemma4TextConfig(**vllm, global_head_dim=32, num_hidden_layers=6,
                                   layer_types=["sliding_attention", "full_attention"] * 3, num_kv_shared_layers=2,
                                   hidden_size_per_layer_input=8, vocab_size_per_layer_input=vocab)
    if family == "mistral-vllm":  # one sliding window on every layer
        return tf.MistralConfig(**vllm, num_hidden_layers=2)
    raise ValueError(family)


def build(family: str, dirpath: Path, seed: int = 0) -> Path:
    """Save a tiny random model of `family` with the tiny tokenizer into `dirpath`."""
    import torch
    from transformers import AutoModelForCausalLM

    tok = tokenizer(dirpath)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config(family, len(tok)), dtype=torch.float32)
    model.save_pretrained(dirpath)
    return dirpath
