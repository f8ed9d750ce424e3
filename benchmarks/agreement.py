"""Greedy agreement with float32 transformers on everyday chat prompts (issue 25, item 5).

Quality the way a chat user feels it: for each prompt (PROMPTS, our own, formatted by the model's chat template),
the first TOKENS greedy tokens of float32 transformers on the source checkpoint, and whether a package produces
exactly those (up to and including an end-of-sequence token). A package whose numbers differ only by float
summation order keeps nearly all; 8-bit activations on every linear flip some answers early.

    python benchmarks/agreement.py SOURCE PKG [PKG ...] [--json]

SOURCE is the Hugging Face checkpoint directory the packages were compiled from (for SmolLM2:
~/.cache/deploycc/models/SmolLM2-135M-Instruct, made by scripts/fetch_smollm2.py). The transformers tokens are
cached by checkpoint and prompt (DEPLOYCC_HOME/agreement). Needs torch and transformers.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

TOKENS = 32
PROMPTS = [
    "What is the capital of France?",
    "Give me three tips for sleeping better.",
    "How do I boil an egg?",
    "Write a short poem about the sea.",
    "What is photosynthesis?",
    "Can you recommend a good book for a long flight?",
    "How many days are there in a leap year?",
    "Explain what a computer virus is.",
    "What should I pack for a weekend camping trip?",
    "Translate 'good morning' into Spanish.",
    "Why is the sky blue?",
    "How do I make a cup of tea?",
    "What is the difference between weather and climate?",
    "Write a Python function that reverses a string.",
    "What are the health benefits of walking?",
    "Tell me a fun fact about octopuses.",
    "How can I save money on groceries?",
    "What is the tallest mountain in the world?",
    "Summarize the story of Cinderella in two sentences.",
    "How does a refrigerator keep food cold?",
    "What is 15 multiplied by 12?",
    "Give me a name for a friendly robot.",
    "How do I start learning to play the guitar?",
    "What causes earthquakes?",
    "Write a polite email asking my manager for a day off.",
    "What is the largest planet in our solar system?",
    "How can I improve my handwriting?",
    "What are some good stretches after running?",
    "Explain the rules of tic-tac-toe.",
    "Who wrote Romeo and Juliet?",
    "What is a healthy breakfast?",
    "How do plants drink water?",
    "Describe a cat to someone who has never seen one.",
    "What is the boiling point of water?",
    "Give me an idea for a birthday party.",
    "What does a firefighter do?",
    "How do I keep my houseplants alive?",
    "What is the meaning of the word 'nostalgia'?",
    "Why do we need to drink water?",
    "Suggest a simple recipe for dinner tonight.",
    "What is the capital of Japan?",
    "How do bees make honey?",
    "Give me two ideas for a rainy afternoon.",
    "What is a noun? Give an example.",
    "How long should I cook rice?",
    "Why do leaves change colour in autumn?",
    "Write a haiku about winter.",
    "What is the difference between a virus and a bacterium?",
    "How do I tie a tie?",
    "What is the speed of light?",
    "Give me a tip for a job interview.",
    "What language is spoken in Brazil?",
    "How can I be more productive in the morning?",
    "Explain what gravity is to a child.",
    "What are the three primary colours?",
    "Write a sentence using the word 'serendipity'.",
    "What is the freezing point of water in Fahrenheit?",
    "How does a rainbow form?",
    "Name three animals that live in the ocean.",
    "What is the main ingredient of guacamole?",
    "How do I write a thank-you note?",
    "What is the square root of 81?",
    "Why is exercise good for the brain?",
    "What should I do if I cannot sleep?",
    "Tell me a short joke.",
    "What does DNA stand for?",
    "How many continents are there?",
    "Give me a tip for learning a new language.",
    "What is the largest ocean on Earth?",
    "How do I clean a cast iron pan?",
    "What is a good way to start a story?",
    "Explain what an atom is.",
    "Who painted the Mona Lisa?",
    "How do I stay focused while studying?",
    "What is the difference between a lake and a pond?",
    "Suggest a name for a bakery.",
    "What is inflation?",
    "How do birds fly?",
    "What are vitamins?",
    "Write a two-line rhyme about a dog.",
    "What is the best way to learn to cook?",
    "Why do we have seasons?",
    "How do I make my password more secure?",
    "What is the longest river in the world?",
    "What is a volcano?",
    "How do I calm down when I am nervous?",
    "What is 7 times 8?",
    "Recommend a board game for a family evening.",
    "What is the purpose of a seatbelt?",
    "How can I reduce plastic waste at home?",
    "Describe the taste of a lemon.",
    "What is the function of the heart?",
    "How do I plant a tree?",
    "What is the capital of Italy?",
    "Write a short motivational quote.",
    "What is the difference between a frog and a toad?",
    "How do solar panels work?",
    "What does a librarian do?",
    "Give me a fun activity to do with kids.",
    "Why is the ocean salty?",
]


def prompt_ids(tokenizer, prompt: str) -> list[int]:
    text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                         tokenize=False)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _cut(tokens: list[int], eos: set[int]) -> list[int]:
    """Tokens up to and including the first end-of-sequence token: what a chat user sees."""
    for i, t in enumerate(tokens):
        if t in eos:
            return tokens[: i + 1]
    return tokens


def reference_tokens(source: Path, prompts: int = len(PROMPTS),
                     batched: bool = False) -> tuple[list[list[int]], list[list[int]], set[int]]:
    """(prompt ids, transformers' greedy tokens, end-of-sequence ids) for the first `prompts` prompts, cached.
    batched: all prompts in one batch, left-padded and masked, positions counted from each prompt's first token (as
    transformers' generate() does): the weights are read once a step for all of them (a float32 135M model's 540 MB
    a step made one prompt at a time 60 ms a token on one core); the rows' sums are blocked differently, which can
    flip a greedy near-tie."""
    import transformers as tf

    tok = tf.AutoTokenizer.from_pretrained(source)
    ids = [prompt_ids(tok, p) for p in PROMPTS[:prompts]]
    gen = json.loads((source / "generation_config.json").read_text()) if (source / "generation_config.json").exists() else {}
    eos = gen.get("eos_token_id", tok.eos_token_id)
    eos = set(eos if isinstance(eos, list) else [eos])
    digest = hashlib.sha256()
    for name in sorted(p.name for p in source.glob("*.safetensors")) + ["config.json"]:
        digest.update((source / name).read_bytes() if name == "config.json" else str((source / name).stat().st_size).encode())
    digest.update(json.dumps([ids, TOKENS, "kv-loop-batched" if batched else "kv-loop"]).encode())
    cache = Path(os.environ.get("DEPLOYCC_HOME", Path.home() / ".cache" / "deploycc")) / "agreement"
    at = cache / f"{digest.hexdigest()[:24]}.json"
    if at.exists():
        return ids, json.loads(at.read_text()), eos
    import torch

    model = tf.AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    model.eval()
    with torch.no_grad():  # greedy with the KV cache, by hand: generate()'s per-token overhead is 10x the model's
        out = _batched_greedy(model, ids) if batched else [_greedy(model, p) for p in ids]
    cache.mkdir(parents=True, exist_ok=True)
    at.write_text(json.dumps(out))
    return ids, out, eos


def _greedy(model, prompt: list[int]) -> list[int]:
    """TOKENS greedy tokens for one prompt."""
    import torch

    step = model(torch.tensor([prompt]), use_cache=True)
    tokens = [int(step.logits[0, -1].argmax())]
    while len(tokens) < TOKENS:
        step = model(torch.tensor([[tokens[-1]]]), past_key_values=step.past_key_values, use_cache=True)
        tokens.append(int(step.logits[0, -1].argmax()))
    return tokens


def _batched_greedy(model, ids: list[list[int]]) -> list[list[int]]:
    """TOKENS greedy tokens for every prompt of `ids` in one left-padded batch."""
    import torch

    width = max(len(p) for p in ids)
    x = torch.tensor([[0] * (width - len(p)) + p for p in ids])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in ids])
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    step = model(x, attention_mask=mask, position_ids=pos, use_cache=True)
    tokens = [step.logits[:, -1].argmax(-1)]
    while len(tokens) < TOKENS:
        mask = torch.cat([mask, torch.ones(len(ids), 1, dtype=mask.dtype)], 1)
        pos = pos[:, -1:] + 1
        step = model(tokens[-1][:, None], attention_mask=mask, position_ids=pos, past_key_values=step.past_key_values,
                     use_cache=True)
        tokens.append(step.logits[:, -1].argmax(-1))
    return torch.stack(tokens, 1).tolist()


def package_tokens(package: Path, ids: list[list[int]]) -> tuple[list[list[int]], float]:
    """Greedy tokens of a package for every prompt, and its decode speed (tokens/s over all prompts)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from deploycc.runtime.engine import Engine

    engine = Engine.load(package)
    out, decode_s, decoded = [], 0.0, 0
    for p in ids:
        engine.reset()
        tokens = [int(np.argmax(engine.prefill(p)))]
        t = time.perf_counter()
        while len(tokens) < TOKENS:
            tokens.append(int(np.argmax(engine.decode(tokens[-1]))))
        decode_s += time.perf_counter() - t
        decoded += TOKENS - 1
        out.append(tokens)
    return out, decoded / decode_s


