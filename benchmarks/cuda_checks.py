"""What only a CUDA device can check (CI has none): run it on a GPU; one line a check, exit 1 on a failure.

1. The CPU and CUDA compute the same function: GPT, ViT and T5 logits in float32 (TF32 off).
2. `compile_backbones` through inductor (Triton kernels) gives eager's outputs and gradients on CUDA.
3. bf16 autocast training follows the fp32 loss curve on CUDA (GPT, ViT), as on the CPU.
4. The LM head fused with the loss (`linear_cross_entropy`) equals ``cross_entropy(linear(...))`` on
   CUDA, in float32 and under bf16 autocast, gradients included; eager and with its chunks'
   softmax gradient compiled (``compile=True``: inductor's Triton kernels).
5. A training step on CUDA (GPT's fused loss, ViT's cross-entropy, fused AdamW) makes no host
   sync (``torch.cuda.set_sync_debug_mode("error")``): the input checks' verdicts are read
   deferred (`unitok.checks.deferred_checks`), and bad ids, labels and pixels are still named.
6. Decoding on CUDA: greedy and beam search (GPT, left-padded batches too; T5) give the CPU's tokens; ``generate(compile=True)`` (a
   static cache, the step compiled and captured as a CUDA graph) gives eager's tokens, greedy,
   left-padded and seeded sampling alike; so does compiled beam search (GPT on a left-padded
   batch, T5 with its cross-attention), whose reorders move the rows inside the graph's buffers.

Run::

    python benchmarks/cuda_checks.py                 # needs a CUDA device
    python benchmarks/cuda_checks.py --device cpu    # a dry run of the script itself, CPU against CPU
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from unitok.compile import compile_backbones
from unitok.losses import linear_cross_entropy
from unitok.models import GPT, T5, GPTConfig, T5Config, ViT, ViTConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script: find timing.py
from timing import device_name  # noqa: E402

RESULTS: list[tuple[str, bool, str]] = []
ONLY: list[str] = []  # --only: run just the checks whose names contain one of these
Run = Callable[[torch.nn.Module, str], torch.Tensor]


def check(name: str, fn: Callable[..., str], *args: object) -> None:
    """Run ``fn(*args)``; record a pass (its return value as the detail) or a failure, and print it."""
    if ONLY and not any(part in name for part in ONLY):
        return
    start = time.perf_counter()
    try:
        detail, ok = fn(*args), True
    except Exception as error:  # a failed check is reported, the others still run
        traceback.print_exc()
        detail, ok = f"{type(error).__name__}: {str(error)[:300]}", False
    RESULTS.append((name, ok, f"{detail} ({time.perf_counter() - start:.1f} s)"))
    print(f"{'ok  ' if ok else 'FAIL'} {name}: {RESULTS[-1][2]}", flush=True)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def small_models() -> dict[str, tuple[torch.nn.Module, Run]]:
    """Random causal, bidirectional and encoder–decoder models (dropout off) and how to run each."""
    torch.manual_seed(0)
    ids = torch.randint(0, 512, (4, 48), generator=torch.Generator().manual_seed(1))
    pixels = torch.randn(4, 1, 32, 32, generator=torch.Generator().manual_seed(2))
    return {
        "gpt": (GPT(GPTConfig.from_name("gpt-micro", vocab_size=512, dropout=0.0)),
                lambda m, d: m(ids.to(d)).logits),
        "vit": (ViT(ViTConfig.from_name("vit-digits", dropout=0.0)), lambda m, d: m(pixels.to(d)).logits),
        "t5": (T5(T5Config.from_name("t5-tiny", vocab_size=512, dropout=0.0)),
               lambda m, d: m(ids.to(d), decoder_input_ids=ids[:, :9].to(d)).logits),
    }


# --------------------------------------------------------------------------- the checks
def same_on_cpu_and_device(model: torch.nn.Module, run: Run, device: str) -> str:
    model.eval()
    with torch.no_grad():
        cpu = run(model, "cpu")
        gpu = run(copy.deepcopy(model).to(device), device)
    err = rel_err(gpu, cpu)
    assert err < 1e-5, f"relative error {err:.2e}"
    return f"relative error {err:.1e}"


def compiled_equals_eager(model: torch.nn.Module, run: Run, device: str) -> str:
    torch._dynamo.reset()
    eager = model.to(device).train()
    compiled = copy.deepcopy(eager)
    assert compile_backbones(compiled) >= 1
    out_e, out_c = run(eager, device), run(compiled, device)
    err = rel_err(out_c, out_e)
    assert err < 1e-5, f"outputs: relative error {err:.2e}"
    out_e.square().mean().backward()
    out_c.square().mean().backward()
    worst = max(rel_err(pc.grad, pe.grad) for pe, pc in zip(eager.parameters(), compiled.parameters())
                if pe.grad is not None and pe.grad.norm() > 0)
    assert worst < 1e-4, f"gradients: worst relative error {worst:.2e}"
    return f"outputs {err:.1e}, worst gradient {worst:.1e}"


def per_sample_gradients_as_alone(device: str) -> str:
    """torch.func's per-sample gradients (vmap of grad over functional_call) of a GPT's fused
    loss on the device equal each sample's own; a bad id is still refused there (judged at once)."""
    from torch.func import functional_call, grad, vmap

    torch.manual_seed(7)
    model = GPT(GPTConfig.from_name("gpt-nano", vocab_size=64, context_length=32, dropout=0.0)).to(device).eval()
    ids = torch.randint(0, 64, (3, 16), generator=torch.Generator().manual_seed(8)).to(device)
    params = {name: p.detach() for name, p in model.named_parameters()}

    def loss(p: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        return functional_call(model, p, (x[None],), {"labels": x[None], "return_logits": False}).loss

    together = vmap(grad(loss), in_dims=(None, 0))(params, ids)
    worst = 0.0
    for i in range(ids.shape[0]):
        alone = grad(loss)(params, ids[i])
        worst = max(worst, *(rel_err(together[k][i], alone[k]) for k in params if alone[k].norm() > 0))
    assert worst < 1e-5, f"per-sample gradients: worst relative error {worst:.2e}"
    bad = ids.clone()
    bad[1, 3] = 64
    try:
        vmap(grad(loss), in_dims=(None, 0))(params, bad)
    except ValueError as error:
        assert "token ids [64] are outside the vocabulary [0, 64)" in str(error), str(error)
    else:
        raise AssertionError("an id outside the vocabulary passed under vmap")
    return f"worst relative error {worst:.1e}; a bad id named"


def loss_curve(model: torch.nn.Module, loss_fn: Callable[[torch.nn.Module], torch.Tensor], device: str,
               bf16: bool, steps: int = 60) -> list[float]:
    """The losses of ``steps`` AdamW steps on a copy of ``model`` (bf16: under autocast)."""
    model = copy.deepcopy(model).to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, fused=True)
    losses = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=bf16):
            loss = loss_fn(model)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


