"""`unitok sample`: continue prompts with a trained model folder (safetensors + tokenizer)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from tokenizers_mm import BPETokenizer
from tokenizers_mm.checks import check_number, number_bounds
from unitok.models import GPT
from unitok.models.base import read_config


def _count(text: str) -> int:
    """A whole number ≥ 1, for argparse (which names the flag with the message)."""
    value = int(text) if text.strip().lstrip("+-").isdigit() else 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number ≥ 1, got {text!r}")
    return value


def _count_or_zero(text: str) -> int:
    """A whole number ≥ 0, for argparse."""
    if not text.strip().lstrip("+").isdigit():
        raise argparse.ArgumentTypeError(f"must be a whole number ≥ 0, got {text!r}")
    return int(text)


SEED_RANGE = (-(2**63), 2**64 - 1)  # what a torch.Generator takes (a negative seed as its 64-bit two's complement)


def _seed(text: str) -> int:
    """A whole number in torch's seed range, for argparse."""
    low, high = SEED_RANGE
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or not low <= value <= high:
        raise argparse.ArgumentTypeError(f"must be a whole number from {low} to {high}, got {text!r}")
    return value


def _number(low: float = -math.inf, high: float = math.inf, *, low_open: bool = False) -> Callable[[str], float]:
    """A finite float in [low, high] ((low, high] with ``low_open``), for argparse."""
    def parse(text: str) -> float:
        try:
            return check_number("value", float(text), low, high, low_open=low_open)
        except ValueError:  # not a number, or out of bounds: argparse names the flag
            raise argparse.ArgumentTypeError(f"must be a finite number{number_bounds(low, high, low_open=low_open)}, "
                                             f"got {text!r}") from None
    return parse


def _backend(text: str) -> str:
    """A `torch.compile` backend's name, for argparse."""
    from unitok.compile import check_backend

    try:
        check_backend("value", text, callables=False)
    except ValueError as error:  # argparse names the flag
        raise argparse.ArgumentTypeError(str(error).removeprefix("value ")) from None
    return text


# Options that only one strategy reads: given with another, they would be ignored without a word.
STRATEGY_OPTIONS = {"num_beams": "beam", "length_penalty": "beam", "temperature": "sample", "top_k": "sample",
                    "top_p": "sample"}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="unitok sample",
        description="Generate text from a folder written by save_pretrained (e.g. runs/gpt_tiny/latest/pretrained).",
    )
    p.add_argument("--model", required=True, help="folder with model.safetensors + config.json (+ tokenizer.json)")
    p.add_argument("--tokenizer", default=None, help="tokenizer folder, if not the model folder")
    p.add_argument("--prompt", action="append", required=True, help="prompt text; repeat for a batch")
    p.add_argument("--max_new_tokens", type=_count, default=64,
                   help="new tokens a prompt (prompt + new tokens must fit the model's context)")
    p.add_argument("--strategy", choices=["greedy", "sample", "beam"], default="greedy")
    p.add_argument("--num_beams", type=_count, default=None, help="beam: beams (default 4)")
    p.add_argument("--length_penalty", type=_number(), default=None,
                   help="beam: scores divided by length ** length_penalty (default 1.0)")
    p.add_argument("--temperature", type=_number(0.0, low_open=True), default=None, help="sample: (default 1.0)")
    p.add_argument("--top_k", type=_count_or_zero, default=None,
                   help="sample: keep the k likeliest tokens (default 50, as Hugging Face; 0: no top-k filter)")
    p.add_argument("--top_p", type=_number(0.0, 1.0, low_open=True), default=None,
                   help="sample: keep the smallest set of tokens whose probability reaches p")
    p.add_argument("--seed", type=_seed, default=0)
    p.add_argument("--device", default="cpu")
    p.add_argument("--compile", type=_backend, default=None, metavar="BACKEND",
                   help="decode through the compiled static-cache step (e.g. inductor; greedy, sample and beam)")
    return p


def main(argv: Sequence[str] | None = None) -> list[str]:
    parser = build_parser()
    args = parser.parse_args(argv)
    for name, strategy in STRATEGY_OPTIONS.items():
        if getattr(args, name) is not None and args.strategy != strategy:
            parser.error(f"--{name} is read by --strategy {strategy}, not {args.strategy}")
    try:
        return generate_texts(args)
    # a refusal (a prompt too long, a folder that is not a GPT's, a missing tokenizer): one line, exit 2
    except (ValueError, OSError) as error:
        parser.error(str(error))


def check_gpt_folder(folder: str) -> None:
    """``--model`` must be a folder written by ``save_pretrained`` for a GPT."""
    try:
        family, _ = read_config(Path(folder))
    except (OSError, ValueError) as error:
        raise type(error)(f"--model {folder}: {error}") from None
    if family != GPT.__name__:
        raise ValueError(f"--model {folder} holds a {family}, not a GPT: unitok sample continues text with a GPT's "
                         "folder (e.g. runs/gpt_tiny/latest/pretrained)")


def generate_texts(args: argparse.Namespace) -> list[str]:
    check_gpt_folder(args.model)  # before its tokenizer is looked for
    tok = BPETokenizer.load(args.tokenizer or args.model)
    model = GPT.from_pretrained(args.model, map_location=args.device).eval()
    if tok.vocab_size > model.config.vocab_size:
        raise ValueError(f"tokenizer has {tok.vocab_size} tokens but the model only {model.config.vocab_size}")
    options: dict = {}
    if args.strategy == "beam":
        options = {"num_beams": args.num_beams or 4,
                   "length_penalty": 1.0 if args.length_penalty is None else args.length_penalty}
    elif args.strategy == "sample":
        options = {"temperature": 1.0 if args.temperature is None else args.temperature,
                   "top_k": 50 if args.top_k is None else args.top_k, "top_p": args.top_p}
    if args.compile:
        options["compile"] = args.compile
    generator = torch.Generator(device=args.device).manual_seed(args.seed)
    context = model.config.context_length
    prompts = [(prompt, tok.encode(prompt).ids[None].to(args.device)) for prompt in args.prompt]
    for prompt, ids in prompts:  # every prompt checked before any is answered
        if ids.shape[1] + args.max_new_tokens > context:
            raise ValueError(f"prompt {prompt!r} ({ids.shape[1]} tokens) and --max_new_tokens {args.max_new_tokens} "
                             f"exceed the model's context of {context} tokens: ask for at most "
                             f"{context - ids.shape[1]} new tokens" if ids.shape[1] < context else
                             f"prompt {prompt!r} ({ids.shape[1]} tokens) fills the model's context of {context}")
    texts = []
    for _, ids in prompts:
        out = model.generate(ids, max_new_tokens=args.max_new_tokens, strategy=args.strategy, generator=generator,
                             **options)
        text = tok.decode(out[0], skip_special_tokens=True)
        texts.append(text)
        print(f"{text}\n{'-' * 40}")
    return texts
