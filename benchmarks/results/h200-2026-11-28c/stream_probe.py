"""Device memory held after repeated ``generate(compile=True)`` calls on CUDA: the side stream the
CUDA graph is warmed up and captured on made fresh each call (as before 2026-11-28's fix) against
one kept for the process (`unitok.generate._capture_stream`). GPT-124M-sized, batch 1."""

import torch

import unitok.generate as generate
from unitok.models import GPT, GPTConfig

torch.backends.cuda.matmul.allow_tf32 = False
gpt = GPT(GPTConfig(vocab_size=50304, d_model=768, n_layers=12, n_heads=12, context_length=1024,
                    dropout=0.0)).eval().cuda()
prompt = torch.randint(0, 50304, (1, 16), generator=torch.Generator().manual_seed(0)).cuda()
kept = generate._capture_stream
for name, streams in (("a fresh stream a call", lambda device: torch.cuda.Stream(device)), ("one kept", kept)):
    generate._capture_stream = streams
    gpt.generate(prompt, max_new_tokens=128, compile=True)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    for call in range(5):
        torch.cuda.reset_peak_memory_stats()
        gpt.generate(prompt, max_new_tokens=128, compile=True)
        torch.cuda.synchronize()
        print(f"{name}: call {call + 1}: peak {(torch.cuda.max_memory_allocated() - base) / 2**20:.1f} MiB, "
              f"held since the first {(torch.cuda.memory_allocated() - base) / 2**20:.1f} MiB", flush=True)
generate._capture_stream = kept
