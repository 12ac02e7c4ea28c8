"""Audio -> log-mel frames: 25 ms / 10 ms windows give 1 + T // hop frames of 80 mels, equal to
torchaudio's MelSpectrogram and log; files, tensors, arrays and int16 PCM read the same; other
sample rates are resampled (or refused, naming both rates); a bare waveform without its sample
rate is refused; a vocal-tract warp moves a tone's bin up and keeps the frames (warp 1 is
torchaudio's filterbank); per-utterance, speech-frame (blind to silence around the speech) and global
normalisation, and a floor under faint values; lengths survive batching; SpecAugment masks bands and spans; the tokenizer
pickles; bad input (empty, stereo, NaN, too short) raises naming the problem."""

from __future__ import annotations

import json
import math
import pickle
import re

import numpy as np
import pytest
import soundfile
import torch
import torchaudio

from tokenizers_mm import SpecAugment, SpectrogramConfig, SpectrogramTokenizer, Tokens
from tokenizers_mm.audio import speech_frames, warp_frequencies, warped_mel_filterbank

RATE = 16000


def tone(freq: float, seconds: float, rate: int = RATE, amplitude: float = 0.5) -> torch.Tensor:
    t = torch.arange(int(seconds * rate)) / rate
    return amplitude * torch.sin(2 * math.pi * freq * t)