def agreement(want: list[list[int]], got: list[list[int]], eos: set[int]) -> float:
    """The fraction of prompts whose first TOKENS greedy tokens (cut at end of sequence) are all kept."""
    return sum(_cut(w, eos) == _cut(g, eos)[: len(_cut(w, eos))] for w, g in zip(want, got)) / len(want)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("source", type=Path)
    ap.add_argument("packages", type=Path, nargs="+")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    ids, want, eos = reference_tokens(args.source)
    rows = []
    for pkg in args.packages:
        got, speed = package_tokens(pkg, ids)
        manifest = json.loads((pkg / "manifest.json").read_text())
        bits = manifest["kernels"].get("native", {}).get("activations") or {}
        rows.append({"package": str(pkg), "agreement": agreement(want, got, eos), "prompts": len(ids),
                     "linears_16bit": sum(b == 16 for b in bits.values()), "linears_rounded": len(bits),
                     "decode_tok_s": round(speed, 1)})
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print(f"{'package':50s} {'agreement':>9s} {'16-bit':>8s} {'decode tok/s':>12s}")
    for r in rows:
        print(f"{r['package'][-50:]:50s} {r['agreement']:9.0%} {r['linears_16bit']:>4d}/{r['linears_rounded']:<3d} "
              f"{r['decode_tok_s']:12.1f}")


if __name__ == "__main__":
    main()
