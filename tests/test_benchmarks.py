"""The benchmarks' shared pieces: the precision option (bf16 autocast on both sides) and the GPT
benchmark's model FLOP/s and MFU, and how each benchmark prepares its process."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import claim  # noqa: E402
import deferred_checks  # noqa: E402
import gpt_vs_hf  # noqa: E402
import summary  # noqa: E402
import t5_vs_hf  # noqa: E402
import timing  # noqa: E402


def test_fp32_runs_as_is_and_bf16_autocasts_matmuls():
    a, b = torch.randn(4, 8), torch.randn(8, 3)
    with timing.autocast("cpu", "fp32"):
        assert (a @ b).dtype == torch.float32
    with timing.autocast("cpu", "bf16"):
        assert (a @ b).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="one of .*fp32.*bf16.*got 'fp16'"):
        timing.autocast("cpu", "fp16")


def test_gpt_flops_a_token_count_every_weight_but_the_position_table():
    args = gpt_vs_hf.parse_args(["--d-model", "64", "--n-layers", "2", "--n-heads", "2", "--vocab-size", "512",
                                 "--context-length", "128", "--seq-len", "32"])
    ours, _ = gpt_vs_hf.build_models(args)
    D, L, V, T = 64, 2, 512, 32
    # GPT-2's weights a layer: two norms (2D each), qkv (3D² + 3D), out (D² + D), MLP (8D² + 5D);
    # the token table (tied LM head) and the final norm.
    weights = V * D + L * (12 * D * D + 13 * D) + 2 * D
    assert gpt_vs_hf.flops_per_token(ours, args) == 6 * weights + 12 * L * D * T


def test_profiled_device_kernels_are_summed_by_kind_against_the_wall_time():
    from types import SimpleNamespace as Event

    cuda, cpu = torch.autograd.DeviceType.CUDA, torch.autograd.DeviceType.CPU
    events = [Event(key="nvjet_sm90_tst_192x192_NNN", device_type=cuda, self_device_time_total=6000.0),
              Event(key="cudnn_generated_fort_native_sdpa_sm90_flash_bprop", device_type=cuda,
                    self_device_time_total=2000.0),
              Event(key="triton_per_fused_native_layer_norm_0", device_type=cuda, self_device_time_total=1500.0),
              Event(key="void at::native::multi_tensor_apply_kernel<FusedAdam>", device_type=cuda,
                    self_device_time_total=250.0),
              Event(key="void at::native::vectorized_elementwise_kernel", device_type=cuda,
                    self_device_time_total=250.0),
              Event(key="aten::mm", device_type=cpu, self_device_time_total=9000.0)]  # an operator: counted once, as its kernel
    line = gpt_vs_hf.kernel_time_by_kind(Event(key_averages=lambda: events), wall=0.0125)
    assert line == ("device kernels, 3 steps: GEMM 6.0 ms (60 %), attention 2.0 ms (20 %), fused (inductor) 1.5 ms "
                    "(15 %), optimizer 0.2 ms (2 %), other 0.2 ms (2 %); 10.0 ms in all, 80 % of 12.5 ms wall")
    assert gpt_vs_hf.kernel_time_by_kind(Event(key_averages=lambda: events[-1:]), wall=1.0) == (
        "device kernels: none recorded")


def test_peak_is_given_or_known_and_absent_on_the_cpu():
    assert gpt_vs_hf.peak_tflops(gpt_vs_hf.parse_args([])) is None
    assert gpt_vs_hf.peak_tflops(gpt_vs_hf.parse_args(["--peak-tflops", "2.5"])) == 2.5


def test_gpt_benchmark_reports_bf16_training_flops_and_mfu(monkeypatch, capsys):
    """With --precision bf16 both contenders' training steps (the same-loss and the labels= path)
    run their projections in bfloat16 under autocast, and the report gives their FLOP/s and MFU."""
    # GPT-2's projections are Conv1D layers (its lm_head an nn.Linear)
    from transformers.pytorch_utils import Conv1D

    dtypes: dict[tuple[str, str], set[torch.dtype]] = {}  # (library, loss) -> projection output dtypes
    real = gpt_vs_hf.make_train_step

    def spy(model, ids, steps, amp, fused=None, loss_fn=gpt_vs_hf.same_loss):
        seen = dtypes.setdefault((type(model).__module__.split(".")[0], loss_fn.__name__), set())

        def recorded_loss(model, ids):  # called inside the step, where autocast is (or is not) on
            hooks = [m.register_forward_hook(lambda m, args, out: seen.add(out.dtype))
                     for m in model.modules() if isinstance(m, (torch.nn.Linear, Conv1D))]
            try:
                return loss_fn(model, ids)
            finally:
                for hook in hooks:
                    hook.remove()

        return real(model, ids, steps, amp, fused, loss_fn=recorded_loss)

    monkeypatch.setattr(gpt_vs_hf, "make_train_step", spy)
    result = gpt_vs_hf.main(["--d-model", "32", "--n-layers", "1", "--n-heads", "2", "--vocab-size", "128",
                             "--batch-size", "2", "--seq-len", "16", "--repeats", "1", "--warmup", "0",
                             "--skip-generate", "--precision", "bf16", "--peak-tflops", "0.5", "--threads", "1"])
    train = result["train"]
    for side in ("unitok", "hf", "unitok default", "hf default"):  # default: each side's labels= path
        assert train["gflops"][side] > 0
        assert train["mfu"][side] == pytest.approx(train["gflops"][side] / 500)
    out = capsys.readouterr().out
    assert "precision=bf16" in out and "default paths (labels=)" in out
    rows = {row[0]: row for row in summary.rows_of("gpt", result)}
    fused = rows["GPT, `labels=` paths (LM head fused with the loss)"]
    assert fused[1] == pytest.approx(train["unitok default"] / train["hf default"])
    assert dtypes == {(library, loss): {torch.bfloat16} for library in ("unitok", "transformers")
                      for loss in ("same_loss", "default_loss")}


def test_every_benchmark_prepares_its_process_the_same_way(monkeypatch):
    import argparse

    calls = []
    monkeypatch.setattr(timing, "keep_freed_memory", lambda: calls.append("keep") or True)
    monkeypatch.setattr(torch, "set_num_threads", lambda n: calls.append(n))
    timing.prepare_process(argparse.Namespace(malloc="keep", threads=1, device="cpu"))
    assert calls == ["keep", 1]
    timing.prepare_process(argparse.Namespace(malloc="default", threads=None, device="cpu"))
    assert calls == ["keep", 1]  # glibc as it is, torch's thread count
    with pytest.raises(ValueError, match="malloc must be one of.*got 'tuned'"):
        timing.prepare_process(argparse.Namespace(malloc="tuned", threads=None, device="cpu"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="--device cuda asked for, but CUDA is not available"):
        timing.prepare_process(argparse.Namespace(malloc="default", threads=None, device="cuda"))
    # on CUDA, fp32 is plain fp32: no TF32 in matmuls or cuDNN's convolutions
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32  # process-wide switches
    try:
        torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = True
        timing.prepare_process(argparse.Namespace(malloc="default", threads=None, device="cuda"))
        assert not torch.backends.cudnn.allow_tf32 and not torch.backends.cuda.matmul.allow_tf32
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


@pytest.mark.parametrize("parse", [gpt_vs_hf.parse_args, t5_vs_hf.parse_args])
def test_step_and_repetition_counts_below_one_are_refused(parse, capsys):
    assert parse(["--train-steps", "3", "--repeats", "1"]).train_steps == 3
    for flag, value in (("--train-steps", "0"), ("--repeats", "-2"), ("--repeats", "two")):
        with pytest.raises(SystemExit):
            parse([flag, value])
        assert f"expected an integer >= 1, got {value if value != 'two' else repr(value)}" in capsys.readouterr().err


def test_gpt_benchmark_compiles_each_side_as_its_library_does_on_request():
    args = ["--d-model", "32", "--n-layers", "1", "--n-heads", "2", "--vocab-size", "128", "--batch-size", "2",
            "--seq-len", "16"]
    ours, hf = gpt_vs_hf.build_models(gpt_vs_hf.parse_args(args))
    compiled = gpt_vs_hf.parse_args([*args, "--compile"])
    assert getattr(gpt_vs_hf.training_copy(ours, compiled).backbone, "_unitok_compiled", False)  # as tasks.Compile
    assert isinstance(gpt_vs_hf.training_copy(hf, compiled), torch._dynamo.eval_frame.OptimizedModule)  # whole
    plain = gpt_vs_hf.training_copy(ours, gpt_vs_hf.parse_args(args))
    assert plain is not ours and not getattr(plain.backbone, "_unitok_compiled", False)  # a copy, not compiled


@pytest.mark.parametrize("flag, same_loss_fused", [([], None), (["--fused-adamw"], True)])
def test_gpt_benchmark_default_paths_step_fused_adamw_on_both_sides(monkeypatch, flag, same_loss_fused):
    made = []
    real = gpt_vs_hf.make_train_step

    def spy(model, ids, steps, amp, fused=None, loss_fn=gpt_vs_hf.same_loss):
        made.append((loss_fn, fused))
        return real(model, ids, steps, amp, fused, loss_fn=loss_fn)

    monkeypatch.setattr(gpt_vs_hf, "make_train_step", spy)
    args = gpt_vs_hf.parse_args(["--d-model", "32", "--n-layers", "1", "--n-heads", "2", "--vocab-size", "128",
                                 "--batch-size", "2", "--seq-len", "16", "--repeats", "1", "--warmup", "0", *flag])
    ours, hf = gpt_vs_hf.build_models(args)
    gpt_vs_hf.bench_train(ours, hf, args)
    # unitok and HF each: the same-loss step (fused only with --fused-adamw), then each library's
    # default path, labels= with fused AdamW (unitok's tasks' and HF Trainer's default optimiser)
    assert made == [(gpt_vs_hf.same_loss, same_loss_fused)] * 2 + [(gpt_vs_hf.default_loss, True)] * 2


def test_t5_benchmark_default_paths_step_fused_adamw_on_both_sides(monkeypatch):
    made = []
    real = t5_vs_hf.make_train_step

    def spy(model, loss_fn, steps, amp=None, fused=None):
        made.append((type(model).__module__.split(".")[0], fused))
        return real(model, loss_fn, steps, amp, fused)

    monkeypatch.setattr(t5_vs_hf, "make_train_step", spy)
    t5_vs_hf.main(["--vocab-size", "64", "--d-model", "32", "--heads", "2", "--layers", "1", "--batch-size", "2",
                   "--source-len", "8", "--target-len", "4", "--gen-batch", "1", "--new-tokens", "3",
                   "--repeats", "1", "--warmup", "0"])
    # the same-loss rows step the unfused AdamW; each library's default path (labels=), fused AdamW
    assert made == [("unitok", None), ("transformers", None), ("unitok", True), ("transformers", True)]


def test_the_deferred_checks_benchmark_compares_what_it_names():
    """Its three variants: checks deferred on a GPU (unitok as it runs), read at once, and none at all
    (bad ids and labels pass unnamed); each undoes the others' settings."""
    import unitok.checks as checks
    import unitok.losses as losses
    from unitok.embed import TokenEmbedding
    from unitok.losses import linear_cross_entropy

    setups = deferred_checks.variants()
    embed = TokenEmbedding(5, 2)
    hidden, weight = torch.randn(2, 3), torch.randn(5, 3)
    try:
        setups["none"]()
        with pytest.raises(IndexError):  # torch's own index error: unitok's range check is off
            embed(torch.tensor([[7]]))
        bad = torch.tensor([9, 1])
        assert losses.check_class_labels(bad, (2,), 5) is bad  # passed through unchecked
        setups["at once"]()
        assert checks._DEFERRING_DEVICES == frozenset()
        with pytest.raises(ValueError, match=r"token ids \[7\] are outside"):
            embed(torch.tensor([[7]]))
        with pytest.raises(ValueError, match=r"labels \[9\] are outside"):
            linear_cross_entropy(hidden, weight, torch.tensor([9, 1]))
    finally:
        setups["deferred"]()
    assert checks._DEFERRING_DEVICES == frozenset({"cuda"})
    with pytest.raises(ValueError, match=r"labels \[9\] are outside"):
        linear_cross_entropy(hidden, weight, torch.tensor([9, 1]))