def noisy_tone(freq: float, seconds: float, rate: int = RATE, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return tone(freq, seconds, rate) + 0.01 * torch.randn(int(seconds * rate), generator=g)


# --------------------------------------------------------------------------- config


def test_defaults_are_80_mels_of_25_ms_windows_every_10_ms():
    c = SpectrogramConfig()
    assert (c.sample_rate, c.n_mels, c.win_length, c.hop_length, c.fft_size) == (16000, 80, 400, 160, 512)
    assert c.num_frames(16000) == 101
    assert SpectrogramConfig(sample_rate=8000).fft_size == 256  # 200-sample window -> next power of two


def test_config_round_trips_through_json():
    c = SpectrogramConfig(n_mels=4, normalize="global", global_mean=(0.0, 1.0, 2.0, 3.0),
                          global_std=(1.0, 1.0, 2.0, 2.0), f_max=7000.0, resample=False)
    back = SpectrogramConfig.from_dict(json.loads(json.dumps(c.to_dict())))
    assert back == c and isinstance(back.global_mean, tuple)


@pytest.mark.parametrize(("options", "message"), [
    (dict(hop_ms=30.0), "need 0 < hop_ms ≤ win_ms, got hop_ms=30.0, win_ms=25.0"),
    (dict(n_fft=256), "n_fft=256 is shorter than the window (400 samples)"),
    (dict(f_max=9000.0), "need 0 ≤ f_min < f_max ≤ 8000 Hz (half the sample rate), got f_min=0.0, f_max=9000.0"),
    (dict(normalize="global"), "normalize='global' needs global_mean and global_std (one value per mel bin)"),
    (dict(n_mels=2, normalize="global", global_mean=(0.0,), global_std=(1.0,)),
     "global_mean / global_std need 2 values (one per mel bin), got 1 and 1"),
    (dict(normalize="per-batch"), "normalize must be one of 'utterance', 'speech', 'global', 'none', got 'per-batch'"),
    (dict(normalize="speech", speech_db=0.0), "speech_db must be positive (dB below the loudest frame), got 0.0"),
    (dict(floor_db=-10.0), "floor_db must be positive (dB below the loudest value) or None, got -10.0"),
    (dict(trim_db=0.0), "trim_db must be positive (dB below the loudest frame) or None, got 0.0"),
])
def test_bad_configs_name_the_field(options, message):
    """The message names the field, what it must be, and the bad value."""
    with pytest.raises(ValueError, match=re.escape(message)):
        SpectrogramConfig(**options)
    with pytest.raises(ValueError, match=re.escape("unknown SpectrogramConfig key(s) ['n_mel']; known keys: ")):
        SpectrogramConfig.from_dict({"n_mel": 80})


# --------------------------------------------------------------------------- frames


def test_frames_are_torchaudios_log_mel_spectrogram():
    wave = noisy_tone(440.0, 0.5)
    frames = SpectrogramTokenizer(normalize="none").features(wave, RATE)
    mel = torchaudio.transforms.MelSpectrogram(RATE, n_fft=512, win_length=400, hop_length=160, n_mels=80)(wave)
    assert frames.shape == (1 + 8000 // 160, 80)
    torch.testing.assert_close(frames, torch.log(mel + 1e-6).T)


def test_a_tone_lights_up_the_mel_bin_of_its_frequency():
    low = SpectrogramTokenizer(normalize="none").features(tone(300.0, 0.3), RATE).mean(0).argmax()
    high = SpectrogramTokenizer(normalize="none").features(tone(3000.0, 0.3), RATE).mean(0).argmax()
    assert int(high) > int(low) + 20


def test_warp_one_is_torchaudios_filterbank_and_a_warp_moves_formants_up_at_the_same_tempo():
    for config in (SpectrogramConfig(), SpectrogramConfig(sample_rate=8000, f_min=100.0, f_max=3500.0, n_mels=40)):
        expected = torchaudio.functional.melscale_fbanks(config.fft_size // 2 + 1, config.f_min,
                                                         config.f_max or config.sample_rate / 2, config.n_mels,
                                                         config.sample_rate)
        assert torch.equal(warped_mel_filterbank(config, 1.0), expected)
    tokenizer = SpectrogramTokenizer(normalize="none")
    wave = noisy_tone(1000.0, 0.5)
    assert torch.equal(tokenizer.features(wave, RATE, warp=1.0), tokenizer.features(wave, RATE))
    warped = tokenizer.features(wave, RATE, warp=1.3)
    assert warped.shape == tokenizer.features(wave, RATE).shape  # the same frames: timing kept
    # a 1 kHz tone read with warp 1.3 lights the bin a 1.3 kHz tone lights unwarped
    assert int(warped.mean(0).argmax()) == int(tokenizer.features(noisy_tone(1300.0, 0.5), RATE).mean(0).argmax())
    f = torch.tensor([0.0, 1000.0, 4000.0, 8000.0])
    assert torch.allclose(warp_frequencies(f, 1.2, RATE), torch.tensor([0.0, 1200.0, 4800.0, 8000.0]))  # bend at 4 kHz
    assert torch.allclose(warp_frequencies(f, 0.8, RATE), torch.tensor([0.0, 800.0, 3200.0, 8000.0]))
    for bad in (3.0, 0.0, True, "1.2"):
        with pytest.raises(ValueError, match="warp must be a factor in \\[0.5, 2\\]"):
            tokenizer.features(wave, RATE, warp=bad)


def test_utterance_normalisation_gives_each_mel_bin_zero_mean_unit_variance():
    frames = SpectrogramTokenizer().features(noisy_tone(440.0, 1.0), RATE)
    torch.testing.assert_close(frames.mean(0), torch.zeros(80), atol=1e-4, rtol=0)
    torch.testing.assert_close(frames.std(0, unbiased=False), torch.ones(80), atol=1e-3, rtol=0)


def speechlike(seed: int = 0) -> torch.Tensor:
    """1.3 s of "words" as the built-in corpus has them: tone bursts of changing pitch and
    loudness, short pauses (digital silence) between, 0.1 s of silence before and after."""
    g = torch.Generator().manual_seed(seed)
    parts = [torch.zeros(1600)]
    for f in (220.0, 330.0, 180.0, 500.0):
        parts += [noisy_tone(f, 0.25, seed=seed) * float(0.2 + torch.rand((), generator=g)), torch.zeros(800)]
    return torch.cat(parts + [torch.zeros(800)])


def test_speech_normalisation_is_blind_to_silence_around_the_speech():
    wave, pad = speechlike(), 2 * RATE  # two seconds: 200 frames of 10 ms on each side
    padded = torch.cat([torch.zeros(pad), wave, torch.zeros(pad)])
    for normalize, blind in (("speech", True), ("utterance", False)):
        tokenizer = SpectrogramTokenizer(normalize=normalize, floor_db=80.0)
        alone, inside = tokenizer.features(wave, RATE), tokenizer.features(padded, RATE)[200:200 + 1 + len(wave) // 160]
        gap = float((alone - inside).abs().max())
        assert (gap < 1e-3) == blind, f"{normalize}: the utterance's frames moved by up to {gap:.3f}"
    frames = SpectrogramTokenizer(normalize="speech").features(wave, RATE)
    speech = speech_frames(SpectrogramTokenizer(normalize="none").features(wave, RATE), 40.0)
    assert 0.7 < float(speech.float().mean()) < 1.0  # the pauses are not speech
    torch.testing.assert_close(frames[speech].mean(0), torch.zeros(80), atol=1e-4, rtol=0)


def test_trimming_cuts_silence_around_the_speech_but_not_noise_or_the_speech_itself():
    from tokenizers_mm.wave_augment import add_noise

    wave = speechlike()  # 0.1 s of silence before and after, as the built-in corpus has
    padded = torch.cat([torch.zeros(2 * RATE), wave, torch.zeros(2 * RATE)])
    tokenizer = SpectrogramTokenizer(normalize="speech", floor_db=80.0, trim_db=60.0)  # keeps 100 ms
    alone, trimmed = tokenizer.features(wave, RATE), tokenizer.features(padded, RATE)
    assert alone.shape == SpectrogramTokenizer(normalize="speech").features(wave, RATE).shape  # nothing to cut
    assert abs(len(trimmed) - len(alone)) <= 2  # the 4 s of silence are gone, the margins stay
    start = int((trimmed[:, 0] != trimmed[0, 0]).nonzero()[0]) - int((alone[:, 0] != alone[0, 0]).nonzero()[0])
    torch.testing.assert_close(trimmed[start + 2:start + len(alone) - 2], alone[2:-2], atol=1e-3, rtol=0)
    noisy = add_noise(padded, 20.0, "white", torch.Generator().manual_seed(0))
    assert len(tokenizer.features(noisy, RATE)) == 1 + len(padded) // 160  # a noisy background is not silence


def test_the_floor_makes_digital_silence_and_a_faint_noise_floor_read_the_same():
    wave = speechlike()
    hiss = 3e-6 * torch.randn(len(wave), generator=torch.Generator().manual_seed(1))  # -110 dB full scale
    tokenizer = SpectrogramTokenizer(normalize="none", floor_db=80.0, log_offset=1e-10)
    clean, hissy = tokenizer.features(wave, RATE), tokenizer.features(wave + hiss, RATE)
    assert float(clean.min()) == pytest.approx(float(clean.max()) - 80 * math.log(10) / 10, abs=1e-4)
    silent = (clean == clean.min()).all(dim=1)  # the pauses: every mel bin at the floor
    assert int(silent.sum()) >= 20
    torch.testing.assert_close(hissy[silent], clean[silent], atol=1e-4, rtol=0)
    torch.testing.assert_close(clean, hissy, atol=0.05, rtol=0)  # speech hardly moves either
    unfloored = SpectrogramTokenizer(normalize="none", log_offset=1e-10)
    assert float((unfloored.features(wave, RATE) - unfloored.features(wave + hiss, RATE)).abs().max()) > 1.0


def test_global_normalisation_uses_corpus_statistics():
    corpus = [noisy_tone(f, 0.4, seed=i) for i, f in enumerate((200.0, 500.0, 1200.0))]
    raw = SpectrogramTokenizer(normalize="none")
    mean, std = raw.global_stats(corpus, RATE)
    assert len(mean) == len(std) == 80
    tokenizer = SpectrogramTokenizer(normalize="global", global_mean=mean, global_std=std)
    frames = torch.cat([tokenizer.features(w, RATE) for w in corpus])
    torch.testing.assert_close(frames.mean(0), torch.zeros(80), atol=1e-3, rtol=0)
    torch.testing.assert_close(frames.std(0, unbiased=False), torch.ones(80), atol=1e-2, rtol=0)


def test_encode_pads_a_batch_and_keeps_each_utterances_length():
    tokens = SpectrogramTokenizer().encode([noisy_tone(440, 1.0), noisy_tone(440, 0.25), noisy_tone(440, 0.5)], RATE)
    assert isinstance(tokens, Tokens) and tokens.modality == "audio"
    assert tokens.features.shape == (3, 101, 80)
    assert tokens.attention_mask.sum(1).tolist() == [101, 26, 51]
    assert torch.all(tokens.features[1, 26:] == 0)
    single = SpectrogramTokenizer().encode(noisy_tone(440, 0.25), RATE)
    torch.testing.assert_close(single.features[0], tokens.features[1, :26])


def test_a_bare_waveform_needs_its_sample_rate_and_a_file_does_not(tmp_path):
    wave = noisy_tone(440.0, 0.5)
    for audio, kind in ((wave, "tensor"), (wave.numpy(), "numpy array"), ([wave, wave], "tensor")):
        with pytest.raises(ValueError, match=rf"bare waveform \({kind} of shape \(8000,\)\) needs its sample rate: "
                                             r"pass sample_rate="):
            SpectrogramTokenizer().encode(audio)
    with pytest.raises(ValueError, match="whole number of Hz"):
        SpectrogramTokenizer().encode(wave, sample_rate=16000.5)
    soundfile.write(tmp_path / "a.wav", wave.numpy(), RATE, subtype="FLOAT")
    torch.testing.assert_close(SpectrogramTokenizer().features(tmp_path / "a.wav"),
                               SpectrogramTokenizer().features(wave, RATE), atol=1e-4, rtol=0)


def test_files_tensors_arrays_and_int16_pcm_give_the_same_frames(tmp_path):
    wave = noisy_tone(440.0, 0.5)
    pcm = (wave * 32767).round().to(torch.int16)
    soundfile.write(tmp_path / "a.wav", pcm.numpy(), RATE, subtype="PCM_16")
    soundfile.write(tmp_path / "a.flac", pcm.numpy(), RATE, subtype="PCM_16")
    tokenizer = SpectrogramTokenizer()
    reference = tokenizer.features(pcm.float() / 32768, RATE)
    for audio in (str(tmp_path / "a.wav"), tmp_path / "a.flac", pcm, pcm.numpy(), (pcm.float() / 32768)[None]):
        torch.testing.assert_close(tokenizer.features(audio, RATE), reference, atol=1e-5, rtol=0)


def test_other_sample_rates_are_resampled_to_the_configured_rate(tmp_path):
    """With torchaudio's default windowed-sinc resampler: the frames of 8 kHz audio are those of
    ``torchaudio.functional.resample(wave, 8000, 16000)`` read at 16 kHz."""
    at_8k = 0.1 * torch.randn(8000, generator=torch.Generator().manual_seed(0))  # broadband: every filter shows
    # mels up to 3.8 kHz, the band 8 kHz audio carries (above it, logs of almost nothing magnify rounding)
    tokenizer = SpectrogramTokenizer(normalize="none", f_max=3800.0)
    frames = tokenizer.features(at_8k, sample_rate=8000)
    assert frames.shape == (101, 80)  # one second at 16 kHz
    reference = tokenizer.features(torchaudio.functional.resample(at_8k, 8000, 16000), RATE)
    torch.testing.assert_close(frames, reference, atol=1e-5, rtol=0)
    soundfile.write(tmp_path / "8k.wav", at_8k.numpy(), 8000, subtype="FLOAT")
    torch.testing.assert_close(tokenizer.features(tmp_path / "8k.wav"), frames, atol=1e-5, rtol=0)


def test_the_tokenizer_pickles_with_its_config_alone():
    tokenizer = SpectrogramTokenizer(n_mels=40)
    wave = noisy_tone(440.0, 0.3)
    before = tokenizer.features(wave, sample_rate=22050)  # builds and caches transforms
    copy = pickle.loads(pickle.dumps(tokenizer))
    assert copy.config == tokenizer.config and copy._mel is None
    torch.testing.assert_close(copy.features(wave, sample_rate=22050), before)


# --------------------------------------------------------------------------- SpecAugment


def test_specaugment_masks_frequency_bands_and_time_spans_with_zeros():
    frames = torch.randn(200, 80) + 5.0  # nothing is 0 before masking
    g = torch.Generator().manual_seed(0)
    masked = SpecAugment(freq_masks=2, freq_width=10, time_masks=2, time_width=20)(frames, generator=g)
    zero_bins = (masked == 0).all(dim=0)
    zero_frames = (masked == 0).all(dim=1)
    assert 1 <= int(zero_bins.sum()) <= 20 and 1 <= int(zero_frames.sum()) <= 40
    kept = ~(masked == 0)
    assert torch.equal(masked[kept], frames[kept])  # everything else is untouched
    assert not torch.equal(frames, masked) and frames.min() > 0  # the input is not modified


def test_specaugment_time_masks_stay_within_a_fraction_of_short_utterances():
    g = torch.Generator().manual_seed(1)
    augment = SpecAugment(freq_masks=0, time_masks=1, time_width=100, max_time_fraction=0.1)
    for _ in range(50):
        masked = augment(torch.ones(30, 8), generator=g)
        assert int((masked == 0).all(dim=1).sum()) <= 3


def test_specaugment_without_masks_is_the_identity_and_is_picklable():
    frames = torch.randn(50, 80)
    assert torch.equal(SpecAugment(freq_masks=0, time_masks=0)(frames), frames)
    assert "freq_masks=2" in repr(pickle.loads(pickle.dumps(SpecAugment())))
    with pytest.raises(ValueError, match="one utterance"):
        SpecAugment()(torch.randn(2, 50, 80))


# --------------------------------------------------------------------------- bad input


def test_empty_audio_is_refused():
    with pytest.raises(ValueError, match="empty"):
        SpectrogramTokenizer().encode(torch.zeros(0), RATE)
    with pytest.raises(ValueError, match="empty list"):
        SpectrogramTokenizer().encode([])


def test_audio_shorter_than_one_window_is_refused():
    with pytest.raises(ValueError, match="100 samples at 16000 Hz, fewer than the 400 one 25 ms window of a 512-point FFT"):
        SpectrogramTokenizer().encode(torch.zeros(100), RATE)
    # a long FFT reflects half its size at each end: 500 samples fill a window but not a 2,048-point FFT's padding
    with pytest.raises(ValueError, match="fewer than the 1025 one 25 ms window of a 2048-point FFT needs"):
        SpectrogramTokenizer(SpectrogramConfig(n_fft=2048)).features(torch.randn(500), RATE)


def test_bad_settings_and_rates_are_refused_by_name():
    with pytest.raises(ValueError, match="hop_ms=0.01 is less than one sample at 16000 Hz"):
        SpectrogramConfig(hop_ms=0.01, win_ms=0.02)
    with pytest.raises(ValueError, match="sample_rate must be a whole number of Hz .*got '16000'"):
        SpectrogramTokenizer().encode(torch.randn(1600), "16000")


def test_stereo_audio_is_refused_with_how_to_downmix(tmp_path):
    stereo = torch.stack([noisy_tone(440, 0.3), noisy_tone(660, 0.3)])
    with pytest.raises(ValueError, match=r"2 channels.*mono.*mean\(dim=0\)"):
        SpectrogramTokenizer().encode(stereo, RATE)
    soundfile.write(tmp_path / "stereo.wav", stereo.T.numpy(), RATE)
    with pytest.raises(ValueError, match=r"stereo.wav has 2 channels"):
        SpectrogramTokenizer().encode(str(tmp_path / "stereo.wav"))
    downmixed = SpectrogramTokenizer(downmix=True).features(stereo, RATE)
    torch.testing.assert_close(downmixed, SpectrogramTokenizer().features(stereo.mean(0), RATE))


def test_a_wrong_sample_rate_without_resampling_names_both_rates(tmp_path):
    with pytest.raises(ValueError, match=r"at 8000 Hz but the tokenizer expects 16000 Hz"):
        SpectrogramTokenizer(resample=False).encode(tone(440, 0.5, 8000), sample_rate=8000)
    soundfile.write(tmp_path / "44k.wav", tone(440, 0.2, 44100).numpy(), 44100)
    with pytest.raises(ValueError, match=r"44k.wav is at 44100 Hz .* 16000 Hz"):
        SpectrogramTokenizer(resample=False).encode(str(tmp_path / "44k.wav"))


def test_nan_in_audio_or_in_the_features_is_refused():
    wave = noisy_tone(440, 0.3)
    wave[100] = float("nan")
    with pytest.raises(ValueError, match="1 NaN/inf samples"):
        SpectrogramTokenizer().encode(wave, RATE)
    loud = noisy_tone(440, 0.3) * 1e30  # finite samples whose power overflows float32
    with pytest.raises(ValueError, match="spectrogram has .* NaN/inf"):
        SpectrogramTokenizer(normalize="none").encode(loud, RATE)


def test_unsupported_inputs_name_what_is_accepted(tmp_path):
    with pytest.raises(TypeError, match="file path, a tensor or an array"):
        SpectrogramTokenizer().encode(3.5)
    with pytest.raises(FileNotFoundError, match="missing.wav"):
        SpectrogramTokenizer().encode(str(tmp_path / "missing.wav"))
    (tmp_path / "noise.wav").write_bytes(b"not audio at all")
    with pytest.raises(ValueError, match="cannot read audio file"):
        SpectrogramTokenizer().encode(str(tmp_path / "noise.wav"))
    with pytest.raises(ValueError, match=r"\(samples,\) or \(channels, samples\)"):
        SpectrogramTokenizer().encode(torch.zeros(2, 1, 1000), RATE)
    with pytest.raises(TypeError, match="int16/int32"):
        SpectrogramTokenizer().encode(np.zeros(1000, dtype=np.uint8), RATE)