def bf16_follows_fp32(model: torch.nn.Module, loss_fn: Callable[[torch.nn.Module], torch.Tensor],
                      device: str) -> str:
    fp32, bf16 = loss_curve(model, loss_fn, device, False), loss_curve(model, loss_fn, device, True)
    assert fp32[-1] < 0.5 * fp32[0], f"fp32 did not learn: {fp32[0]:.3f} -> {fp32[-1]:.3f}"
    gap = max(abs(a - b) / max(abs(a), 0.05) for a, b in zip(fp32[::10], bf16[::10]))
    assert gap < 0.15, f"bf16 strays from fp32 by {gap:.1%}: {fp32[::10]} vs {bf16[::10]}"
    return f"fp32 {fp32[0]:.3f} -> {fp32[-1]:.3f}, bf16 -> {bf16[-1]:.3f}, largest gap {gap:.1%}"


def fused_loss_equals_unfused(device: str, compile: bool = False) -> str:
    """Two chunks (the GPU's 2**27 values: 2,668 rows at V = 50,304), a bias, ignored labels."""
    g = torch.Generator(device=device).manual_seed(4)
    hidden = torch.randn(3000, 256, device=device, generator=g, requires_grad=True)
    weight = (0.05 * torch.randn(50304, 256, device=device, generator=g)).requires_grad_()
    bias = (0.1 * torch.randn(50304, device=device, generator=g)).requires_grad_()
    labels = torch.randint(0, 50304, (3000,), device=device, generator=g)
    labels[::7] = -100
    details = []
    for bf16, tol in ((False, 1e-5), (True, 2e-2)):
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=bf16):
            fused = linear_cross_entropy(hidden, weight, labels, bias, compile=compile)
            plain = F.cross_entropy(F.linear(hidden, weight, bias).float(), labels)
        grads_f = torch.autograd.grad(fused, (hidden, weight, bias))
        grads_p = torch.autograd.grad(plain, (hidden, weight, bias))
        errs = [rel_err(fused, plain)] + [rel_err(a, b) for a, b in zip(grads_f, grads_p)]
        assert max(errs) < tol, f"{'bf16' if bf16 else 'fp32'}: relative errors {errs}"
        details.append(f"{'bf16' if bf16 else 'fp32'} worst {max(errs):.1e}")
    # a model held in bf16 (no autocast): bf16 hidden states and their gradient, the weight's summed in float32
    low = [t.detach().bfloat16().requires_grad_() for t in (hidden, weight, bias)]
    fused = linear_cross_entropy(low[0], low[1], labels, low[2], compile=compile)
    plain = F.cross_entropy(F.linear(*low).float(), labels)
    errs = [rel_err(fused, plain)] + [rel_err(a.float(), b.float()) for a, b in
                                      zip(torch.autograd.grad(fused, low), torch.autograd.grad(plain, low))]
    assert max(errs) < 2e-2, f"bf16 weights: relative errors {errs}"
    details.append(f"bf16 weights worst {max(errs):.1e}")
    return ", ".join(details)