def test_claim_runs_made_in_a_scratch_folder_are_removed_with_it():
    import tempfile

    with claim.scratch_runs() as scratch:
        first, second = claim.run_folder(), claim.run_folder()
        (first / "last.ckpt").write_bytes(b"weights")
        assert first.parent == scratch and second.parent == scratch and first != second
    assert not scratch.exists() and not first.exists()
    outside = claim.run_folder()  # no scratch folder open: the system's temp folder, left to the caller
    try:
        assert outside.parent == Path(tempfile.gettempdir())
    finally:
        outside.rmdir()


SIDE_BY_SIDE = ("gpt_vs_hf", "bert_vs_hf", "t5_vs_hf", "vision_vs_timm", "clip_vs_open_clip",
                "conformer_vs_torchaudio", "dt_vs_hf", "bf16_vs_fp32")


def refused(parse, argv, capsys) -> str:
    """argparse's error for ``argv`` (exit status 2, before any work), as printed."""
    with pytest.raises(SystemExit) as exit_:
        parse(argv)
    assert exit_.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("name", SIDE_BY_SIDE)
def test_side_by_side_benchmarks_refuse_bad_threads_warmup_and_device_while_parsing(name, capsys):
    import importlib

    parse = importlib.import_module(name).parse_args
    args = parse(["--threads", "1", "--warmup", "0", "--device", "cuda:1"])  # parsed, nothing prepared yet
    assert (args.threads, args.warmup, args.device) == (1, 0, "cuda:1")
    assert "argument --threads: expected an integer >= 1, got 0" in refused(parse, ["--threads", "0"], capsys)
    assert "argument --threads: expected an integer >= 1, got -3" in refused(parse, ["--threads", "-3"], capsys)
    assert "argument --warmup: expected an integer >= 0, got -1" in refused(parse, ["--warmup", "-1"], capsys)
    assert "argument --device: expected a torch device such as cpu or cuda, got 'foo'" in refused(
        parse, ["--device", "foo"], capsys)


