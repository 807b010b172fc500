"""The inputs of the real verl GRPO job (tests/test_real_grpo.py): a tiny random Qwen2, its
tokenizer, and gsm8k-shaped parquet files, all made locally (no model hub, no dataset hub).

Runs inside the ``grpo`` engine venv (it needs torch, transformers, tokenizers and pandas)::

    <venv>/bin/python tests/support/grpo/tiny_job.py FOLDER

writes ``FOLDER/model`` (``save_pretrained`` of the model and the tokenizer, with a chat
template), ``FOLDER/data/train.parquet`` (8 prompts) and ``FOLDER/data/test.parquet`` (4). The
same folder comes out every time for one torch/transformers version (fixed seed and texts).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

VOCAB_SIZE = 1024
SEED = 0
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # ids 0, 1, 2
MODEL = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,  # head size 64: one vLLM's CPU attention supports
    "num_key_value_heads": 2,
    "vocab_size": VOCAB_SIZE,
    "max_position_embeddings": 256,
    "bos_token_id": 0,
    "eos_token_id": 2,
    "pad_token_id": 0,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
}
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
# gsm8k-shaped: a question and its number answer (made up, short enough for 64 prompt tokens).
PROBLEMS = (
    ("Tom has 3 apples and buys 4 more. How many apples does he have?", "7"),
    ("A box holds 6 eggs. How many eggs are in 2 boxes?", "12"),
    ("Sara reads 5 pages a day. How many pages does she read in 3 days?", "15"),
    ("There are 9 birds and 4 fly away. How many birds are left?", "5"),
    ("A pen costs 2 dollars. How much do 8 pens cost?", "16"),
    ("Ben runs 10 miles and walks 3 miles. How far does he go?", "13"),
    ("A class has 20 students and 6 are absent. How many are present?", "14"),
    ("Each bag has 4 candies. How many candies are in 5 bags?", "20"),
    ("Mia has 18 stickers and gives away 9. How many are left?", "9"),
    ("A farm has 7 cows and 8 pigs. How many animals are there?", "15"),
    ("Leo saves 3 dollars a week. How much does he save in 6 weeks?", "18"),
    ("A pizza has 8 slices and 5 are eaten. How many slices are left?", "3"),
)
N_TRAIN, N_TEST = 8, 4
DATA_SOURCE = "openai/gsm8k"
_DONE = "tiny_job.json"


def build(folder: Path) -> Path:
    """Write the model, the tokenizer and the parquet files under ``folder`` (unless there)."""
    folder = Path(folder)
    recipe = {"model": MODEL, "seed": SEED, "problems": PROBLEMS, "template": CHAT_TEMPLATE}
    done = folder / _DONE
    if done.is_file() and json.loads(done.read_text()) == json.loads(json.dumps(recipe)):
        return folder
    (folder / "model").mkdir(parents=True, exist_ok=True)
    (folder / "data").mkdir(parents=True, exist_ok=True)
    _tokenizer().save_pretrained(str(folder / "model"))
    _model().save_pretrained(str(folder / "model"), safe_serialization=True)
    _parquet(folder / "data" / "train.parquet", "train", PROBLEMS[:N_TRAIN])
    _parquet(folder / "data" / "test.parquet", "test", PROBLEMS[N_TRAIN : N_TRAIN + N_TEST])
    done.write_text(json.dumps(recipe, indent=1))
    return folder


def _texts() -> list[str]:
    return [f"{q} {INSTRUCTION} #### {a}" for q, a in PROBLEMS] + [
        "The answer is 42. First add the numbers, then multiply.",
        "user assistant system 0123456789 + - * / = ( ) . , ? !",
    ]


def _tokenizer() -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
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
    tok.train_from_iterator(_texts(), trainer=trainer)
    # A few texts give fewer merges than the model's vocabulary: pad it with plain tokens so that
    # every id the random model can emit decodes to something.
    tok.add_tokens([f"<x{i}>" for i in range(VOCAB_SIZE - tok.get_vocab_size())])
    assert tok.get_vocab_size() == VOCAB_SIZE, tok.get_vocab_size()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        model_max_length=MODEL["max_position_embeddings"],
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def _model() -> Any:
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(SEED)
    config = Qwen2Config(**MODEL)
    model = Qwen2ForCausalLM(config).to(torch.float32)
    model.generation_config = GenerationConfig(
        bos_token_id=MODEL["bos_token_id"],
        eos_token_id=MODEL["eos_token_id"],
        pad_token_id=MODEL["pad_token_id"],
    )
    model.eval()
    return model


def _parquet(path: Path, split: str, problems: tuple[tuple[str, str], ...]) -> None:
    import pandas as pd

    rows = [
        {
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": f"{question} {INSTRUCTION}"}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": answer},
            "extra_info": {
                "split": split,
                "index": index,
                "answer": f"#### {answer}",
                "question": question,
            },
        }
        for index, (question, answer) in enumerate(problems)
    ]
    pd.DataFrame(rows).to_parquet(path)


if __name__ == "__main__":
    print(build(Path(sys.argv[1] if len(sys.argv) > 1 else "tiny-grpo-job")))
