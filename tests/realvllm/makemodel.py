"""Make the tier's tiny Llama model in a folder, byte-identical each run, nothing downloaded.

Run by the vLLM virtualenv's interpreter (torch, transformers, tokenizers): `python makemodel.py
DIR`. Random weights from a fixed seed; greedy decoding of them falls into loops, which is what
lets n-gram drafts be accepted.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

VOCAB = 1000
SEED = 44
# A plain template: vLLM's chat endpoint refuses a tokenizer without one.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|> {% endif %}"
)


def corpus() -> list[str]:
    """Generated sentences over a fixed word list: the tokenizer's training text."""
    rng = random.Random(SEED)
    syllables = ["ka", "lo", "mi", "ren", "tu", "sa", "vek", "or", "il", "dan", "pe", "zu"]
    words = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 3)))
             for _ in range(600)]
    words += ["the", "a", "of", "and", "to", "in", "is", "you", "that", "it", "hello", "world"]
    return [" ".join(rng.choice(words) for _ in range(rng.randint(4, 20))) + "."
            for _ in range(4000)]


def make_tokenizer(folder: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>",
                                   bos_token="<s>", eos_token="</s>", pad_token="</s>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(folder)


def make_weights(folder: Path) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    # head_dim 32: vLLM's CPU attention backend refuses 16 at the first request.
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, head_dim=32,
        max_position_embeddings=512, bos_token_id=1, eos_token_id=2, pad_token_id=2,
        tie_word_embeddings=False, torch_dtype="bfloat16")
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config)
    model.save_pretrained(folder, safe_serialization=True)


def main() -> None:
    folder = Path(sys.argv[1])
    folder.mkdir(parents=True, exist_ok=True)
    make_tokenizer(folder)
    make_weights(folder)


if __name__ == "__main__":
    main()
