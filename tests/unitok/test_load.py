"""`unitok.load` opens any family's folder, in eval mode, with what it needs to read raw input;
broken folders are refused with the file (and field, and tensor) named."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

import unitok
from tasks.callbacks import ExportPretrained
from tasks.data.image import DigitsDataModule
from tokenizers_mm import (
    BPETokenizer,
    CharacterVocabulary,
    ImagePreprocessConfig,
    Processor,
    SpectrogramConfig,
    Tokens,
    TrajectoryTokenizer,
    WordPieceTokenizer,
)
from unitok.models import (
    BERT,
    CLIP,
    ELECTRA,
    GPT,
    T5,
    BERTConfig,
    ClassifierHeadConfig,
    CLIPConfig,
    ConformerConfig,
    ConformerCTC,
    DecisionTransformer,
    DecisionTransformerConfig,
    DeiT,
    ELECTRAConfig,
    GPTConfig,
    ImageModality,
    MixerConfig,
    MLPMixer,
    MultimodalConfig,
    MultimodalTransformer,
    T5Config,
    ViT,
    ViTConfig,
)

CORPUS = ["def parse(text):\n    return text.split()\n", "class Parser:\n    pass\n", "for x in range(3): print(x)\n"] * 20


def families() -> dict[str, tuple[torch.nn.Module, dict]]:
    """A small random model of every family and an input batch for it."""
    torch.manual_seed(0)
    ids = torch.randint(3, 90, (2, 7))
    pixels = torch.randn(2, 1, 32, 32)
    K = 4
    return {
        "GPT": (GPT(GPTConfig.from_name("gpt-nano", vocab_size=97, context_length=16)), {"input_ids": ids}),
        "BERT": (BERT(BERTConfig.from_name("bert-nano", vocab_size=97, context_length=16)), {"input_ids": ids}),
        "T5": (T5(T5Config.from_name("t5-tiny", vocab_size=97)), {"input_ids": ids, "decoder_input_ids": ids}),
        "ELECTRA": (ELECTRA(ELECTRAConfig.from_name("electra-nano", vocab_size=97, context_length=16)),
                    {"input_ids": ids, "labels": torch.where(ids % 3 == 0, ids, -100),
                     "generator": torch.Generator().manual_seed(0)}),
        "ViT": (ViT(ViTConfig.from_name("vit-digits")), {"pixel_values": pixels}),
        "DeiT": (DeiT(ViTConfig.from_name("deit-digits")), {"pixel_values": pixels}),
        "MLPMixer": (MLPMixer(MixerConfig.from_name("mixer-digits")), {"pixel_values": pixels}),
        "ConformerCTC": (ConformerCTC(ConformerConfig.from_name("conformer-digits", vocabulary=tuple("abc "))),
                         {"features": torch.randn(2, 40, 80), "lengths": torch.tensor([40, 31])}),
        "CLIP": (CLIP(CLIPConfig.from_name("clip-digits")),
                 {"pixel_values": pixels, "text": ["a handwritten seven", "the digit 2"]}),
        "DecisionTransformer": (DecisionTransformer(DecisionTransformerConfig.from_name("dt-cartpole")),
                                {"states": torch.randn(2, K, 4), "actions": torch.randint(0, 2, (2, K)),
                                 "returns_to_go": torch.randn(2, K, 1), "timesteps": torch.arange(K).expand(2, K)}),
        "MultimodalTransformer": (MultimodalTransformer(MultimodalConfig.from_name(
            "mm-tiny", modalities={"image": ImageModality()},
            heads={"digit": ClassifierHeadConfig(segment="image", num_classes=10)})),
            {"inputs": {"image": Tokens(features=torch.randn(2, 16, 64), attention_mask=torch.ones(2, 16, dtype=torch.long),
                                       modality="image", grid=(4, 4))}}),
    }


def first_tensor(out) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out
    for name in ("logits", "mlm_logits", "action_preds", "logits_per_image", "discriminator_logits"):
        value = getattr(out, name, None)
        if isinstance(value, torch.Tensor):
            return value
    if hasattr(out, "heads"):
        return next(iter(out.heads.values()))
    return out.last_hidden_state


@pytest.mark.parametrize("family", list(families()))
def test_any_family_loads_by_its_config_in_eval_mode_and_gives_the_saved_outputs(tmp_path, family):
    model, inputs = families()[family]
    model.eval()

    def run(m: torch.nn.Module) -> torch.Tensor:
        if "generator" in inputs:  # ELECTRA samples its replacements: the same seed each call
            inputs["generator"].manual_seed(0)
        with torch.no_grad():
            return first_tensor(m(**inputs))

    expected = run(model)
    model.train()  # saved while training: the loaded copy must still come back ready to predict
    model.save_pretrained(tmp_path)
    for loaded in (unitok.load(tmp_path), unitok.AutoModel.from_pretrained(tmp_path), type(model).from_pretrained(tmp_path)):
        assert type(loaded).__name__ == family
        assert not loaded.training and not any(m.training for m in loaded.modules())
        first, second = run(loaded), run(loaded)
        torch.testing.assert_close(first, second, rtol=0, atol=0)  # no dropout left on
        torch.testing.assert_close(first, expected, rtol=0, atol=1e-6)


def test_a_folder_without_a_known_family_is_a_clear_error(tmp_path):
    GPT(GPTConfig.from_name("gpt-nano", vocab_size=97)).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "family": "GTP"}))
    with pytest.raises(ValueError, match=r"unknown model family 'GTP' \(did you mean 'GPT'\?\)"):
        unitok.load(tmp_path)
    del config["family"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="names no model family"):
        unitok.load(tmp_path)
    with pytest.raises(FileNotFoundError, match="no model folder"):
        unitok.load(tmp_path / "missing")
    with pytest.raises(TypeError, match="AutoModel.from_pretrained"):
        unitok.AutoModel()


def test_only_concrete_families_are_known_an_abstract_base_is_not_a_family(tmp_path):
    ViT(ViTConfig.from_name("vit-digits")).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "family": "ImageModel"}))
    with pytest.raises(ValueError, match=r"unknown model family 'ImageModel'; unitok knows BERT, .*ViT") as error:
        unitok.load(tmp_path)
    assert "ImageModel," not in str(error.value)


def test_a_truncated_or_corrupt_weights_file_is_named(tmp_path):
    GPT(GPTConfig.from_name("gpt-nano", vocab_size=97)).save_pretrained(tmp_path)
    weights = tmp_path / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"cannot read .*model\.safetensors.*truncated or corrupt"):
        unitok.load(tmp_path)
    weights.write_bytes(b"\x00" * 64)
    with pytest.raises(ValueError, match=r"model\.safetensors"):
        unitok.load(tmp_path)


def test_a_device_that_cannot_be_used_is_named_not_blamed_on_the_file(tmp_path):
    GPT(GPTConfig.from_name("gpt-nano", vocab_size=97)).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="map_location='gpu' is not a device this machine can load onto") as error:
        unitok.load(tmp_path, map_location="gpu")
    assert "corrupt" not in str(error.value)
    assert unitok.load(tmp_path, map_location=torch.device("cpu")).lm_head.weight.device.type == "cpu"


def test_a_hand_edited_processor_file_is_a_clear_error(tmp_path):
    vit = ViT(ViTConfig.from_name("vit-digits"))
    vit.processor = Processor(labels=tuple("0123456789"))
    vit.save_pretrained(tmp_path)
    path = tmp_path / "processor_config.json"
    payload = json.loads(path.read_text())
    for edited, message in [
        ({**payload, "text": "bpe"}, r"the 'text' part must be a JSON object, got 'bpe'"),
        ({**payload, "id2label": {"00": "zero", **{str(i): str(i) for i in range(1, 10)}}},
         r"id2label's keys must be class ids \"0\", \"1\", …, got \['00'\]"),
        ({**payload, "image": {**payload["image"], "patch": 8}}, r"cannot read its parts \(TypeError: .*'patch'"),
        (["image"], "must hold a JSON object of processor parts, got list"),
    ]:
        path.write_text(json.dumps(edited))
        with pytest.raises(ValueError, match=message):
            unitok.load(tmp_path)


def test_a_config_value_of_the_wrong_type_names_the_field_and_the_type(tmp_path):
    GPT(GPTConfig.from_name("gpt-nano", vocab_size=97)).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "n_layers": "2"}))
    with pytest.raises(TypeError, match=r"config\.json: GPTConfig\.n_layers must be int, got '2' \(str\)"):
        unitok.load(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**config, "dropout": True}))
    with pytest.raises(TypeError, match=r"GPTConfig\.dropout must be float"):
        unitok.load(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"config\.json is not valid JSON"):
        unitok.load(tmp_path)


def test_nan_or_inf_weights_are_refused_with_the_tensor_named(tmp_path):
    GPT(GPTConfig.from_name("gpt-nano", vocab_size=97)).save_pretrained(tmp_path)
    state = load_file(str(tmp_path / "model.safetensors"))
    key = sorted(k for k in state if state[k].dim() == 2)[0]
    state[key][0, 0] = float("nan")
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=f"NaN or inf values in {key}"):
        unitok.load(tmp_path)


def test_a_weight_of_another_kind_of_dtype_is_refused_with_the_tensor_named(tmp_path):
    # integers where the model has a float weight are another file's tensor, not a precision
    GPT(GPTConfig.from_name("gpt-nano", vocab_size=97)).save_pretrained(tmp_path)
    state = load_file(str(tmp_path / "model.safetensors"))
    key = sorted(k for k in state if state[k].dim() == 2)[0]
    state[key] = state[key].to(torch.int64)
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=f"keys of another kind of dtype: {key} \\(checkpoint torch.int64, model torch.float32\\)"):
        unitok.load(tmp_path)
    state[key] = state[key].to(torch.bfloat16)  # another precision of the same kind is a cast
    save_file(state, str(tmp_path / "model.safetensors"))
    assert unitok.load(tmp_path).state_dict()[key].dtype == torch.float32


# --------------------------------------------------------------------------- processors


def test_a_saved_folder_is_self_contained_text_tokenizer_and_labels_come_back(tmp_path):
    tok = BPETokenizer.train(iterator=CORPUS, vocab_size=300)
    model = GPT(GPTConfig.from_name("gpt-nano", vocab_size=tok.vocab_size, context_length=32))
    assert model.processor is None  # a GPT's tokenizer comes from its data
    model.processor = Processor(text=tok)
    model.save_pretrained(tmp_path)
    loaded = unitok.load(tmp_path)
    batch = loaded.processor("def parse(text):")
    assert isinstance(batch, Tokens) and batch.ids.tolist() == [tok.encode("def parse(text):").ids.tolist()]

    words = WordPieceTokenizer.train(iterator=CORPUS, vocab_size=120)
    bert = BERT(BERTConfig.from_name("bert-nano", vocab_size=words.vocab_size, heads=("pooler", "classifier"),
                                     num_labels=2))
    bert.processor = Processor(text=words, labels=("negative", "positive"))
    bert.save_pretrained(tmp_path / "bert")
    loaded = unitok.load(tmp_path / "bert")
    assert isinstance(loaded.processor.text, WordPieceTokenizer)
    assert loaded.processor.id2label == {0: "negative", 1: "positive"}
    assert loaded.processor.label2id == {"negative": 0, "positive": 1}


def test_families_whose_config_knows_their_input_need_nothing_else(tmp_path):
    vit = ViT(ViTConfig.from_name("vit-digits"))
    assert vit.processor.image == vit.config.preprocess_config()
    patches = vit.processor(torch.rand(2, 1, 32, 32))
    assert patches.features.shape == (2, 16, 64) and patches.grid == (4, 4)

    conformer = ConformerCTC(ConformerConfig.from_name("conformer-digits", vocabulary=tuple("abc ")))
    assert conformer.processor.characters.decode([1, 2, 4]) == "ab "
    assert conformer.processor.audio == SpectrogramConfig.from_dict(conformer.config.spectrogram)
    frames = conformer.processor(np.zeros(16000, dtype=np.float32) + 0.01 * np.random.default_rng(0).standard_normal(16000).astype(np.float32),
                                 sample_rate=16000)
    assert frames.features.shape[-1] == 80

    dt = DecisionTransformer(DecisionTransformerConfig.from_name("dt-cartpole"))
    assert dt.processor.trajectory == dt.config.tokenizer()

    clip = CLIP(CLIPConfig.from_name("clip-digits-audio"))
    assert clip.processor.modalities == ["text", "image", "audio"]
    assert clip.processor("a handwritten seven").modality == "text"
    assert clip.processor(torch.rand(1, 32, 32)).modality == "image"
    assert clip.processor(np.zeros(4000, dtype=np.float32), sample_rate=16000).modality == "audio"
    # a path to a file that is not there is a mistyped path, not a caption
    with pytest.raises(FileNotFoundError, match=r"cat.pgn.png looks like an image file but does not exist; pass "
                                                r"modality='text'"):
        clip.processor("cat.pgn.png")
    with pytest.raises(FileNotFoundError, match="looks like an audio file"):
        clip.processor(["missing/clip.wav"])
    assert clip.processor("a photo of cat.png").modality == "text"  # words around a file name: a caption
    assert clip.processor("cat.png", modality="text").modality == "text"
    clip.save_pretrained(tmp_path)
    assert unitok.load(tmp_path).processor.text.context_length == clip.config.text.context_length


def test_processor_bad_input_is_named():
    vit = ViT(ViTConfig.from_name("vit-digits"))
    with pytest.raises(ValueError, match="no text part"):
        vit.processor.encode_text("hello")
    conformer = ConformerCTC(ConformerConfig.from_name("conformer-digits", vocabulary=tuple("ab")))
    with pytest.raises(ValueError, match="needs its sample_rate"):
        conformer.processor(np.zeros(1600, dtype=np.float32))
    with pytest.raises(ValueError, match="non-empty list of class names"):
        Processor(labels=())
    with pytest.raises(TypeError, match="tokenizers_mm.Processor"):
        vit.processor = {"image": None}
    with pytest.raises(ValueError, match="empty"):
        Processor()("anything")


def test_processor_files_round_trip_every_part(tmp_path):
    tok = TrajectoryTokenizer(state_dim=2, act_dim=1, state_mean=[0.5, -1.0], state_std=[2.0, 3.0], return_scale=10.0,
                              action_low=[-2.0], action_high=[2.0])
    processor = Processor(image=ImagePreprocessConfig(patch_size=4, channels=1, mean=(0.1,), std=(0.3,)),
                          audio=SpectrogramConfig(n_mels=40), characters=CharacterVocabulary.from_list(list("xyz")),
                          trajectory=tok, labels=("a", "b", "c"))
    processor.save(tmp_path)
    back = Processor.load(tmp_path)
    assert back == processor
    assert Processor.load(tmp_path / "nowhere") is None
    payload = json.loads((tmp_path / "processor_config.json").read_text())
    (tmp_path / "processor_config.json").write_text(json.dumps({**payload, "video": {}}))
    with pytest.raises(ValueError, match=r"unknown processor part\(s\) \['video'\]"):
        Processor.load(tmp_path)


def test_the_training_export_saves_the_data_s_class_names_with_the_model(tmp_path):
    data = DigitsDataModule()
    vit = ViT(ViTConfig.from_name("vit-digits"))
    trainer = SimpleNamespace(datamodule=data, callbacks=[], loggers=[], default_root_dir=str(tmp_path),
                              global_step=0)
    export = ExportPretrained(dirpath=str(tmp_path / "pretrained"))
    export.on_train_start(trainer, SimpleNamespace(model=vit))
    trainer.global_step = 1  # a fit that trained a step
    export.on_fit_end(trainer, SimpleNamespace(model=vit))
    loaded = unitok.load(tmp_path / "pretrained")
    assert loaded.processor.labels == tuple(str(d) for d in range(10))
    assert loaded.processor.image == vit.config.preprocess_config()


def test_converted_models_keep_the_reference_dropout_but_come_back_in_eval_mode():
    import transformers

    from tests.unitok.convert.test_decision_transformer_equivalence import random_inputs
    from unitok.convert import from_transformers

    torch.manual_seed(0)
    hf = transformers.DecisionTransformerModel(transformers.DecisionTransformerConfig(
        state_dim=5, act_dim=3, hidden_size=32, n_layer=2, n_head=4, max_ep_len=64, resid_pdrop=0.1, embd_pdrop=0.1,
        attn_pdrop=0.1)).eval()
    dt = from_transformers(hf)
    assert dt.config.dropout == 0.1 and not dt.training
    inputs = random_inputs(hf, pad=(0, 0, 0))
    with torch.no_grad():
        ours, ref = dt(**inputs).action_preds, hf(**inputs).action_preds
    torch.testing.assert_close(ours, ref, rtol=0, atol=1e-5)  # no dropout on, so the same answer

    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50,
                                                                n_positions=16, resid_pdrop=0.2, embd_pdrop=0.2,
                                                                attn_pdrop=0.2))
    gpt = from_transformers(gpt2)
    assert gpt.config.dropout == 0.2 and not gpt.training


def test_a_saved_tokenizer_setting_survives_while_config_parts_come_from_the_config(tmp_path):
    from tokenizers_mm import CLIPTokenizer
    from unitok.models import CLIP, CLIPConfig

    clip = CLIP(CLIPConfig.from_name("clip-digits"))
    clip.processor = Processor(text=CLIPTokenizer(clip.config.text.context_length, truncation="warn"))
    clip.save_pretrained(tmp_path)
    loaded = unitok.load(tmp_path)
    assert loaded.processor.text.truncation == "warn"  # the text part is the processor's
    assert loaded.processor.image == loaded.visual.config.preprocess_config()  # the image part the config's



@pytest.mark.parametrize("family", ["ViT", "DeiT", "MLPMixer"])
def test_a_new_classifier_drops_the_old_class_names_and_saves_a_loadable_folder(tmp_path, family):
    model = families()[family][0]
    model.processor = Processor(labels=tuple("0123456789"))
    model.reset_classifier(10)  # as many classes: the names stay
    assert model.processor.labels == tuple("0123456789")
    model.reset_classifier(3)  # another task's head: ten digit names would misname its three classes
    assert model.processor.labels is None and model.processor.image == model.config.preprocess_config()
    model.save_pretrained(tmp_path)
    loaded = unitok.load(tmp_path)
    assert loaded.class_count() == 3 and loaded.processor.labels is None
    loaded.processor = Processor(labels=("cat", "dog", "bird"))  # the new task's names
    loaded.reset_classifier(0)  # a feature extractor: no classes to name
    assert loaded.processor.labels is None


def test_saving_a_processor_that_contradicts_the_model_writes_nothing(tmp_path):
    vit = ViT(ViTConfig.from_name("vit-digits"))
    vit.processor = Processor(labels=tuple("0123456789"))
    vit.config = vit.config.replace(num_classes=3)  # changed by hand, past reset_classifier
    with pytest.raises(ValueError, match="10 class names for a model of 3 classes"):
        vit.save_pretrained(tmp_path / "vit")
    assert not (tmp_path / "vit").exists()  # no folder that unitok.load would refuse


def test_saving_without_a_processor_removes_an_earlier_saves(tmp_path):
    labelled = GPT(GPTConfig.from_name("gpt-nano", vocab_size=97))
    labelled.processor = Processor(labels=("neg", "pos"))
    labelled.save_pretrained(tmp_path)
    GPT(GPTConfig.from_name("gpt-nano", vocab_size=97)).save_pretrained(tmp_path)  # the same folder, no processor
    assert not (tmp_path / "processor_config.json").exists()
    assert unitok.load(tmp_path).processor is None  # not the other model's class names


def test_a_folder_saved_before_the_processor_carried_crop_pct_reads_the_configs(tmp_path):
    vit = ViT(ViTConfig.from_name("vit-digits", crop_pct=0.9))
    vit.save_pretrained(tmp_path)
    path = tmp_path / "processor_config.json"
    payload = json.loads(path.read_text())
    assert payload["image"]["crop_pct"] == 0.9
    path.write_text(json.dumps({"image": {**payload["image"], "crop_pct": None}}))  # as older saves wrote it
    assert unitok.load(tmp_path).processor.image == vit.config.preprocess_config()


def test_a_config_class_reads_its_own_models_config_json_and_refuses_another_familys(tmp_path):
    config = ViTConfig.from_name("vit-digits", n_layers=1)
    ViT(config).save_pretrained(tmp_path / "vit")
    assert ViTConfig.load(tmp_path / "vit" / "config.json") == config
    DeiT(ViTConfig.from_name("deit-digits")).save_pretrained(tmp_path / "deit")
    assert ViTConfig.load(tmp_path / "deit" / "config.json") == ViTConfig.from_name("deit-digits")  # DeiT reads one
    with pytest.raises(ValueError, match=r"config of a 'ViT' model \(it reads a ViTConfig\), not a MixerConfig"):
        MixerConfig.load(tmp_path / "vit" / "config.json")
    payload = json.loads((tmp_path / "vit" / "config.json").read_text())
    (tmp_path / "vit" / "config.json").write_text(json.dumps({**payload, "family": "Transformer9000"}))
    with pytest.raises(ValueError, match=r"'Transformer9000' model \(it reads no config of this class\)"):
        ViTConfig.load(tmp_path / "vit" / "config.json")
