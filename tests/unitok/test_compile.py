"""The compiled path equals eager: `compile_backbones` compiles every transformer stack as one
graph (no graph breaks), leaves the input checks and evaluation eager, and gives the same
outputs and gradients; the LM head fused with its loss compiles along (`loss_backend`). The
ordinary suite traces with the ``aot_eager`` backend (Dynamo + AOTAutograd, the parts that could
change the maths, without a C++ toolchain's warm-up); ``make test-compile`` runs the same checks
through inductor."""

from __future__ import annotations

import copy
import importlib.util
import os
import pickle

import pytest
import torch

from unitok.backbone import Backbone
from unitok.compile import compile_backbones, loss_backend
from unitok.models import (
    BERT,
    CLIP,
    GPT,
    T5,
    BERTConfig,
    CLIPConfig,
    ConformerConfig,
    ConformerCTC,
    GPTConfig,
    T5Config,
    ViT,
    ViTConfig,
)

BACKEND = os.environ.get("UNITOK_COMPILE_BACKEND", "aot_eager")


def graphs_compiled() -> int:
    """How many graphs Dynamo has captured in this process so far (a running count, which
    `torch._dynamo.reset` leaves as it is): the difference around a call says whether it compiled
    (an identical eager call would pass every comparison below)."""
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


def models():
    torch.manual_seed(0)
    return {
        # dropout off everywhere: the two paths would draw different masks
        "gpt": (GPT(GPTConfig.from_name("gpt-nano", vocab_size=64, dropout=0.0)), lambda m: m(IDS).logits),
        "vit": (ViT(ViTConfig.from_name("vit-digits", dropout=0.0)), lambda m: m(PIXELS).logits),
        "t5": (T5(T5Config.from_name("t5-tiny", vocab_size=64, dropout=0.0)),
               lambda m: m(IDS, decoder_input_ids=IDS[:, :5]).logits),
    }


def more_models():
    """Families whose stacks hold other sublayers (the Conformer's convolution, BatchNorm) or
    two stacks side by side (CLIP's), tiny enough to trace in seconds."""
    torch.manual_seed(0)
    conformer = ConformerCTC(ConformerConfig.from_name(
        "conformer-digits", n_mels=16, d_model=32, n_layers=2, dropout=0.0, vocabulary=tuple("ab "),
        spectrogram={"n_mels": 16}))
    clip = CLIP(CLIPConfig.from_dict({
        "embed_dim": 16, "text": {"d_model": 32, "n_layers": 1, "n_heads": 2, "context_length": 12, "dropout": 0.0},
        "vision": {"image_size": (16, 16), "patch_size": 8, "channels": 1, "d_model": 32, "n_layers": 1, "n_heads": 2,
                   "mean": (0.5,), "std": (0.5,), "crop_pct": None, "dropout": 0.0}}))
    text = clip.text_tokenizer().batch_encode(["a seven", "zero zero"])
    return {
        # one row padded: its padded frames masked in the convolution and attention
        "conformer": (conformer, lambda m: m(FRAMES, torch.tensor([FRAMES.shape[1], 57])).logits),
        "clip": (clip, lambda m: m(PIXELS[:, :, :16, :16], text).logits_per_image),
    }


IDS = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(1))
PIXELS = torch.randn(2, 1, 32, 32, generator=torch.Generator().manual_seed(2))
FRAMES = torch.randn(2, 101, 16, generator=torch.Generator().manual_seed(3))


@pytest.mark.parametrize("family", ["gpt", "vit", "t5", "conformer", "clip"])  # causal, bidirectional, encoder–decoder, …
def test_compiled_backbones_give_the_eager_outputs_and_gradients(family):
    import torch._dynamo

    torch._dynamo.reset()
    eager, run = models()[family] if family in ("gpt", "vit", "t5") else more_models()[family]
    eager.train()
    compiled = copy.deepcopy(eager)
    stacks = compile_backbones(compiled, backend=BACKEND)
    assert stacks >= 1
    assert compiled.state_dict().keys() == eager.state_dict().keys()  # checkpoints unchanged
    before = graphs_compiled()
    out_e = run(eager)
    assert graphs_compiled() == before  # the original stays eager
    out_c = run(compiled)
    assert graphs_compiled() >= before + stacks  # each compiled stack traced (a graph at least)
    torch.testing.assert_close(out_c, out_e, atol=1e-5, rtol=1e-5)
    out_e.square().mean().backward()
    out_c.square().mean().backward()
    for (name, p_e), p_c in zip(eager.named_parameters(), compiled.parameters(), strict=True):
        if p_e.grad is not None:  # (CLIP's logit scale makes gradients of hundreds: rounding scales with them)
            atol = 1e-5 * max(1.0, float(p_e.grad.abs().max()))
            torch.testing.assert_close(p_c.grad, p_e.grad, atol=atol, rtol=1e-4, msg=lambda m, n=name: f"{n}: {m}")