@pytest.mark.parametrize("name, argv", [
    ("tokenizer_vs_hf", ["--threads", "0"]), ("tokenizer_vs_hf", ["--batch", "0"]),
    ("tokenizer_vs_hf", ["--lines", "0"]), ("gpt_vs_hf", ["--batch-size", "0"]), ("gpt_vs_hf", ["--beams", "0"]),
    ("t5_vs_hf", ["--new-tokens", "0"]), ("vision_vs_timm", ["--infer-batches", "0"]),
    ("clip_vs_open_clip", ["--zero-shot-repeats", "0"]), ("multitask", ["--threads", "0"]),
    ("multitask", ["--max-steps", "0"]),
])
def test_benchmark_counts_below_one_are_refused_while_parsing(name, argv, capsys):
    import importlib

    parse = importlib.import_module(name).parse_args
    assert f"argument {argv[0]}: expected an integer >= 1, got 0" in refused(parse, argv, capsys)


@pytest.mark.parametrize("argv, message", [
    (["--threads", "0"], "argument --threads: expected an integer >= 1, got 0"),
    (["--threads", "-3"], "argument --threads: expected an integer >= 1, got -3"),
    (["--device", "foo"], "argument --device: expected a torch device such as cpu or cuda, got 'foo'"),
])
def test_the_summary_refuses_bad_threads_and_device_before_running_a_benchmark(argv, message, monkeypatch, capsys):
    monkeypatch.setattr(summary.importlib, "import_module", lambda name: pytest.fail(f"{name} was run"))
    assert message in refused(summary.main, argv, capsys)


