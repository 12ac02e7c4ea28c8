"""Fine-tuning a Decision Transformer from a ``pretrained:`` folder: dropout is a training choice
(as in BERT and GPT fine-tuning), so another value than the folder's is used, on the folder's
weights; the architecture stays the folder's (another width or head count is refused by name),
and ``preset`` is the shape of a model trained from scratch, not read with ``pretrained``."""

from __future__ import annotations

import pytest
import torch

from tasks import DecisionTransformerTask
from unitok.models import DecisionTransformer, DecisionTransformerConfig

torch.set_num_threads(1)


@pytest.fixture
def folder(tmp_path):
    config = DecisionTransformerConfig.from_name("dt-tiny", state_dim=3, act_dim=1, context_length=5)
    assert config.dropout == 0.0
    return DecisionTransformer(config).save_pretrained(tmp_path / "pretrained")


def test_a_pretrained_model_fine_tunes_with_the_dropout_given(folder):
    task = DecisionTransformerTask(pretrained=str(folder), dropout=0.2)
    model, saved = task.model, DecisionTransformer.from_pretrained(folder)
    assert model.training and model.config.dropout == 0.2 and model.drop.p == 0.2
    assert model.config == saved.config.replace(dropout=0.2)  # nothing else changed
    for name, value in saved.state_dict().items():  # the folder's weights
        torch.testing.assert_close(model.state_dict()[name], value, rtol=0, atol=0)
    states, actions = torch.randn(1, 5, 3), torch.randn(1, 5, 1)
    returns, steps = torch.randn(1, 5, 1), torch.arange(5)[None]
    torch.manual_seed(0)
    first = model(states, actions, returns, steps).action_preds
    second = model(states, actions, returns, steps).action_preds
    assert not torch.equal(first, second)  # dropout acts while training
    model.eval()
    torch.testing.assert_close(model(states, actions, returns, steps).action_preds,
                               saved(states, actions, returns, steps).action_preds)


def test_no_dropout_given_keeps_the_folders(folder):
    assert DecisionTransformerTask(pretrained=str(folder)).model.config.dropout == 0.0


def test_architecture_options_are_still_refused_by_name_and_dropout_is_not_among_them(folder):
    with pytest.raises(ValueError, match=r"keeps its own architecture; given d_model=64 \(the model's: 32\): ") as error:
        DecisionTransformerTask(pretrained=str(folder), d_model=64, dropout=0.3)
    assert "dropout" not in str(error.value)


def test_preset_is_the_from_scratch_shape_and_not_read_with_a_pretrained_folder(folder):
    task = DecisionTransformerTask(preset="dt-cartpole", pretrained=str(folder))  # dt-cartpole: width 64, 2 layers
    assert (task.model.config.d_model, task.model.config.n_layers) == (32, 1)  # the folder's
    assert "not read with ``pretrained``" in DecisionTransformerTask.__doc__
    with pytest.raises(ValueError, match="dt-nope"):  # a misspelt preset is still an error
        DecisionTransformerTask(preset="dt-nope", pretrained=str(folder))
