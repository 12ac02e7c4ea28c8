"""A run that starts from a saved folder trains it: loading returns eval mode (ready to predict),
and Lightning keeps a module's mode, so every task that loads one switches dropout back on."""

from __future__ import annotations

import pytest

from tasks import CTCSpeechTask, DecisionTransformerTask, ImageClassificationTask, Seq2SeqTask
from tasks.bert_finetune import load_body
from unitok.models import (
    BERT,
    T5,
    BERTConfig,
    ConformerConfig,
    ConformerCTC,
    DecisionTransformer,
    DecisionTransformerConfig,
    T5Config,
    ViT,
    ViTConfig,
)


def trains(module) -> bool:
    return all(m.training for m in module.modules())


@pytest.mark.parametrize("family", ["vit", "conformer", "dt", "t5", "bert"])
def test_a_task_built_from_a_saved_folder_starts_in_training_mode(tmp_path, family):
    if family == "vit":
        ViT(ViTConfig.from_name("vit-digits")).save_pretrained(tmp_path)
        model = ImageClassificationTask(pretrained=str(tmp_path)).model
    elif family == "conformer":
        ConformerCTC(ConformerConfig.from_name("conformer-digits", vocabulary=tuple("ab "))).save_pretrained(tmp_path)
        model = CTCSpeechTask(pretrained=str(tmp_path)).model
    elif family == "dt":
        DecisionTransformer(DecisionTransformerConfig.from_name("dt-cartpole")).save_pretrained(tmp_path)
        model = DecisionTransformerTask(pretrained=str(tmp_path)).model
    elif family == "t5":
        T5(T5Config.from_name("t5-tiny", vocab_size=97)).save_pretrained(tmp_path)
        model = Seq2SeqTask(pretrained=str(tmp_path)).model
    else:
        BERT(BERTConfig.from_name("bert-nano", vocab_size=97)).save_pretrained(tmp_path)
        model = load_body(tmp_path)
    assert model is not None and trains(model)