def training_step_without_host_sync(device: str) -> str:
    """Two warm-up steps, then one under sync debug mode "error"; then bad inputs, each named."""
    torch.manual_seed(0)
    gpt = GPT(GPTConfig.from_name("gpt-micro", vocab_size=512, dropout=0.0)).to(device).train()
    vit = ViT(ViTConfig.from_name("vit-digits", dropout=0.0)).to(device).train()
    opt = torch.optim.AdamW([*gpt.parameters(), *vit.parameters()], lr=1e-4, fused=device.startswith("cuda"))
    g = torch.Generator().manual_seed(8)
    ids = torch.randint(0, 512, (4, 64), generator=g).to(device)
    pixels = torch.randn(8, 1, 32, 32, generator=g).to(device)
    classes = torch.randint(0, 10, (8,), generator=g).to(device)

    def step(ids: torch.Tensor = ids, pixels: torch.Tensor = pixels, labels: torch.Tensor = ids) -> None:
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16):
            loss = gpt(ids, labels=labels, return_logits=False).loss + vit(pixels, labels=classes).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()
    step()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
    try:
        step()
    finally:
        if device.startswith("cuda"):
            torch.cuda.set_sync_debug_mode("default")
    bad_ids, bad_labels, bad_pixels = ids.clone(), ids.clone(), pixels.clone()
    bad_ids[1, 3], bad_labels[2, 5], bad_pixels[3, 0, 1, 1] = 512, 600, float("nan")
    errors = []
    for name, kwargs, expected in (("ids", dict(ids=bad_ids), "token ids [512] are outside"),
                                   ("labels", dict(labels=bad_labels), "labels [600] are outside"),
                                   ("pixels", dict(pixels=bad_pixels), "pixel_values contain 1 NaN/inf")):
        try:
            step(**kwargs)
        except ValueError as error:
            assert expected in str(error), f"bad {name}: {error}"
            errors.append(name)
        else:
            raise AssertionError(f"bad {name} passed")
    step()  # the device is still usable: no device-side assert fired
    return f"no sync in a step; bad {', '.join(errors)} named"


def decoding_as_on_the_cpu(model: GPT | T5, device: str, beam: bool, prompt: torch.Tensor,
                           mask: torch.Tensor | None) -> str:
    options = dict(strategy="beam", num_beams=4, max_new_tokens=32) if beam else dict(max_new_tokens=48)
    cpu = model.generate(prompt, attention_mask=mask, **options)
    gpu = copy.deepcopy(model).to(device).generate(prompt.to(device), attention_mask=None if mask is None
                                                   else mask.to(device), **options)
    assert torch.equal(gpu.cpu(), cpu), "tokens differ"
    return "same tokens"


