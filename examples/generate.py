"""Greedy generation with flashsplit as a Hugging Face transformers attention implementation.

    python examples/generate.py                          # a tiny random-weight Llama, on any machine
    python examples/generate.py --model PATH             # a checkpoint transformers can load (with its tokenizer)
    python examples/generate.py --model PATH --compile   # GPU: transformers' compiled static-cache generation

A batch of prompts of different lengths, left-padded, decodes over a StaticCache with flashsplit
(prefill runs on SDPA), then again with SDPA, and the new tokens are compared. Needs
``pip install "flashsplit[transformers]"``. Without CUDA, flashsplit's kernels run through the
Triton interpreter (slow, fp16).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys

import torch

if not torch.cuda.is_available():
    # Choose the Triton interpreter for this process before flashsplit imports triton (flashsplit
    # would choose it too, and warn that it did).
    os.environ.setdefault("TRITON_INTERPRET", "1")

import flashsplit.integrations.transformers as fs_transformers  # noqa: E402  (after the interpreter is chosen)

INSTALL_HINT = 'this example needs transformers: pip install "flashsplit[transformers]"'

PROMPTS = ["The capital of France is", "Split-KV attention divides the cache", "Hello"]


def tiny_model(dtype, device):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=64, initializer_range=0.2)
    return LlamaForCausalLM(config).to(device=device, dtype=dtype).eval()


def random_prompts(lengths, vocab: int, device):
    """Left-padded random token ids and their attention mask."""
    generator = torch.Generator().manual_seed(0)
    width = max(lengths)
    ids = torch.zeros(len(lengths), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, n in enumerate(lengths):
        ids[row, width - n:] = torch.randint(1, vocab, (n,), generator=generator)
        mask[row, width - n:] = 1
    return {"input_ids": ids.to(device), "attention_mask": mask.to(device)}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="a local checkpoint (directory or cached id); default: a tiny random Llama")
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--compile", action="store_true", help="let transformers compile the decode step (GPU)")
    args = parser.parse_args(argv)
    if importlib.util.find_spec("transformers") is None:
        sys.exit(INSTALL_HINT)  # exit code 1, the hint on stderr

    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float16
    name = fs_transformers.register()  # "split_kv"
    tokenizer = None
    if args.model:
        model = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype, attn_implementation=name).to(device)
        tokenizer = AutoTokenizer.from_pretrained(args.model, padding_side="left")
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        inputs = tokenizer(PROMPTS, return_tensors="pt", padding=True).to(device)
    else:
        model = tiny_model(dtype, device)
        model.set_attn_implementation(name)
        inputs = random_prompts((12, 7, 3), model.config.vocab_size, device)

    settings = dict(max_new_tokens=args.new_tokens, do_sample=False, cache_implementation="static",
                    disable_compile=not args.compile, pad_token_id=model.config.pad_token_id or 0)
    ours = model.generate(**inputs, **settings)
    model.set_attn_implementation("sdpa")
    reference = model.generate(**inputs, **settings)
    width = inputs["input_ids"].shape[1]
    for row in range(ours.shape[0]):
        new = ours[row, width:]
        text = tokenizer.decode(new, skip_special_tokens=True) if tokenizer else new.tolist()
        same = torch.equal(new, reference[row, width:])
        print(f"row {row}: {text!r}  ({'same as' if same else 'differs from'} SDPA)")


if __name__ == "__main__":
    main()