def test_the_cuda_checks_refuse_an_unknown_device_while_parsing(capsys):
    import cuda_checks

    message = "argument --device: expected a torch device such as cpu or cuda, got 'gpu'"
    assert message in refused(cuda_checks.main, ["--device", "gpu"], capsys)


def test_claims_accept_a_markdown_out_in_a_folder_still_to_make_and_seeds_in_numpys_range(tmp_path):
    import claims

    args = claims.parse_args(["--out", str(tmp_path / "new" / "claims.md"), "--seeds", "0", str(2**32 - 1),
                              "--claims", "a", "d"])
    assert args.seeds == [0, 2**32 - 1] and args.keys == ["a-mlm", "a-lm", "d"]


def test_claims_refuse_an_out_they_could_not_write_at_the_end(tmp_path, capsys):
    import claims

    (tmp_path / "file").write_text("")
    (tmp_path / "folder.md").mkdir()
    (tmp_path / "table.json").mkdir()
    for out, message in ((tmp_path / "x.json", "--out must name a .md file"),  # the JSON would overwrite it
                         (tmp_path, "--out must name a .md file"),
                         (tmp_path / "folder.md", "is a folder"),
                         (tmp_path / "table.md", f"{str(tmp_path / 'table.json')!r} is a folder"),
                         (tmp_path / "file" / "claims.md", f"{str(tmp_path / 'file')!r} is a file, not a folder"),
                         (tmp_path / "file" / "deeper" / "claims.md", "is a file, not a folder")):
        assert message in refused(claims.parse_args, ["--out", str(out)], capsys)


@pytest.mark.parametrize("argv, message", [
    (["--seeds", "-1"], "argument --seeds: expected an integer from 0 to 4294967295, got -1"),
    (["--seeds", "0", "1", str(2**32)], f"argument --seeds: expected an integer from 0 to 4294967295, got {2**32}"),
    (["--seeds", "0", "0"], "--seeds repeats a seed: [0, 0]"),
    (["--claims", "zzz"], "--claims: unknown claim 'zzz'; known: a-mlm, a-lm, b"),
    (["--jobs", "0"], "argument --jobs: expected an integer >= 1, got 0"),
    (["--threads", "0"], "argument --threads: expected an integer >= 1, got 0"),
])
def test_claims_refuse_bad_seeds_claims_jobs_and_threads_while_parsing(argv, message, capsys):
    import claims

    assert message in refused(claims.parse_args, argv, capsys)