def compiled_decoding_as_eager(gpt: GPT, device: str, graph: bool, prompt: torch.Tensor, padded: torch.Tensor,
                               mask: torch.Tensor) -> str:
    gpt = copy.deepcopy(gpt).to(device)
    prompt, padded, mask = prompt.to(device), padded.to(device), mask.to(device)
    eager = gpt.generate(padded, attention_mask=mask, max_new_tokens=48)
    compiled = gpt.generate(padded, attention_mask=mask, max_new_tokens=48, compile=True, cuda_graph=graph)
    assert torch.equal(compiled, eager), "greedy tokens differ"
    again = gpt.generate(prompt[:1], max_new_tokens=40, compile=True, cuda_graph=graph)
    assert torch.equal(again, gpt.generate(prompt[:1], max_new_tokens=40)), "batch 1 differs"
    sample = dict(strategy="sample", top_k=20, max_new_tokens=32)
    s_e = gpt.generate(prompt, generator=torch.Generator(device).manual_seed(7), **sample)
    s_c = gpt.generate(prompt, generator=torch.Generator(device).manual_seed(7), compile=True, cuda_graph=graph,
                       **sample)
    assert torch.equal(s_c, s_e), "seeded samples differ"
    return "greedy, left-padded, batch 1 and seeded samples: same tokens"


def compiled_search_as_eager(model: GPT | T5, device: str, graph: bool, prompt: torch.Tensor,
                             mask: torch.Tensor) -> str:
    """Greedy and beam search through the compiled step (a CUDA graph where ``graph``) give eager's tokens:
    the graph reads the cache's buffers where they lie, so a beam reorder must move rows in place."""
    model = copy.deepcopy(model).to(device)
    prompt, mask = prompt.to(device), mask.to(device)
    for options in (dict(max_new_tokens=40), dict(strategy="beam", num_beams=4, max_new_tokens=32)):
        eager = model.generate(prompt, attention_mask=mask, **options)
        compiled = model.generate(prompt, attention_mask=mask, compile=True, cuda_graph=graph, **options)
        if not torch.equal(compiled, eager):
            differ = (compiled != eager).nonzero()[0].tolist() if compiled.shape == eager.shape else None
            raise AssertionError(f"{options.get('strategy', 'greedy')} tokens differ: shapes {tuple(compiled.shape)} "
                                 f"and {tuple(eager.shape)}, first difference at (row, position) {differ}")
    return "greedy and 4-beam search on a padded batch of 2: same tokens"


