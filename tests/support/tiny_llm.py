"""A tiny Llama with random weights and a locally trained tokenizer, for real-engine tests.

No model hub: the weights come from a fixed seed and the byte-level BPE tokenizer is trained on a
few fixed sentences, so the same folder comes out every time (for one torch/transformers version).
It needs torch, transformers and tokenizers, so it runs inside an engine venv
(``tests/support/engine_venvs.py``)::

    <venv>/bin/python tests/support/tiny_llm.py /tmp/tiny-llama
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

VOCAB_SIZE = 1024
SEED = 0
SPECIALS = ("<s>", "</s>", "<pad>")  # ids 0, 1, 2
MODEL = {
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "vocab_size": VOCAB_SIZE,
    "max_position_embeddings": 512,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "pad_token_id": 2,
    "tie_word_embeddings": False,
}
SENTENCES = (
    "The quick brown fox jumps over the lazy dog.",
    "Reinforcement learning from human feedback trains a policy with rewards.",
    "Rollout generates sequences; the actor computes log probabilities.",
    "The critic estimates values and the reference model keeps the policy close.",
    "Profilers mark ranges so that a timeline shows where the time goes.",
    "Hello world! 0123456789, and some punctuation: (a) [b] {c} <d> 'e' \"f\".",
    "Once upon a time there was a tiny language model with random weights.",
)
_DONE = "tiny_llm.json"


def build_tiny_llama(folder: Path) -> Path:
    """Write the tiny model and its tokenizer to ``folder`` (skipped when already there)."""
    folder = Path(folder)
    recipe = {"model": MODEL, "seed": SEED, "sentences": SENTENCES, "specials": SPECIALS}
    done = folder / _DONE
    if done.is_file() and json.loads(done.read_text()) == json.loads(json.dumps(recipe)):
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    _tokenizer().save_pretrained(str(folder))
    _model().save_pretrained(str(folder), safe_serialization=True)
    done.write_text(json.dumps(recipe, indent=1))
    return folder


def _tokenizer() -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(SENTENCES), trainer=trainer)
    # A few sentences give fewer merges than the model's vocabulary: pad it with plain tokens so
    # that every id the random model can emit decodes to something.
    tok.add_tokens([f"<x{i}>" for i in range(VOCAB_SIZE - tok.get_vocab_size())])
    assert tok.get_vocab_size() == VOCAB_SIZE, tok.get_vocab_size()
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 0)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )


def _model() -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(SEED)
    config = LlamaConfig(**MODEL)
    model = LlamaForCausalLM(config)
    model.eval()
    return model


if __name__ == "__main__":
    print(build_tiny_llama(Path(sys.argv[1] if len(sys.argv) > 1 else "tiny-llama")))