@pytest.fixture
def pretraining_claims(monkeypatch):
    """claims_pretraining with its two claims' runs replaced by stubs that record (key, seed)."""
    import dataclasses

    import claims_pretraining

    ran = []
    stubs = [dataclasses.replace(c, run=lambda seed, key=c.key: ran.append((key, seed)) or
                                 {"pretrained": 60.0, "scratch": 50.0})
             for c in claims_pretraining.CLAIMS]
    monkeypatch.setattr(claims_pretraining, "CLAIMS", stubs)
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)  # this process's threads stay as they are
    return claims_pretraining.main, ran


def test_the_pretraining_claims_alone_take_a_prefix_as_claims_py_does(pretraining_claims):
    main, ran = pretraining_claims
    main(["--claims", "a", "--seeds", "0"])
    assert ran == [("a-mlm", 0), ("a-lm", 0)]


@pytest.mark.parametrize("argv, message", [
    (["--claims", "zzz"], "--claims: unknown claim 'zzz'; known: a-mlm, a-lm"),
    (["--threads", "0"], "argument --threads: expected an integer >= 1, got 0"),
    (["--seeds", "0", "0"], "--seeds repeats a seed: [0, 0]"),
    (["--seeds", "-1"], "argument --seeds: expected an integer from 0 to 4294967295, got -1"),
])
def test_the_pretraining_claims_alone_refuse_what_claims_py_refuses_before_running(argv, message, pretraining_claims,
                                                                                     capsys):
    main, ran = pretraining_claims
    assert message in refused(main, argv, capsys)
    assert ran == []


@pytest.mark.parametrize("name, pointer", [
    ("claim", "python benchmarks/claims.py --list"), ("claims_control", "python benchmarks/claims.py --claims f"),
    ("claims_decoding", "python benchmarks/claims.py --claims c"),
    ("claims_distillation", "python benchmarks/claims.py --claims b"),
    ("claims_speech", "python benchmarks/claims.py --claims e"),
    ("claims_zero_shot", "python benchmarks/claims.py --claims d"),
])
def test_a_claim_module_run_as_a_script_points_at_claims_py_and_exits_2(name, pointer, monkeypatch, capsys):
    import runpy

    path = Path(claim.__file__).with_name(f"{name}.py")
    monkeypatch.setattr(sys, "argv", [str(path), "--help"])
    with pytest.raises(SystemExit) as exit_:
        runpy.run_path(str(path), run_name="__main__")
    assert exit_.value.code == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err == f"{name}.py is a part of claims.py, not a script: run `{pointer}`\n"


def test_a_claim_holds_by_its_rule_and_a_sign_only_tie_is_named():
    """A gap target holds only when the mean gap reaches it and each arm's std is below the gap;
    a sign-only claim (beam ≥ greedy) holds on a mean gap ≥ 0, and says when that is a tie."""
    gapped = claim.Claim(key="x", title="t", metric="m", better="a", baseline="b", min_gap=2.0, run=lambda s: {})
    assert claim.verdict(gapped, [{"a": 10.0, "b": 7.0}, {"a": 10.5, "b": 7.5}, {"a": 9.5, "b": 6.5}])[0]
    noisy = [{"a": 14.0, "b": 7.0}, {"a": 6.0, "b": 7.5}, {"a": 10.0, "b": 6.5}]  # gap +3, an arm's std 4
    assert not claim.verdict(gapped, noisy)[0]
    sign = claim.Claim(key="y", title="t", metric="m", better="a", baseline="b", run=lambda s: {})
    ok, why = claim.verdict(sign, [{"a": 31.0, "b": 30.0}, {"a": 30.0, "b": 30.5}, {"a": 32.0, "b": 32.0}])
    assert ok and "a tie" in why and "need ≥ 0" in why
    ok, why = claim.verdict(sign, [{"a": -30.0, "b": -46.0}, {"a": -31.0, "b": -45.0}, {"a": -32.0, "b": -48.0}])
    assert ok and "tie" not in why
    assert not claim.verdict(sign, [{"a": 1.0, "b": 2.0}, {"a": 1.0, "b": 2.0}, {"a": 1.0, "b": 2.0}])[0]
