"""`unitok.pipeline`: Hugging Face's task names and answer shapes over unitok folders; each
answer equals what the model computes directly, and a batch answers as its items one by one."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import unitok
from tokenizers_mm import BPETokenizer, Processor, WordPieceTokenizer
from unitok.ctc import ctc_greedy_decode
from unitok.models import (
    BERT,
    CLIP,
    GPT,
    T5,
    BERTConfig,
    CLIPConfig,
    ConformerConfig,
    ConformerCTC,
    DecisionTransformer,
    DecisionTransformerConfig,
    T5Config,
    ViT,
    ViTConfig,
)
from unitok.pipelines import PIPELINES, pipeline

CORPUS = ["def parse(text):\n    return text.split()\n", "class Parser:\n    pass\n",
          "for item in range(3): print(item)\n", "the parser reads the text and returns the words\n"] * 20
DIGITS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


@pytest.fixture(scope="module")
def bpe() -> BPETokenizer:
    return BPETokenizer.train(iterator=CORPUS, vocab_size=300)


@pytest.fixture(scope="module")
def wordpiece() -> WordPieceTokenizer:
    return WordPieceTokenizer.train(iterator=CORPUS, vocab_size=150)


def saved(model: torch.nn.Module, folder, processor: Processor | None = None):
    if processor is not None:
        model.processor = processor
    model.save_pretrained(folder)
    return folder


def test_every_task_is_known_and_a_misspelt_one_is_named():
    assert set(PIPELINES) == {"text-generation", "fill-mask", "text-classification", "token-classification",
                              "text2text-generation", "image-classification", "zero-shot-image-classification",
                              "automatic-speech-recognition", "zero-shot-audio-classification", "decision"}
    with pytest.raises(ValueError, match=r"'image-clasification' \(did you mean 'image-classification'\?\)"):
        pipeline("image-clasification", model=ViT(ViTConfig.from_name("vit-digits")))


def test_a_model_of_the_wrong_family_or_without_its_head_is_refused(wordpiece):
    with pytest.raises(ValueError, match="takes a GPT model, got a ViT"):
        pipeline("text-generation", model=ViT(ViTConfig.from_name("vit-digits")))
    bert = BERT(BERTConfig.from_name("bert-nano", vocab_size=wordpiece.vocab_size, heads=("pooler", "mlm")))
    bert.processor = Processor(text=wordpiece)
    with pytest.raises(ValueError, match="needs a BERT with a 'classifier'"):
        pipeline("text-classification", model=bert)
    gpt = GPT(GPTConfig_nano(97))
    with pytest.raises(ValueError, match="has no processor"):
        pipeline("text-generation", model=gpt)
    with pytest.raises(TypeError, match=r"unknown option\(s\) \['topk'\]"):
        pipeline("image-classification", model=ViT(ViTConfig.from_name("vit-digits")), topk=3)


def GPTConfig_nano(vocab_size: int):
    from unitok.models import GPTConfig

    return GPTConfig.from_name("gpt-nano", vocab_size=vocab_size, context_length=64)


def test_text_generation_continues_prompts_as_generate_does_batched_or_not(tmp_path, bpe):
    torch.manual_seed(0)
    gpt = GPT(GPTConfig_nano(bpe.vocab_size).replace(eos_token_id=bpe.eos_id, pad_token_id=bpe.pad_id))
    generate = pipeline("text-generation", model=saved(gpt, tmp_path, Processor(text=bpe)), max_new_tokens=6)
    prompts = ["def parse(", "class"]
    answers = generate(prompts)
    assert answers == [generate(p) for p in prompts]  # left padding changes nothing
    ids = gpt.eval().generate(bpe.batch_encode(["def parse("]), max_new_tokens=6)[0, len(bpe.encode("def parse(").ids):]
    assert answers[0] == [{"generated_text": "def parse(" + bpe.decode(ids.tolist(), skip_special_tokens=True)}]
    only_new = generate("class", return_full_text=False)[0]["generated_text"]
    assert answers[1][0]["generated_text"] == "class" + only_new
    beams = generate("class", num_beams=3)
    assert beams[0]["generated_text"].startswith("class")
    # options that would be dropped are refused: no beam search of 0, no sampled beam search
    with pytest.raises(ValueError, match="num_beams must be an integer ≥ 1 \\(1: no beam search\\), got 0"):
        generate("class", num_beams=0)
    with pytest.raises(ValueError, match="num_beams=3 asks for beam search, which do_sample=True contradicts"):
        generate("class", do_sample=True, num_beams=3)


def test_fill_mask_scores_the_masked_position(tmp_path, wordpiece):
    torch.manual_seed(0)
    bert = BERT(BERTConfig.from_name("bert-nano", vocab_size=wordpiece.vocab_size, context_length=32,
                                     heads=("pooler", "mlm")))
    fill = pipeline("fill-mask", model=saved(bert, tmp_path, Processor(text=wordpiece)), top_k=3)
    answers = fill("the parser [MASK] the text")
    assert len(answers) == 3 and answers[0]["score"] >= answers[1]["score"] >= answers[2]["score"]
    ids = [wordpiece.cls_id, *wordpiece.encode_ids("the parser"), wordpiece.mask_id, *wordpiece.encode_ids("the text"),
           wordpiece.sep_id]
    with torch.no_grad():
        probs = bert.eval()(torch.tensor([ids])).mlm_logits[0, ids.index(wordpiece.mask_id)].softmax(-1)
    assert answers[0]["token"] == int(probs.argmax())
    assert answers[0]["score"] == pytest.approx(float(probs.max()), abs=1e-6)
    assert answers[0]["token_str"].removeprefix("##") in answers[0]["sequence"]  # "##" marks a word piece
    # batched: texts of other lengths (padded), the mask at other places, each as it scores alone
    texts = ["[MASK] parser", "the parser reads [MASK] text and more", "the parser [MASK] the text"]
    for batched, alone in zip(fill(texts), [fill(texts[0]), fill(texts[1]), answers], strict=True):
        assert [a["token"] for a in batched] == [a["token"] for a in alone]
        assert [a["score"] for a in batched] == pytest.approx([a["score"] for a in alone], abs=1e-6)
    with pytest.raises(ValueError, match=r"exactly one \[MASK\]"):
        fill("no mask here")


def test_text_and_token_classification_name_their_labels(tmp_path, wordpiece):
    torch.manual_seed(0)
    cls = BERT(BERTConfig.from_name("bert-nano", vocab_size=wordpiece.vocab_size, context_length=32,
                                    heads=("pooler", "classifier"), num_labels=2))
    classify = pipeline("text-classification", model=saved(cls, tmp_path / "cls",
                                                           Processor(text=wordpiece, labels=("other", "parser"))))
    answer = classify("the parser reads the text")
    with torch.no_grad():
        probs = cls.eval()(wordpiece.batch_encode(["the parser reads the text"])).logits.softmax(-1)[0]
    assert answer == {"label": ("other", "parser")[int(probs.argmax())], "score": pytest.approx(float(probs.max()))}
    both = classify("the parser reads the text", top_k=2)
    assert [a["label"] for a in both] == sorted(("other", "parser"), key=lambda n: -float(probs[("other", "parser").index(n)]))
    pair = classify({"text": "the parser", "text_pair": "reads the text"})
    assert pair["label"] in ("other", "parser")

    tags = ("O", "name", "keyword")
    tok = BERT(BERTConfig.from_name("bert-nano", vocab_size=wordpiece.vocab_size, context_length=32,
                                    heads=("token_classifier",), num_labels=3))
    tagger = pipeline("token-classification", model=saved(tok, tmp_path / "tok", Processor(text=wordpiece, labels=tags)))
    text = "class Parser: pass"
    entities = tagger(text)
    enc = wordpiece.encode(text)
    with torch.no_grad():
        predicted = tok.eval()(enc.ids[None]).logits[0].argmax(-1)
    expected = [i for i, s in enumerate(enc.sequence_ids) if s is not None and tags[int(predicted[i])] != "O"]
    assert [e["index"] for e in entities] == expected
    for e in entities:
        assert text[e["start"]:e["end"]].lower() == e["word"].removeprefix("##").lower()
    assert len(tagger(text, ignore_labels=())) == len(enc.ids) - 2  # every word piece, no [CLS]/[SEP]


def test_a_regressor_answers_its_value_not_a_probability(tmp_path, wordpiece):
    torch.manual_seed(0)
    model = BERT(BERTConfig.from_name("bert-nano", vocab_size=wordpiece.vocab_size, context_length=32,
                                      heads=("pooler", "classifier"), num_labels=1))  # 1 = regression
    with torch.no_grad():
        model.classifier.out.bias.fill_(-2.5)  # a value no probability takes
    regress = pipeline("text-classification", model=saved(model, tmp_path, Processor(text=wordpiece)))
    texts = ["the parser reads the text", "def parse(text):"]
    with torch.no_grad():
        values = model.eval()(wordpiece.batch_encode(texts)).logits[:, 0]
    assert values.max() < -1
    # Hugging Face's answer for problem_type "regression": the one label and the raw value.
    assert regress(texts) == [{"label": "LABEL_0", "score": pytest.approx(float(v), abs=1e-5)} for v in values]
    assert regress(texts[0], top_k=3) == [{"label": "LABEL_0", "score": pytest.approx(float(values[0]), abs=1e-5)}]


def test_a_gpt_classifier_reads_text_then_eos_as_gpt_1_did(tmp_path, bpe):
    torch.manual_seed(0)
    model = GPT.for_sequence_classification(GPT(GPTConfig_nano(bpe.vocab_size)), num_labels=2)
    classify = pipeline("text-classification", model=saved(model, tmp_path / "gpt",
                                                           Processor(text=bpe, labels=("other", "parser"))))
    texts = ["the parser reads the text", "def parse(text):"]
    answers = classify(texts)
    with torch.no_grad():
        for text, answer in zip(texts, answers, strict=True):
            ids = torch.tensor([[*bpe.encode(text).ids.tolist(), bpe.eos_id]])
            probs = model.eval()(ids).class_logits.softmax(-1)[0]
            assert answer == {"label": ("other", "parser")[int(probs.argmax())],
                              "score": pytest.approx(float(probs.max()), abs=1e-5)}
    assert classify({"text": "the parser", "text_pair": "reads the text"})["label"] in ("other", "parser")
    with pytest.raises(ValueError, match="more than max_length"):  # too long for the model: refused, not cut
        classify("the parser reads the text " * 200)
    with pytest.raises(ValueError, match="needs a GPT with a classifier"):
        pipeline("text-classification", model=saved(GPT(GPTConfig_nano(bpe.vocab_size)), tmp_path / "lm",
                                                    Processor(text=bpe)))


def test_text2text_generation_equals_t5_generate(tmp_path, bpe):
    torch.manual_seed(0)
    t5 = T5(T5Config.from_name("t5-tiny", vocab_size=bpe.vocab_size, pad_token_id=bpe.pad_id, eos_token_id=bpe.eos_id,
                               decoder_start_token_id=bpe.pad_id))
    run = pipeline("text2text-generation", model=saved(t5, tmp_path, Processor(text=bpe)), max_new_tokens=5)
    answers = run(["parse: def parse(", "parse: class"])
    assert answers == [run("parse: def parse("), run("parse: class")]
    source = torch.tensor([[*bpe.encode("parse: class").ids.tolist(), bpe.eos_id]])
    out = t5.eval().generate(source, max_new_tokens=5)[0, 1:].tolist()
    out = out[: out.index(bpe.eos_id)] if bpe.eos_id in out else out
    assert answers[1] == [{"generated_text": bpe.decode([t for t in out if t != bpe.pad_id])}]
    with pytest.raises(ValueError, match="num_beams must be an integer ≥ 1"):
        run("parse: class", num_beams=0)


def test_image_classification_reads_raw_images_with_the_saved_preprocessing(tmp_path):
    torch.manual_seed(0)
    vit = ViT(ViTConfig.from_name("vit-digits"))
    with torch.no_grad():
        vit.head.bias.copy_(torch.arange(10.0) * 0.0)
        vit.head.bias[7] = 20.0  # this model calls everything a seven
    classify = pipeline("image-classification", model=saved(vit, tmp_path, Processor(labels=DIGITS)), top_k=3)
    image = (np.random.default_rng(0).random((32, 32)) * 255).astype(np.uint8)[None]
    answer = classify(torch.from_numpy(image))
    assert answer[0]["label"] == "seven" and answer[0]["score"] > 0.99 and len(answer) == 3
    from PIL import Image

    path = tmp_path / "scan.png"
    Image.fromarray(image[0]).save(path)
    assert classify(str(path))[0]["label"] == "seven"  # a file path reads the same
    with pytest.raises(ValueError, match=r"20×20 is not divisible by the patch size 8; configure resize=True"):
        classify(torch.rand(1, 20, 20))  # nothing is resized behind the user's back
    assert classify(torch.rand(1, 20, 20), resize=True)[0]["label"] == "seven"
    with pytest.raises(ValueError, match=r"images are 48×48, the model reads 32×32: pass resize=True"):
        classify(torch.rand(1, 48, 48))  # a size the patches divide is not resized behind the user's back either
    assert classify(torch.rand(1, 48, 48), resize=True)[0]["label"] == "seven"
    for bad in (0, -1, 2.5):
        with pytest.raises(ValueError, match=f"top_k must be an integer ≥ 1, got {bad}"):
            classify(torch.from_numpy(image), top_k=bad)


def test_zero_shot_image_and_audio_classification_rank_the_candidate_labels(tmp_path):
    torch.manual_seed(0)
    clip = CLIP(CLIPConfig.from_name("clip-digits-audio"))
    folder = saved(clip, tmp_path)
    zero_shot = pipeline("zero-shot-image-classification", model=folder)
    image = torch.rand(1, 32, 32)
    answer = zero_shot(image, candidate_labels=["seven", "two"], hypothesis_template="a handwritten {}.")
    from unitok.zero_shot import ZeroShotClassifier

    expected = ZeroShotClassifier(clip.eval(), ["seven", "two"], templates=["a handwritten {}."]).predict_proba(image)[0]
    assert {a["label"]: a["score"] for a in answer} == pytest.approx({"seven": float(expected[0]), "two": float(expected[1])})
    assert answer[0]["score"] >= answer[1]["score"]
    with pytest.raises(ValueError, match="candidate_labels"):
        zero_shot(image)
    # labels that would answer another question are refused, not split or halved
    with pytest.raises(TypeError, match=r"a list of labels, got the string 'seven' \(for one label: \['seven'\]\)"):
        zero_shot(image, candidate_labels="seven")
    with pytest.raises(ValueError, match=r"candidate_labels repeat \['seven'\]: give each label once"):
        zero_shot(image, candidate_labels=["seven", "seven", "two"])
    for bad in (["seven", ""], ["seven", 7]):
        with pytest.raises(ValueError, match="candidate_labels must be non-empty strings"):
            zero_shot(image, candidate_labels=bad)
    with pytest.raises(ValueError, match="candidate_labels is empty"):
        zero_shot(image, candidate_labels=[])

    audio = pipeline("zero-shot-audio-classification", model=folder)
    wave = (0.1 * np.random.default_rng(0).standard_normal(8000)).astype(np.float32)
    by_rate = audio(wave, candidate_labels=["seven", "two"], sample_rate=16000)
    as_dict = audio({"raw": wave, "sampling_rate": 16000}, candidate_labels=["seven", "two"])
    assert by_rate == as_dict and sum(a["score"] for a in by_rate) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="bare waveform: give sample_rate"):
        audio(wave, candidate_labels=["seven", "two"])


def test_speech_recognition_decodes_the_ctc_head_with_the_saved_characters(tmp_path):
    torch.manual_seed(0)
    model = ConformerCTC(ConformerConfig.from_name("conformer-digits", vocabulary=tuple("onetw ")))
    asr = pipeline("automatic-speech-recognition", model=saved(model, tmp_path))
    waves = [(0.1 * np.random.default_rng(i).standard_normal(n)).astype(np.float32) for i, n in ((0, 8000), (1, 12000))]
    answers = asr(waves, sample_rate=16000)
    assert answers == [asr(w, sample_rate=16000) for w in waves]
    tokens = model.processor(waves, sample_rate=16000)
    with torch.no_grad():
        out = model.eval()(tokens.features, tokens.attention_mask.sum(1))
    paths = ctc_greedy_decode(out.logits.log_softmax(-1), out.lengths)
    assert answers == [{"text": model.processor.characters.decode(p)} for p in paths]
    assert asr(waves[0], sample_rate=16000, decoder="beam", beam_size=4)["text"] is not None


def test_speech_recognition_held_to_a_lexicon_spells_only_its_words(tmp_path):
    torch.manual_seed(0)
    model = ConformerCTC(ConformerConfig.from_name("conformer-digits", vocabulary=tuple("onetw ")))
    asr = pipeline("automatic-speech-recognition", model=saved(model, tmp_path))
    waves = [(0.1 * np.random.default_rng(i).standard_normal(n)).astype(np.float32) for i, n in ((0, 16000), (1, 24000))]
    answers = asr(waves, sample_rate=16000, decoder="beam", lexicon=["one", "two"])
    assert answers == [{"text": t} for t in model.transcribe(waves, "beam", sample_rate=16000, lexicon=["one", "two"])]
    for answer in answers:
        assert all(word in ("one", "two") for word in answer["text"].split()), answer
    with pytest.raises(ValueError, match="a lexicon needs decoder='beam'"):
        asr(waves[0], sample_rate=16000, lexicon=["one"])
    with pytest.raises(ValueError, match=r"characters \['h', 'r'\] that are not in the vocabulary"):
        asr(waves[0], sample_rate=16000, decoder="beam", lexicon=["three"])
    with pytest.raises(ValueError, match="a lexicon needs decoder='beam'"):
        model.transcribe(waves[0], sample_rate=16000, lexicon=["one"])


def test_decision_acts_for_a_target_return_as_the_model_does(tmp_path):
    torch.manual_seed(0)
    dt = DecisionTransformer(DecisionTransformerConfig.from_name("dt-cartpole", return_scale=100.0))
    act = pipeline("decision", model=saved(dt, tmp_path))
    rng = np.random.default_rng(0)
    obs, actions, rewards = rng.standard_normal((3, 4)), [1, 0], [1.0, 1.0]
    answer = act({"observations": obs, "actions": actions, "rewards": rewards, "target_return": 200})
    states = torch.as_tensor(obs, dtype=torch.float32)[None]
    rtg = torch.tensor([[[2.0], [1.99], [1.98]]])
    with torch.no_grad():
        probs = dt.eval()(states, torch.tensor([[1, 0, 0]]), rtg, torch.arange(3)[None]).action_preds[0, -1].softmax(-1)
    assert answer == {"action": int(probs.argmax()), "score": pytest.approx(float(probs.max()))}
    first = act({"observations": obs[:1]}, target_return=500)
    assert first["action"] in (0, 1)
    with pytest.raises(ValueError, match="3 observations need 2 past actions and rewards"):
        act({"observations": obs, "actions": [1], "rewards": [1.0], "target_return": 200})
    with pytest.raises(ValueError, match="needs a target_return"):
        act({"observations": obs[:1]})
    assert act({"observations": obs[0]}, target_return=500) == first  # one observation, (4,)
    # never reshaped into other steps, never NaN in, never a fractional action id
    with pytest.raises(ValueError, match=r"observations must be \(T, 4\), got shape \(4, 3\)"):
        act({"observations": obs.T, "actions": [1, 0], "rewards": [1.0, 1.0], "target_return": 200})
    with pytest.raises(ValueError, match=r"observations must be \(T, 4\), got shape \(8,\)"):
        act({"observations": obs[:2].reshape(-1), "target_return": 200})
    with pytest.raises(ValueError, match="discrete actions must be whole ids"):
        act({"observations": obs, "actions": [0.7, 1], "rewards": rewards, "target_return": 200})
    bad = obs.copy()
    bad[1, 2] = np.nan
    with pytest.raises(ValueError, match="observations contain NaN/inf"):
        act({"observations": bad, "actions": actions, "rewards": rewards, "target_return": 200})
    with pytest.raises(ValueError, match="decision input 0: target_return must be a finite number, got nan"):
        act({"observations": obs[:1], "target_return": float("nan")})
    with pytest.raises(ValueError, match="decision input 0: target_return must be a finite number, got 'abc'"):
        act({"observations": obs[:1], "target_return": "abc"})
    with pytest.raises(ValueError, match=r"rewards must be one number a step, shape \(2,\), got shape \(2, 1\)"):
        act({"observations": obs, "actions": actions, "rewards": [[1.0], [1.0]], "target_return": 200})
    assert act({"observations": obs[:1], "target_return": np.float32(500)}) == first  # a numpy scalar is a number


def test_long_inputs_show_a_progress_bar(tmp_path, capsys):
    vit = ViT(ViTConfig.from_name("vit-digits"))
    classify = pipeline("image-classification", model=vit, batch_size=2)
    answers = classify([torch.rand(1, 32, 32) for _ in range(12)])
    assert len(answers) == 12
    assert "image-classification" in capsys.readouterr().err
    classify([torch.rand(1, 32, 32) for _ in range(2)])
    assert capsys.readouterr().err == ""
    assert unitok.load  # the pipeline's loader is the public one


def test_pipeline_is_importable_from_unitok_as_the_readme_shows():
    assert unitok.pipeline is pipeline and "pipeline" in unitok.__all__


def test_a_batch_answers_one_answer_an_image_and_a_batch_inside_a_list_is_refused(tmp_path):
    torch.manual_seed(0)
    vit = ViT(ViTConfig.from_name("vit-digits"))
    classify = pipeline("image-classification", model=vit, top_k=1)
    images = torch.rand(3, 1, 32, 32)
    one_by_one = [classify(image) for image in images]

    def same_answers(answers: list) -> bool:  # a batch rounds a little differently on some CPUs' kernels
        return len(answers) == len(one_by_one) and all(
            [a["label"] for a in got] == [a["label"] for a in want]
            and [a["score"] for a in got] == pytest.approx([a["score"] for a in want], abs=1e-6)
            for got, want in zip(answers, one_by_one, strict=True))

    assert same_answers(classify(images))  # (B, C, H, W): B answers, not the first alone
    assert same_answers(classify(images.numpy()))
    assert same_answers(classify(tuple(images)))  # a tuple is several inputs, as a list is
    with pytest.raises(ValueError, match="2 inputs gave 4 answers: an input holds several"):
        classify([images[:3], images[0]])  # answers would fall out of step with the inputs
    clip = CLIP(CLIPConfig.from_name("clip-digits"))
    zero_shot = pipeline("zero-shot-image-classification", model=clip, candidate_labels=["seven", "two"])
    batched, alone = zero_shot(images), [zero_shot(image) for image in images]
    assert len(batched) == 3
    for answer, expected in zip(batched, alone, strict=True):  # a batch rounds a little differently
        assert [a["label"] for a in answer] == [a["label"] for a in expected]
        assert [a["score"] for a in answer] == pytest.approx([a["score"] for a in expected], abs=1e-6)


def test_a_processor_that_contradicts_the_model_is_refused_when_set_or_loaded(tmp_path):
    from tokenizers_mm import ImagePreprocessConfig

    vit = ViT(ViTConfig.from_name("vit-digits"))
    other = ImagePreprocessConfig(patch_size=8, channels=1, mean=(0.1307,), std=(0.3081,), image_size=(32, 32))
    # the pipeline reads images with the config's statistics, `model.processor` would with these
    with pytest.raises(ValueError, match=r"the processor's image part differs from the one this ViT's config stores "
                                         r"\(mean=\(0.1307,\) \(config: \(0.5,\)\), std=\(0.3081,\) \(config: \(0.5,\)\)\)"):
        vit.processor = Processor(image=other)
    vit.processor = Processor(image=vit.config.preprocess_config(), labels=DIGITS)  # the same settings: fine
    with pytest.raises(ValueError, match="2 class names for a model of 10 classes"):
        vit.processor = Processor(labels=("cat", "dog"))
    folder = saved(vit, tmp_path / "vit")
    edited = (folder / "processor_config.json").read_text().replace("0.5", "0.25")
    (folder / "processor_config.json").write_text(edited)
    with pytest.raises(ValueError, match="the processor's image part differs"):
        unitok.load(folder)  # a hand-edited folder is refused, not read two ways
    model = ConformerCTC(ConformerConfig.from_name("conformer-digits", vocabulary=tuple("onetw ")))
    from tokenizers_mm import CharacterVocabulary

    with pytest.raises(ValueError, match="the processor's characters part differs"):
        model.processor = Processor(characters=CharacterVocabulary.from_list(list("xyz")))


def test_options_are_checked_the_same_way_in_every_form(tmp_path, bpe, wordpiece):
    torch.manual_seed(0)
    gpt_cls = GPT.for_sequence_classification(GPT(GPTConfig_nano(bpe.vocab_size)), num_labels=2)
    gpt_cls.processor = Processor(text=bpe, labels=("other", "parser"))
    with pytest.raises(ValueError, match=r"a dict input holds 'text' \(and 'text_pair'\), got keys \['text', 'txt_pair'\]"):
        pipeline("text-classification", model=gpt_cls)({"text": "the parser", "txt_pair": "reads the text"})
    bert = BERT(BERTConfig.from_name("bert-nano", vocab_size=wordpiece.vocab_size, context_length=32,
                                     heads=("pooler", "mlm")))
    bert.processor = Processor(text=wordpiece)
    fill = pipeline("fill-mask", model=bert)
    for bad in (0, -1, 2.5, None):
        with pytest.raises(ValueError, match=f"top_k must be an integer ≥ 1, got {bad}"):
            fill("the parser [MASK] the text", top_k=bad)
    asr = pipeline("automatic-speech-recognition",
                   model=ConformerCTC(ConformerConfig.from_name("conformer-digits", vocabulary=tuple("onetw "))))
    wave = (0.1 * np.random.default_rng(0).standard_normal(8000)).astype(np.float32)
    for rate in (16000.9, "16000"):  # the dict form is checked as sample_rate= is, not rounded
        with pytest.raises(ValueError, match=f"sample_rate must be a whole number of Hz.*got {rate!r}"):
            asr({"raw": wave, "sampling_rate": rate})
    classify = pipeline("image-classification", model=ViT(ViTConfig.from_name("vit-digits")))
    with pytest.raises(ValueError, match="resize must be True or False, got 'no'"):
        classify(torch.rand(1, 48, 48), resize="no")  # a true string: it would resize
    gpt = GPT(GPTConfig_nano(bpe.vocab_size))
    gpt.processor = Processor(text=bpe)
    generate = pipeline("text-generation", model=gpt, max_new_tokens=2)
    with pytest.raises(ValueError, match="do_sample must be True or False, got 'no'"):
        generate("def", do_sample="no")
    with pytest.raises(ValueError, match="seed must be an integer ≥ 0 or None, got 1.5"):
        generate("def", do_sample=True, seed=1.5)
    with pytest.raises(ValueError, match=r"temperature=0.7 only apply to sampling, but this call decodes by greedy"):
        generate("def", temperature=0.7)  # would be ignored
    with pytest.raises(ValueError, match=r"top_k=5 only apply to sampling, but this call decodes by beam"):
        generate("def", num_beams=2, top_k=5)
    assert generate("def", do_sample=True, temperature=0.7, seed=0) == generate("def", do_sample=True, temperature=0.7,
                                                                                seed=0)


def test_a_continuous_action_without_a_bounded_head_is_answered_in_its_own_units():
    # as rollouts send it: only a tanh head or a stored action range bounds the model's actions
    config = DecisionTransformerConfig(state_dim=3, act_dim=1, action_tanh=False, d_model=16, n_layers=1, n_heads=1,
                                       max_ep_len=32, dropout=0.0)
    dt = DecisionTransformer(config).eval()
    with torch.no_grad():
        dt.action_head.weight.zero_()
        dt.action_head.bias.fill_(1.7)
    answer = pipeline("decision", model=dt)({"observations": [[0.1, 0.2, 0.3]], "target_return": -200.0})
    assert answer["action"] == [pytest.approx(1.7)]



def test_a_bf16_or_float64_model_reads_its_pipeline_inputs_in_its_own_dtype(tmp_path):
    """Pipelines compute features and windows in float32; a model in another dtype is read in its
    own, as `transcribe` does, instead of failing on inputs the user never handles."""
    torch.manual_seed(0)
    conformer = ConformerCTC(ConformerConfig.from_name("conformer-digits", vocabulary=tuple("onetw "))).eval()
    wave = (0.1 * np.random.default_rng(0).standard_normal(8000)).astype(np.float32)
    half = conformer.to(torch.bfloat16)
    asr = pipeline("automatic-speech-recognition", model=half)
    assert asr(wave, sample_rate=16000) == {"text": half.transcribe(wave, sample_rate=16000)[0]}

    dt = DecisionTransformer(DecisionTransformerConfig.from_name("dt-cartpole", return_scale=100.0)).eval()
    obs = np.random.default_rng(0).standard_normal((3, 4))
    item = {"observations": obs, "actions": [1, 0], "rewards": [1.0, 1.0], "target_return": 200}
    expected = pipeline("decision", model=dt)(item)
    for dtype in (torch.float64, torch.bfloat16):
        answer = pipeline("decision", model=dt.to(dtype))(item)
        assert answer["action"] == expected["action"]
        assert answer["score"] == pytest.approx(expected["score"], abs=0.02 if dtype == torch.bfloat16 else 1e-6)


def test_zero_shot_audio_classification_refuses_silence_as_the_classifier_does(tmp_path):
    torch.manual_seed(0)
    audio = pipeline("zero-shot-audio-classification", model=CLIP(CLIPConfig.from_name("clip-digits-audio")))
    silence = np.zeros(16000, dtype=np.float32)
    with pytest.raises(ValueError, match="audio item 0 is all silence"):
        audio(silence, candidate_labels=["seven", "two"], sample_rate=16000)
    with pytest.raises(ValueError, match="audio item 1 is all silence"):
        audio([np.ones(16000, dtype=np.float32) * 0.1, {"raw": np.zeros(8000, np.int16), "sampling_rate": 8000}],
              candidate_labels=["seven", "two"], sample_rate=16000)
