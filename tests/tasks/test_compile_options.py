"""A compile backend is checked where it is given: `GenerationConfig(compile=...)`,
`tasks.Compile(...)` and ``unitok sample --compile`` refuse a name `torch.compile` does not know
(with the names it does) when they are made, not with a traceback from Dynamo at the first compiled
call, after the model, the data and the prompts were loaded."""

from __future__ import annotations

import pytest

from tasks import Compile
from tasks.sample import main as sample_main
from unitok.generate import GenerationConfig

KNOWN = r"\(.*aot_eager.*eager.*inductor.*\)"  # the error lists the names torch.compile takes


def test_generation_refuses_an_unknown_compile_backend_when_configured():
    with pytest.raises(ValueError, match=f"compile must be True/False or the name of a torch.compile backend {KNOWN}, "
                                         "got 'bogus'"):
        GenerationConfig(compile="bogus")
    for accepted in (False, True, "inductor", "eager", "aot_eager"):
        assert GenerationConfig(compile=accepted).compile == accepted


def test_the_compile_callback_refuses_bad_options_when_made():
    with pytest.raises(ValueError, match=f"tasks.Compile backend must be a callable or the name of a torch.compile "
                                         f"backend {KNOWN}, got 'bogus'"):
        Compile(backend="bogus")
    with pytest.raises(ValueError, match=r"tasks.Compile mode must be None or one of inductor's modes "
                                         r"\(default, .*max-autotune.*\), got 'fastest'"):
        Compile(mode="fastest")
    with pytest.raises(TypeError, match="tasks.Compile dynamic must be True, False or None, got 'yes'"):
        Compile(dynamic="yes")
    # what torch.compile takes: other backends ignore the mode, a backend may be a callable
    assert Compile(backend="aot_eager", mode="max-autotune").options["backend"] == "aot_eager"
    assert Compile(mode="reduce-overhead", dynamic=False).options == {"backend": "inductor", "mode": "reduce-overhead",
                                                                      "dynamic": False}
    assert Compile(backend=lambda graph, inputs: graph).options["mode"] is None  # type: ignore[arg-type]


@pytest.mark.parametrize("value", ["bogus", "True"])
def test_sample_refuses_an_unknown_compile_backend_as_a_usage_error(value, tmp_path, capsys):
    # refused while parsing: before the model folder (here an empty one) is read
    with pytest.raises(SystemExit) as exit_:
        sample_main(["--model", str(tmp_path), "--prompt", "def", "--compile", value])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "argument --compile: must be the name of a torch.compile backend (" in err and f"got '{value}'" in err
