"""`unitok sample`: continue prompts with a trained model folder (safetensors + tokenizer)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import torch

from tokenizers_mm import BPETokenizer
from unitok.models import GPT


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="unitok sample",
        description="Generate text from a folder written by save_pretrained (e.g. runs/gpt_tiny/latest/pretrained).",
    )
    p.add_argument("--model", required=True, help="folder with model.safetensors + config.json (+ tokenizer.json)")
    p.add_argument("--tokenizer", default=None, help="tokenizer folder, if not the model folder")
    p.add_argument("--prompt", action="append", required=True, help="prompt text; repeat for a batch")
    p.add_argument("--max_new_tokens", type=int, default=64)
    p.add_argument("--strategy", choices=["greedy", "sample", "beam"], default="greedy")
    p.add_argument("--num_beams", type=int, default=4)
    p.add_argument("--length_penalty", type=float, default=1.0)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top_k", type=int, default=None)
    p.add_argument("--top_p", type=float, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu")
    p.add_argument("--compile", default=None, metavar="BACKEND",
                   help="greedy / sample: decode through the compiled static-cache step (e.g. inductor)")
    return p


def main(argv: Sequence[str] | None = None) -> list[str]:
    args = build_parser().parse_args(argv)
    tok = BPETokenizer.load(args.tokenizer or args.model)
    model = GPT.from_pretrained(args.model, map_location=args.device).eval()
    if tok.vocab_size > model.config.vocab_size:
        raise ValueError(f"tokenizer has {tok.vocab_size} tokens but the model only {model.config.vocab_size}")
    options: dict = {}
    if args.strategy == "beam":
        options = {"num_beams": args.num_beams, "length_penalty": args.length_penalty}
    elif args.strategy == "sample":
        options = {"temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p}
    if args.compile:
        options["compile"] = args.compile
    generator = torch.Generator(device=args.device).manual_seed(args.seed)
    texts = []
    for prompt in args.prompt:
        ids = tok.encode(prompt).ids[None].to(args.device)
        budget = min(args.max_new_tokens, model.config.context_length - ids.shape[1])
        if budget < 1:
            raise ValueError(f"prompt of {ids.shape[1]} tokens leaves no room in context {model.config.context_length}")
        out = model.generate(ids, max_new_tokens=budget, strategy=args.strategy, generator=generator, **options)
        text = tok.decode(out[0], skip_special_tokens=True)
        texts.append(text)
        print(f"{text}\n{'-' * 40}")
    return texts
