"""Make the embedded default assets: a small text corpus and a byte-level BPE tokenizer.

The default job must run with no network, so the project ships what it trains on. This
module regenerates both deterministically (``python -m qwen3_trainium.make_assets``); the
committed files under ``qwen3_trainium/data/`` are its output.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

DATA_DIR = Path(__file__).parent
CORPUS_DIR = DATA_DIR / "corpus"
TOKENIZER_DIR = DATA_DIR / "tokenizer"
CHAT_DIR = DATA_DIR / "chat_corpus"  # data=chat's conversations (train.jsonl, validation.jsonl)
# objective=dpo's pairs, written by data/preference/corpus.py (make_assets runs it after main())
PREFERENCE_DIR = DATA_DIR / "preference_corpus"
# The shipped tokenizer's chat template: Qwen3's published one (Qwen/Qwen3-0.6B, tokenizer_config.json
# "chat_template", Apache-2.0), verbatim, so data=chat renders exactly as Qwen3 checkpoints do.
CHAT_TEMPLATE = "chat_template.jinja"
HF_TINY_DIR = DATA_DIR / "hf" / "qwen3-tiny"  # generated, not committed (make assets / on first use)
HF_TINY_MOE_DIR = DATA_DIR / "hf" / "qwen3-tiny-moe"  # a Qwen3MoeForCausalLM of tiny_moe's shape
VOCAB_SIZE = 512
EOS = "<|endoftext|>"
SPECIAL_TOKENS = [EOS, "<|im_start|>", "<|im_end|>"]

_NAMES = ["Alice", "Bob", "Carol", "Dave", "Erin", "Frank", "Grace", "Heidi"]
_THINGS = ["apples", "books", "coins", "pencils", "stones", "shells", "cards", "cups"]
_NUMBERS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
_CAPITALS = {
    "France": "Paris", "Japan": "Tokyo", "Italy": "Rome", "Spain": "Madrid",
    "Egypt": "Cairo", "Peru": "Lima", "Kenya": "Nairobi", "Norway": "Oslo",
}  # fmt: skip


def _story(rng: random.Random) -> str:
    a, b = rng.sample(_NAMES, 2)
    thing = rng.choice(_THINGS)
    x, y = rng.randint(1, 9), rng.randint(1, 9)
    return f"{a} has {x} {thing}. {b} gives {a} {y} more {thing}. Now {a} has {x + y} {thing}."


def _counting(rng: random.Random) -> str:
    start = rng.randint(0, 5)
    return " ".join(_NUMBERS[start : start + rng.randint(3, 5)]) + "."


def _capital(rng: random.Random) -> str:
    country = rng.choice(sorted(_CAPITALS))
    return f"The capital of {country} is {_CAPITALS[country]}."


def _arithmetic(rng: random.Random) -> str:
    x, y = rng.randint(0, 20), rng.randint(0, 20)
    return f"{x} plus {y} is {x + y}. {x + y} minus {y} is {x}."


def make_corpus(num_docs: int = 4000, seed: int = 0) -> list[str]:
    """Documents of 1-4 templated sentences: structured enough that loss falls fast."""
    rng = random.Random(seed)
    makers = [_story, _counting, _capital, _arithmetic]
    return [" ".join(rng.choice(makers)(rng) for _ in range(rng.randint(1, 4))) for _ in range(num_docs)]


_QUESTIONS = {
    "capital": ("What is the capital of {country}?", "The capital of {country} is {city}.",
                "{country} is a country. Its capital is {city}."),
    "plus": ("What is {x} plus {y}?", "{x} plus {y} is {z}.", "{x} plus {y}: count {y} up from {x}. That is {z}."),
    "minus": ("What is {z} minus {y}?", "{z} minus {y} is {x}.", "{z} minus {y}: {x} plus {y} is {z}, so it is {x}."),
    "count": ("Count from {a} to {b}.", "{words}.", "Start at {a} and stop at {b}."),
}  # fmt: skip
SYSTEM_PROMPT = "You are a helpful assistant."


def _exchange(rng: random.Random, thinking: bool) -> list[dict]:
    kind = rng.choice(sorted(_QUESTIONS))
    country = rng.choice(sorted(_CAPITALS))
    x, y = rng.randint(0, 20), rng.randint(0, 20)
    start = rng.randint(0, 5)
    stop = start + rng.randint(2, 4)
    values = dict(country=country, city=_CAPITALS[country], x=x, y=y, z=x + y, a=_NUMBERS[start],
                  b=_NUMBERS[stop], words=" ".join(_NUMBERS[start : stop + 1]).capitalize())  # fmt: skip
    question, answer, reasoning = (t.format(**values) for t in _QUESTIONS[kind])
    assistant = {"role": "assistant", "content": answer}
    if thinking:
        assistant["reasoning_content"] = reasoning
    return [{"role": "user", "content": question}, assistant]


def make_chat(num: int, seed: int) -> list[dict]:
    """Conversations of 1-3 exchanges (OpenAI messages), a third with a system prompt and half
    with ``reasoning_content``: enough structure that the chat loss falls within a smoke run."""
    rng = random.Random(seed)
    out = []
    for _ in range(num):
        thinking = rng.random() < 0.5
        messages = [{"role": "system", "content": SYSTEM_PROMPT}] if rng.random() < 1 / 3 else []
        for _ in range(rng.randint(1, 3)):
            messages += _exchange(rng, thinking)
        out.append({"messages": messages})
    return out


def make_chat_corpus() -> tuple[list[dict], list[dict]]:
    """(train, validation): 600 and 60 conversations, the held-out ones none of the training ones."""
    train = make_chat(600, seed=0)
    seen = {json.dumps(c, sort_keys=True) for c in train}
    val = [c for c in make_chat(80, seed=1) if json.dumps(c, sort_keys=True) not in seen][:60]
    return train, val


def write_chat_corpus() -> None:
    train, val = make_chat_corpus()
    CHAT_DIR.mkdir(parents=True, exist_ok=True)
    for name, records in (("train.jsonl", train), ("validation.jsonl", val)):
        with open(CHAT_DIR / name, "w") as f:
            for record in records:
                f.write(json.dumps(record) + "\n")


VALIDATION_SEED = 1
VALIDATION_CANDIDATES = 2000


def make_validation(train_docs: list[str]) -> list[str]:
    """The corpus's held-out slice (``validation.jsonl``): documents of the same kinds, drawn with
    another seed, less every one that is also a training document, so that eval=on's
    ``val_loss`` is measured on text the training stream never sees."""
    seen = set(train_docs)
    return [d for d in make_corpus(VALIDATION_CANDIDATES, seed=VALIDATION_SEED) if d not in seen]


def train_tokenizer(docs: list[str], out_dir: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(docs, trainer=trainer)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": EOS,
        "pad_token": EOS,
        "add_bos_token": False,
        "add_eos_token": False,
        "model_max_length": 40960,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")


def make_hf_model(out_dir: Path = HF_TINY_DIR, seed: int = 0, moe: bool = False) -> Path:
    """A random-init Qwen3 with the ``tiny`` flavor's dimensions, saved as a complete HF
    checkpoint directory (config.json, model.safetensors, tokenizer files). Deterministic.

    Made in a fresh Python process: building torchtitan's HF backend model patches Transformers'
    weight init for the rest of a process, which would change the weights."""
    import subprocess
    import sys

    subprocess.run(
        [
            sys.executable,
            "-m",
            "qwen3_trainium.data.assets",
            "--hf-model",
            str(out_dir),
            str(seed),
            *(["moe"] if moe else []),
        ],
        check=True,
    )
    return out_dir


def _make_hf_model_here(out_dir: Path, seed: int, moe: bool = False) -> None:
    import shutil
    import tempfile

    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3MoeConfig

    from qwen3_trainium.config.flavors import TINY_DIMS, TINY_MOE_DIMS

    dims = TINY_DIMS
    from tokenizers import Tokenizer

    eos_id = Tokenizer.from_file(str(TOKENIZER_DIR / "tokenizer.json")).token_to_id(EOS)
    moe_fields = dict(
        num_experts=TINY_MOE_DIMS["num_experts"], num_experts_per_tok=TINY_MOE_DIMS["top_k"],
        moe_intermediate_size=TINY_MOE_DIMS["moe_hidden"], norm_topk_prob=True, decoder_sparse_step=1,
        mlp_only_layers=[],
    )  # fmt: skip
    config = (Qwen3MoeConfig if moe else Qwen3Config)(
        **(moe_fields if moe else {}),
        vocab_size=dims["vocab"],
        hidden_size=dims["dim"],
        intermediate_size=dims["hidden"],
        num_hidden_layers=dims["n_layers"],
        num_attention_heads=dims["n_heads"],
        num_key_value_heads=dims["n_kv_heads"],
        head_dim=dims["head_dim"],
        max_position_embeddings=dims["max_seq_len"],
        rope_parameters={"rope_type": "default", "rope_theta": dims["rope_theta"]},
        rms_norm_eps=1e-6,
        tie_word_embeddings=not moe,  # as the tiny and tiny_moe flavors
        bos_token_id=None,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
        initializer_range=0.02,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    # Write beside the target, then rename: a half-written directory is never seen as done.
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=out_dir.parent))
    model.save_pretrained(tmp)
    for name in ("tokenizer.json", "tokenizer_config.json", CHAT_TEMPLATE):
        shutil.copy(TOKENIZER_DIR / name, tmp / name)
    if out_dir.exists():
        shutil.rmtree(out_dir)
    tmp.rename(out_dir)


def ensure_hf_model() -> Path:
    """The embedded tiny HF model directory, made on first use."""
    if not (HF_TINY_DIR / "model.safetensors").is_file():
        make_hf_model()
    _with_template(HF_TINY_DIR)
    return HF_TINY_DIR


def _with_template(model_dir: Path) -> None:
    """A tiny model made before the chat template shipped gets it (its tokenizer is the same), and
    one made with the old 4096-position table gets Qwen3's 40960 (no weight depends on it)."""
    import shutil

    if not (model_dir / CHAT_TEMPLATE).is_file():
        shutil.copy(TOKENIZER_DIR / CHAT_TEMPLATE, model_dir / CHAT_TEMPLATE)
    from qwen3_trainium.config.flavors import TINY_DIMS

    config_path = model_dir / "config.json"
    config = json.loads(config_path.read_text())
    if config.get("max_position_embeddings") != TINY_DIMS["max_seq_len"]:
        config["max_position_embeddings"] = TINY_DIMS["max_seq_len"]
        config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def ensure_hf_moe_model() -> Path:
    """A Qwen3MoeForCausalLM with tiny_moe's shape, saved by Transformers (the Hub's per-expert
    layout, ``num_local_experts``), made on first use."""
    if not (HF_TINY_MOE_DIR / "model.safetensors").is_file():
        make_hf_model(HF_TINY_MOE_DIR, seed=0, moe=True)
    _with_template(HF_TINY_MOE_DIR)
    return HF_TINY_MOE_DIR


def main() -> None:
    docs = make_corpus()
    CORPUS_DIR.mkdir(parents=True, exist_ok=True)
    held_out = make_validation(docs)
    for name, records in (("train.jsonl", docs), ("validation.jsonl", held_out)):
        with open(CORPUS_DIR / name, "w") as f:
            for doc in records:
                f.write(json.dumps({"text": doc}) + "\n")
    train_tokenizer(docs, TOKENIZER_DIR)
    write_chat_corpus()
    make_hf_model()
    print(
        f"wrote {len(docs)} training and {len(held_out)} held-out documents to {CORPUS_DIR}, a tokenizer to {TOKENIZER_DIR}, a tiny HF Qwen3 to {HF_TINY_DIR}"
    )


def cli(argv: list[str] | None = None) -> None:
    import sys

    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--hf-model"]:
        _make_hf_model_here(Path(argv[1]), int(argv[2]), moe=argv[3:4] == ["moe"])
    else:
        main()


if __name__ == "__main__":
    cli()