def compiled_decoding_holds_nothing_after(gpt: GPT, device: str) -> str:
    """Repeated ``generate(compile=True)`` calls hold no more device memory than the first left
    held (the CUDA graph's side stream, and the cuBLAS workspace kept for it, are made once)."""
    gpt = copy.deepcopy(gpt).to(device)
    prompt = torch.randint(0, 512, (1, 12), generator=torch.Generator().manual_seed(8)).to(device)
    gpt.generate(prompt, max_new_tokens=24, compile=True)  # compiled, its side stream made
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    peaks = []
    for _ in range(4):
        torch.cuda.reset_peak_memory_stats()
        gpt.generate(prompt, max_new_tokens=24, compile=True)
        torch.cuda.synchronize()
        peaks.append((torch.cuda.max_memory_allocated() - before) / 2**20)
    held = (torch.cuda.memory_allocated() - before) / 2**20
    assert held == 0, f"{held:.1f} MiB more held after four calls (peaks {peaks} MiB)"
    return f"nothing more held after four calls; a call's peak {max(peaks):.1f} MiB"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", type=device_name, default="cuda", help="cuda, or cpu for a dry run of the script")
    p.add_argument("--only", nargs="+", default=[], metavar="TEXT",
                   help="run just the checks whose names contain one of these texts")
    args = p.parse_args(argv)
    device = args.device
    ONLY[:] = args.only
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("cuda_checks.py needs a CUDA device (or --device cpu for a dry run)")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    gpu = torch.cuda.get_device_name() if device.startswith("cuda") else "no GPU (dry run)"
    print(f"torch {torch.__version__}, {gpu}, CUDA {torch.version.cuda}", flush=True)

    for family, (model, run) in small_models().items():
        check(f"cpu == cuda, {family} logits (fp32)", same_on_cpu_and_device, model, run, device)
    for family, (model, run) in small_models().items():
        check(f"compiled (inductor) == eager on cuda, {family} outputs and gradients", compiled_equals_eager,
              model, run, device)

    g = torch.Generator().manual_seed(3)
    text = torch.randint(0, 64, (16, 8), generator=g).repeat(1, 8).to(device)  # periodic: learnable quickly
    digits_x = torch.randn(64, 1, 32, 32, generator=g)
    digits_y = torch.randint(0, 10, (64,), generator=g)
    digits_x = (digits_x + digits_y[:, None, None, None].float() * 0.3).to(device)  # a class signal to learn
    digits_y = digits_y.to(device)
    curves = {
        "gpt": (GPT(GPTConfig.from_name("gpt-micro", vocab_size=64, dropout=0.0)),
                lambda m: m(text, labels=text, return_logits=False).loss),
        "vit": (ViT(ViTConfig.from_name("vit-digits", dropout=0.0)),
                lambda m: F.cross_entropy(m(digits_x).logits, digits_y)),
    }
    for family, (model, loss_fn) in curves.items():
        check(f"bf16 autocast follows fp32 on cuda, {family} loss curve (60 AdamW steps)", bf16_follows_fp32,
              model, loss_fn, device)
    check("linear_cross_entropy == cross_entropy(linear) on cuda (fp32, bf16 autocast), with gradients",
          fused_loss_equals_unfused, device)
    check("linear_cross_entropy(compile=True) == cross_entropy(linear) on cuda: inductor's softmax gradient",
          fused_loss_equals_unfused, device, True)

    check("a training step on cuda makes no host sync (deferred input checks), bad input still named",
          training_step_without_host_sync, device)
    check("torch.func per-sample gradients on cuda == each sample's own (fused loss), bad id named",
          per_sample_gradients_as_alone, device)

    torch.manual_seed(5)
    gpt = GPT(GPTConfig.from_name("gpt-mini", vocab_size=512, dropout=0.0)).eval()
    prompt = torch.randint(0, 512, (2, 12), generator=torch.Generator().manual_seed(6))
    padded, mask = prompt.clone(), torch.ones_like(prompt)
    padded[1, :5], mask[1, :5] = 0, 0  # left padding in the second row
    check("greedy decoding on cuda == cpu (gpt-mini, 48 tokens, a left-padded batch)", decoding_as_on_the_cpu,
          gpt, device, False, padded, mask)
    check("beam search on cuda == cpu (4 beams, 32 tokens)", decoding_as_on_the_cpu, gpt, device, True,
          prompt[:1], None)
    # beam search runs each prompt once and shares its cache out to the beams (KVCache.reorder)
    check("beam search on cuda == cpu (a left-padded batch of 2)", decoding_as_on_the_cpu, gpt, device, True,
          padded, mask)
    t5 = T5(T5Config.from_name("t5-tiny", vocab_size=512, dropout=0.0)).eval()
    check("T5 beam search on cuda == cpu (a padded batch of 2, cross-attention cache shared)",
          decoding_as_on_the_cpu, t5, device, True, padded.flip(1), mask.flip(1))
    for graph in (True, False):
        check(f"compile=True decoding on cuda == eager (static cache, cuda_graph={graph})",
              compiled_decoding_as_eager, gpt, device, graph, prompt, padded, mask)
    for graph in (True, False):
        check(f"compile=True beam search on cuda == eager (GPT, cuda_graph={graph})", compiled_search_as_eager,
              gpt, device, graph, padded, mask)
        check(f"compile=True T5 greedy and beam search on cuda == eager (cuda_graph={graph})",
              compiled_search_as_eager, t5, device, graph, padded.flip(1), mask.flip(1))

    if device.startswith("cuda"):  # the allocator's counts: nothing to dry-run on the CPU
        check("compile=True decoding on cuda holds no more memory call after call", compiled_decoding_holds_nothing_after,
              gpt, device)

    if not RESULTS:
        raise SystemExit(f"no check's name contains any of {ONLY}")
    failed = [name for name, ok, _ in RESULTS if not ok]
    print(f"\n{len(RESULTS) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
