"""Throughput of unitok's byte-level BPE against the Hugging Face `tokenizers` engine it wraps
and against raw tiktoken on the same vocabulary.

One tokenizer is trained on a slice of the Python standard library's source (the built-in
corpus), then every side encodes the same lines of *other* standard-library files (``--unit
files``: whole files, the documents a language model's data is tokenized as):

1. ``encode``: one string at a time — unitok's ``BPETokenizer.encode`` (ids as a tensor,
   token strings and offsets on demand) against ``tokenizers.Tokenizer.encode`` and
   ``tiktoken.Encoding.encode`` (special tokens allowed, as Hugging Face splits them out).
2. ``batch_encode``: the whole batch — unitok's padded ``Tokens`` against
   ``Tokenizer.encode_batch`` (the Rust batch path, no padding) and ``Encoding.encode_batch``.
3. ``iter_ids``: a corpus streamed into token-file ids (each text + EOS, 256 texts a call, as
   the language-model data modules build their token files) against ``Tokenizer.encode_batch``
   and ``Encoding.encode_batch`` over the same chunks.

unitok runs its default path: tiktoken (`tokenizers_mm.tiktoken_engine`) where its ids are
identical, else Hugging Face; the first printed line says which. All sides are checked to give
the same ids first. Repetitions alternate between the sides; the table reports MB/s (UTF-8
bytes of input per second, medians) and ratios (> 1: the first named is faster).

Run::

    python benchmarks/tokenizer_vs_hf.py --threads 1
    python benchmarks/tokenizer_vs_hf.py --lines 20000 --batch 256
    python benchmarks/tokenizer_vs_hf.py --threads 1 --unit files --batch 16
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script: find timing.py
from timing import alternate, positive_int  # noqa: E402

STREAM_CHUNK = 256  # texts per call as `BPETokenizer.iter_ids` streams a corpus


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--vocab-size", type=int, default=8192)
    p.add_argument("--train-bytes", type=positive_int, default=2_000_000, help="stdlib source the BPE learns from")
    p.add_argument("--unit", choices=("lines", "files"), default="lines",
                   help="what one encode call gets: a line of source, or a whole file")
    p.add_argument("--lines", type=positive_int, default=5000, help="non-empty lines (or files) encoded per repetition")
    p.add_argument("--batch", type=positive_int, default=128, help="lines (or files) per batch_encode call")
    p.add_argument("--repeats", type=positive_int, default=7)
    p.add_argument("--threads", type=positive_int, default=None,
                   help="threads of the Rust engine (RAYON_NUM_THREADS) and torch")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.threads is not None:
        os.environ["RAYON_NUM_THREADS"] = str(args.threads)  # before the engine starts its pool
        import torch

        torch.set_num_threads(args.threads)
    from tasks.data.text import read_texts, stdlib_source_files
    from tokenizers_mm import BPETokenizer
    from tokenizers_mm.tiktoken_engine import build_encoding

    files = stdlib_source_files()
    train, rest = [], []
    size = 0
    for f in files:
        (train if size < args.train_bytes else rest).append(f)
        size += f.stat().st_size
    tok = BPETokenizer.train(files=train, vocab_size=args.vocab_size)
    raw = tok._tok  # the Hugging Face engine inside
    fast = build_encoding(raw)  # raw tiktoken on the same vocabulary (NotRepresentable if none)
    threads = args.threads or os.cpu_count() or 1
    texts = read_texts(rest)
    if args.unit == "files":
        lines = [text for text in texts if text.strip()][: args.lines]
    else:
        lines = [line for text in texts for line in text.splitlines() if line.strip()][: args.lines]
    megabytes = sum(len(line.encode()) for line in lines) / 1e6
    batches = [lines[i:i + args.batch] for i in range(0, len(lines), args.batch)]

    for line in lines:  # the same ids on every side
        ids = raw.encode(line, add_special_tokens=False).ids
        assert tok.encode(line).ids.tolist() == ids == fast.encode(line, allowed_special="all"), line
    batch = tok.batch_encode(batches[0])
    for i, enc in enumerate(raw.encode_batch(batches[0], add_special_tokens=False)):
        assert batch.ids[i][batch.attention_mask[i].bool()].tolist() == enc.ids
    engine = "tiktoken" if tok._fast.available(raw) else f"Hugging Face ({tok._fast.reason})"

    chunks = [lines[i:i + STREAM_CHUNK] for i in range(0, len(lines), STREAM_CHUNK)]
    eos = tok.eos_id
    streamed = list(tok.iter_ids(lines))
    assert streamed == [[*enc.ids, eos] for chunk in chunks for enc in raw.encode_batch(chunk, add_special_tokens=False)]
    runs = {
        "encode unitok": lambda: [tok.encode(line) for line in lines],
        "encode reference": lambda: [raw.encode(line, add_special_tokens=False) for line in lines],
        "encode tiktoken": lambda: [fast.encode(line, allowed_special="all") for line in lines],
        "batch unitok": lambda: [tok.batch_encode(b) for b in batches],
        "batch reference": lambda: [raw.encode_batch(b, add_special_tokens=False) for b in batches],
        "batch tiktoken": lambda: [fast.encode_batch(b, num_threads=threads, allowed_special="all")
                                   for b in batches],
        "iter_ids unitok": lambda: list(tok.iter_ids(lines)),
        "iter_ids reference": lambda: [[*enc.ids, eos] for chunk in chunks
                                       for enc in raw.encode_batch(chunk, add_special_tokens=False)],
        "iter_ids tiktoken": lambda: [[*ids, eos] for chunk in chunks
                                      for ids in fast.encode_batch(chunk, num_threads=threads, allowed_special="all")],
    }
    times = {k: statistics.median(v) for k, v in alternate(runs, args.repeats, warmup=1, device="cpu").items()}
    print(f"{len(lines)} {args.unit}, {megabytes:.2f} MB, vocabulary {tok.vocab_size}, batches of {args.batch}, "
          f"threads={args.threads}; unitok's engine: {engine}")
    print(f"{'workload':10} {'unitok MB/s':>12} {'HF MB/s':>8} {'tiktoken MB/s':>14} "
          f"{'unitok/HF':>10} {'unitok/tiktoken':>16} {'tiktoken/HF':>12}")
    for work in ("encode", "batch", "iter_ids"):
        ours, hf, tk = (megabytes / times[f"{work} {side}"] for side in ("unitok", "reference", "tiktoken"))
        print(f"{work:10} {ours:12.2f} {hf:8.2f} {tk:14.2f} {ours / hf:9.2f}x {ours / tk:15.2f}x {tk / hf:11.2f}x")


if __name__ == "__main__":
    main()