LABELS_RUNS = {  # the fused LM-head loss: labels scored without the logits
    "gpt": lambda m: m(IDS, labels=IDS, return_logits=False).loss,
    "t5": lambda m: m(IDS, labels=IDS[:, :5], return_logits=False).loss,
}


@pytest.mark.parametrize("family", ["gpt", "t5"])
def test_the_fused_lm_loss_compiles_with_the_stacks_while_training(monkeypatch, family):
    import torch._dynamo

    import unitok.losses

    torch._dynamo.reset()
    eager = models()[family][0].train()
    compiled = copy.deepcopy(eager)
    stacks = compile_backbones(compiled, backend=BACKEND)
    assert loss_backend(compiled) == BACKEND and loss_backend(eager) is False
    seen = []
    real = unitok.losses._compiled_softmax_gradient
    monkeypatch.setattr(unitok.losses, "_compiled_softmax_gradient", lambda backend: seen.append(backend) or real(backend))
    before = graphs_compiled()
    loss_e, loss_c = LABELS_RUNS[family](eager), LABELS_RUNS[family](compiled)
    assert seen == [BACKEND]  # only the compiled model's loss took the compiled chunks
    assert graphs_compiled() >= before + stacks + 1  # each stack and the chunk traced, not run eagerly
    torch.testing.assert_close(loss_c, loss_e, atol=1e-6, rtol=1e-6)
    loss_e.backward()
    loss_c.backward()
    for (name, p_e), p_c in zip(eager.named_parameters(), compiled.parameters(), strict=True):
        if p_e.grad is not None:
            torch.testing.assert_close(p_c.grad, p_e.grad, atol=1e-5, rtol=1e-4, msg=lambda m, n=name: f"{n}: {m}")
    compiled.eval()  # evaluation stays eager, the loss too
    assert loss_backend(compiled) is False
    with torch.no_grad():
        LABELS_RUNS[family](compiled)
    assert seen == [BACKEND]


def test_a_backbone_compiles_to_one_graph_without_breaks():
    import torch._dynamo

    gpt = GPT(GPTConfig.from_name("gpt-nano", vocab_size=64)).train()
    x = gpt.tok_embed(IDS)
    explained = torch._dynamo.explain(gpt.backbone)(x)
    assert explained.graph_count == 1 and explained.graph_break_count == 0, explained.break_reasons


def test_a_padded_batch_compiles_each_stack_to_one_graph_its_masks_checked_before_it():
    """Padding masks are checked (values on the host) eagerly, before the graph: inside it those
    reads broke a stack into three graphs."""
    import torch._dynamo

    torch._dynamo.reset()
    conformer, run = more_models()["conformer"]  # its audio rows padded
    t5 = models()["t5"][0]
    mask = torch.ones_like(IDS)
    mask[1, 7:] = 0  # a padded source: the encoder's self-attention and the decoder's cross-attention
    for eager, call in ((conformer, run), (t5, lambda m: m(IDS, attention_mask=mask, decoder_input_ids=IDS[:, :5]).logits)):
        eager.train()
        compiled = copy.deepcopy(eager)
        stacks = compile_backbones(compiled, backend=BACKEND)
        before = graphs_compiled()
        torch.testing.assert_close(call(compiled), call(eager), atol=1e-5, rtol=1e-5)
        assert graphs_compiled() == before + stacks, "one graph a stack: no break at the masks"
    with pytest.raises(ValueError, match=r"attention_mask holds \[2\]: expected 1 for a real token and 0"):
        compiled(IDS, attention_mask=mask * 2, decoder_input_ids=IDS[:, :5])  # still refused, compiled
    empty = mask.clone()
    empty[0] = 0
    with pytest.raises(ValueError, match=r"source row\(s\) \[0\] are empty"):
        compiled(IDS, attention_mask=empty, decoder_input_ids=IDS[:, :5])
    # a whole model traced by torch.compile still checks its stacks' masks, its stacks compiled by
    # `compile_backbones` or not, training or evaluating
    for stacks_compiled in (False, True):
        for training in (True, False):
            bert = BERT(BERTConfig.from_name("bert-nano", vocab_size=64, context_length=16)).train(training)
            if stacks_compiled:
                compile_backbones(bert, backend=BACKEND)
            whole = torch.compile(bert, backend=BACKEND)
            with pytest.raises(ValueError, match=r"attention_mask holds \[2\]: expected 1 for a real token and 0"):
                whole(IDS, attention_mask=mask * 2)
    with pytest.raises(ValueError, match=r"backbone expects \(batch, tokens, 64\), got \(64,\)"):
        compiled.encoder.train()(torch.zeros(64))  # the compiled path names a bad input as eager does


def test_evaluation_stays_eager_and_bad_input_is_still_refused():
    import torch._dynamo

    torch._dynamo.reset()
    gpt = GPT(GPTConfig.from_name("gpt-nano", vocab_size=64))
    compile_backbones(gpt, backend=BACKEND)
    assert compile_backbones(gpt, backend=BACKEND) == 0  # already compiled: nothing more
    counts = torch._dynamo.utils.counters["stats"]
    before = counts["calls_captured"]
    gpt.eval()
    with torch.no_grad():
        gpt.generate(IDS[:, :3], max_new_tokens=4)  # a KV cache grows every token: eager
    assert counts["calls_captured"] == before
    with pytest.raises(ValueError, match="outside"):
        gpt.train()(torch.full((1, 4), 99))  # the embedder's check runs eagerly, before the graph


def test_a_copy_of_a_compiled_model_computes_with_its_own_weights():
    # An EMA or teacher copy (copy.deepcopy), a pickled model (torch.save): the compiled call is
    # the original's, bound to its weights; a copy runs eagerly on its own until compiled in turn.
    import torch._dynamo

    torch._dynamo.reset()
    original = GPT(GPTConfig.from_name("gpt-nano", vocab_size=64, dropout=0.0)).train()
    compile_backbones(original, backend=BACKEND)
    copied = copy.deepcopy(original)
    with torch.no_grad():
        for p in copied.backbone.parameters():
            p.add_(torch.randn_like(p))  # the copy's stack weights alone
    reference = GPT(original.config).train()
    reference.load_state_dict(copied.state_dict())
    out = copied(IDS).logits
    torch.testing.assert_close(out, reference(IDS).logits)
    out.square().mean().backward()
    assert all(p.grad is not None for p in copied.backbone.parameters())
    assert all(p.grad is None for p in original.backbone.parameters())  # nothing reached the original
    assert not getattr(copied.backbone, "_unitok_compiled", False) and loss_backend(copied) is False
    assert compile_backbones(copied, backend=BACKEND) == 1  # a copy compiles in turn
    assert loss_backend(copied) == BACKEND
    torch.testing.assert_close(copied(IDS).logits, reference(IDS).logits, atol=1e-5, rtol=1e-5)
    loaded = pickle.loads(pickle.dumps(original))  # what torch.save(model) does
    torch.testing.assert_close(loaded(IDS).logits, original(IDS).logits)
    assert compile_backbones(loaded, backend=BACKEND) == 1


def test_a_backend_torch_compile_does_not_know_is_refused_before_compiling():
    gpt = GPT(GPTConfig.from_name("gpt-nano", vocab_size=64))
    with pytest.raises(ValueError, match="backend must be a callable or the name of a torch.compile backend "
                                         r"\(.*aot_eager.*\), got 'bogus'"):
        compile_backbones(gpt, backend="bogus")
    assert not getattr(gpt.backbone, "_unitok_compiled", False) and loss_backend(gpt) is False


def test_a_registered_backend_whose_package_is_missing_is_refused_before_compiling():
    # Dynamo registers tvm and openxla whether or not their packages are installed (here they are not)
    from unitok.generate import GenerationConfig

    for backend, package in (("tvm", "tvm"), ("openxla", "torch_xla")):
        assert importlib.util.find_spec(package) is None
        gpt = GPT(GPTConfig.from_name("gpt-nano", vocab_size=64))
        with pytest.raises(ValueError, match=f"backend='{backend}' needs the '{package}' package, which is not installed"):
            compile_backbones(gpt, backend=backend)
        assert not getattr(gpt.backbone, "_unitok_compiled", False)
        with pytest.raises(ValueError, match=f"compile='{backend}' needs the '{package}' package"):
            GenerationConfig(compile=backend)


def test_the_compile_callback_trains_a_task_to_the_eager_losses(tmp_path):
    import lightning as L
    import torch._dynamo

    from tasks import CausalLMTask, Compile

    def losses(callbacks):
        torch._dynamo.reset()
        L.seed_everything(0)
        task = CausalLMTask(vocab_size=64, context_length=16, preset="gpt-nano", dropout=0.0, learning_rate=1e-2,
                            warmup_steps=0)
        seen = []

        class Record(L.Callback):
            def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
                seen.append(float(outputs["loss"].detach()))

        data = torch.utils.data.DataLoader([{"input_ids": IDS[i % 2, :-1], "labels": IDS[i % 2, 1:]} for i in range(12)],
                                           batch_size=2)
        trainer = L.Trainer(max_steps=6, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                            enable_model_summary=False, callbacks=[Record(), *callbacks], default_root_dir=tmp_path)
        before = graphs_compiled()
        trainer.fit(task, train_dataloaders=data)
        stacks = [m for m in task.modules() if isinstance(m, Backbone) and getattr(m, "_unitok_compiled", None)]
        return seen, len(stacks), graphs_compiled() - before

    (eager, eager_stacks, eager_graphs), (compiled, stacks, graphs) = losses([]), losses([Compile(backend=BACKEND)])
    assert len(eager) == 6
    assert (eager_stacks, eager_graphs) == (0, 0)
    assert stacks == 1 and graphs >= 1  # the callback compiled the GPT's stack, and training ran it
    torch.testing.assert_close(compiled, eager, atol=1e-5, rtol=1e-5)
