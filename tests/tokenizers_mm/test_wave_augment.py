"""Acoustic conditions for training: each condition does what it says (noise at the asked SNR
and colour, silence of the asked length, speed by resampling, a room that keeps the power,
a telephone line with nothing outside 300–3400 Hz); `WaveAugment` applies each of them, and
draws them (and vocal-tract warps for the frames) within its ranges, the same way for the same
generator; a batch comes out at one length with each utterance whole
inside it; no-speech clips are silence or noise; bad ranges raise naming the option."""

from __future__ import annotations

import math
import pickle

import pytest
import torch

from tokenizers_mm import WaveAugment
from tokenizers_mm.wave_augment import (
    add_noise,
    change_speed,
    colored_noise,
    pad_silence,
    power,
    reverberate,
    telephone_band,
)

RATE = 16000


def tone(freq: float, seconds: float, rate: int = RATE) -> torch.Tensor:
    return 0.5 * torch.sin(2 * math.pi * freq * torch.arange(int(seconds * rate)) / rate)


def band_power(wave: torch.Tensor, low: float, high: float, rate: int = RATE) -> float:
    spectrum = torch.fft.rfft(wave).abs() ** 2
    f = torch.fft.rfftfreq(len(wave), 1 / rate)
    return float(spectrum[(f >= low) & (f < high)].sum())


def g(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# --------------------------------------------------------------------------- conditions


@pytest.mark.parametrize("snr", [0.0, 20.0])
def test_noise_lands_at_the_asked_signal_to_noise_ratio(snr):
    wave = tone(440, 1.0)
    noisy = add_noise(wave, snr, "white", g())
    assert 10 * math.log10(power(wave) / power(noisy - wave)) == pytest.approx(snr, abs=0.01)
    quiet = add_noise(wave, snr, "white", g(), reference_power=power(wave) / 100)  # 20 dB quieter speech
    assert 10 * math.log10(power(wave) / power(quiet - wave)) == pytest.approx(snr + 20, abs=0.01)


def test_noise_colours_have_unit_power_and_falling_spectra():
    for color, low_over_high in (("white", (0.5, 2.0)), ("pink", (5.0, 50.0)), ("brown", (100.0, 1e4))):
        noise = colored_noise(RATE, color, g())
        assert power(noise) == pytest.approx(1.0, rel=1e-4)
        # equal widths: 1 (white), ln 11 / ln(7/6) ≈ 16 (pink), (1/100 - 1/1100) / (1/6000 - 1/7000) ≈ 380 (brown)
        ratio = band_power(noise, 100, 1100) / band_power(noise, 6000, 7000)
        assert low_over_high[0] < ratio < low_over_high[1], (color, ratio)
    with pytest.raises(ValueError, match="noise color"):
        colored_noise(100, "blue")  # type: ignore[arg-type]


def test_silence_speed_room_and_telephone_line():
    wave = tone(440, 1.0)
    padded = pad_silence(wave, RATE, 2.0, 0.5)
    assert len(padded) == 3.5 * RATE and torch.equal(padded[2 * RATE:3 * RATE], wave)
    assert float(padded[:2 * RATE].abs().max()) == 0.0

    faster = change_speed(wave, 1.25)  # a quarter faster: 0.8 s, the tone a quarter higher
    assert len(faster) == pytest.approx(0.8 * RATE, abs=2)
    assert band_power(faster, 530, 570) > 100 * band_power(faster, 420, 460)
    assert torch.equal(change_speed(wave, 1.0), wave)

    room = reverberate(wave, RATE, rt60=0.3, generator=g())
    assert len(room) == len(wave) + round(0.3 * RATE) - 1  # the reverberant tail is kept
    assert power(room) == pytest.approx(power(wave), rel=1e-4)
    assert float(room[len(wave):].abs().max()) > 1e-3  # sound goes on after the speech stops
    cut = reverberate(wave, RATE, rt60=0.3, generator=g(), keep_tail=False)
    assert len(cut) == len(wave) and power(cut) == pytest.approx(power(wave), rel=1e-4)

    mixture = tone(100, 1.0) + tone(1000, 1.0) + tone(6000, 1.0)
    line = telephone_band(mixture, RATE, mu_law=False)
    assert len(line) == len(mixture)
    kept = band_power(line, 900, 1100)
    assert band_power(line, 5900, 6100) < 1e-4 * kept and band_power(line, 90, 110) < 1e-3 * kept
    assert float((telephone_band(mixture, RATE) - line).abs().max()) > 1e-3  # μ-law quantises


# --------------------------------------------------------------------------- random draws


def test_the_same_generator_gives_the_same_conditions():
    augment = WaveAugment(speed_p=1, reverb_p=1, silence_p=1, noise_p=1, telephone_p=0.5)
    wave = tone(300, 0.5)
    assert torch.equal(augment(wave, RATE, g(3)), augment(wave, RATE, g(3)))
    assert not torch.equal(augment(wave, RATE, g(3)), augment(wave, RATE, g(4)))
    copy = pickle.loads(pickle.dumps(augment))
    assert torch.equal(copy(wave, RATE, g(3)), augment(wave, RATE, g(3)))


def test_draws_stay_within_their_ranges():
    wave = tone(300, 0.5)
    silence = WaveAugment(speed_p=0, reverb_p=0, silence_p=1, silence=(0.5, 1.0), noise_p=0, telephone_p=0,
                          gain_db=(0.0, 0.0))
    speed = WaveAugment(speed_p=1, speeds=(0.9, 1.1), reverb_p=0, silence_p=0, noise_p=0, telephone_p=0)
    gain = WaveAugment(speed_p=0, reverb_p=0, silence_p=0, noise_p=0, telephone_p=0, gain_db=(-30.0, -10.0))
    noise = WaveAugment(speed_p=0, reverb_p=0, silence_p=0, noise_p=1, snr_db=(10.0, 20.0), telephone_p=0,
                        gain_db=(0.0, 0.0))
    generator = g()
    for _ in range(20):
        padded = silence(wave, RATE, generator)
        assert 0.5 + 0.5 + 0.5 <= len(padded) / RATE <= 1.0 + 0.5 + 1.0
        assert 0.5 / 1.1 - 0.01 <= len(speed(wave, RATE, generator)) / RATE <= 0.5 / 0.9 + 0.01
        level = 10 * math.log10(power(gain(wave, RATE, generator)) / power(wave))
        assert -30.0 <= level <= -10.0
        snr = 10 * math.log10(power(wave) / power(noise(wave, RATE, generator) - wave))
        assert 10.0 - 0.01 <= snr <= 20.0 + 0.01


def test_vocal_tract_warps_are_drawn_in_range_and_off_by_default_without_touching_the_generator():
    generator = g()
    assert all(WaveAugment().draw_warp(generator) == 1.0 for _ in range(20))
    assert torch.equal(generator.get_state(), g().get_state())  # no draw: other conditions replay as before
    warp = WaveAugment(warp_p=0.5, warps=(1.0, 1.4))
    draws = [warp.draw_warp(generator) for _ in range(400)]
    warped = [d for d in draws if d != 1.0]
    assert 150 <= len(warped) <= 250 and all(1.0 <= d <= 1.4 for d in warped)
    assert min(warped) < 1.1 and max(warped) > 1.3


# Every other condition off and the loudness kept, so each test below sees one condition alone.
ONLY = dict(speed_p=0, reverb_p=0, silence_p=0, noise_p=0, telephone_p=0, gain_db=(0.0, 0.0))


def test_wave_augment_speeds_the_speech_up_by_resampling():
    wave = tone(440, 1.0)
    faster = WaveAugment(**{**ONLY, "speed_p": 1, "speeds": (1.2, 1.2)})(wave, RATE, g())
    assert len(faster) == pytest.approx(len(wave) / 1.2, abs=1)  # 1/1.2 as long...
    assert band_power(faster, 500, 560) > 100 * band_power(faster, 400, 480)  # ...the tone 1.2 × higher (528 Hz)


def test_wave_augment_puts_the_speech_in_a_room():
    click = torch.zeros(RATE)
    click[1000] = 1.0
    room = WaveAugment(**{**ONLY, "reverb_p": 1, "rt60": (0.3, 0.3), "direct_ratio_db": (0.0, 0.0)})
    heard = room(click, RATE, g())
    assert len(heard) == len(click)  # the tail past the end is cut: batches get no longer
    assert power(heard) == pytest.approx(power(click), rel=1e-4)
    assert float(heard[:1000].abs().max()) < 1e-6  # nothing before the sound
    # the direct path 0 dB above the reverberant tail: half the energy rings on after the click
    assert float(heard[1001:].pow(2).sum() / heard.pow(2).sum()) == pytest.approx(0.5, abs=0.01)


def test_wave_augment_sends_the_speech_down_a_telephone_line():
    mixture = tone(100, 1.0) + tone(1000, 1.0) + tone(6000, 1.0)
    line = WaveAugment(**{**ONLY, "telephone_p": 1})(mixture, RATE, g())
    assert len(line) == len(mixture)
    total = band_power(line, 0, RATE / 2 + 1)
    assert band_power(line, 3400, RATE / 2 + 1) < 1e-4 * total  # the 6 kHz tone is gone
    assert band_power(line, 0, 300) < 1e-4 * total  # and so is the 100 Hz hum
    assert band_power(line, 900, 1100) > 0.99 * total  # the 1 kHz tone carries (μ-law noise aside)


def test_a_batch_is_one_length_with_each_utterance_whole_inside():
    augment = WaveAugment(speed_p=0, reverb_p=0, silence_p=0.5, silence=(0.0, 1.0), noise_p=0, telephone_p=0,
                          gain_db=(0.0, 0.0))
    waves = [tone(300, 0.4), tone(500, 0.7), tone(700, 0.5)]
    generator, lengths = g(), set()
    for _ in range(10):
        batch = augment.batch(waves, RATE, generator)
        length = len(batch[0])
        assert all(len(b) == length for b in batch) and 0.7 * RATE <= length <= 2.7 * RATE
        lengths.add(length)
        for wave, recorded in zip(waves, batch):
            start = int((recorded != 0).nonzero()[0])  # the tones start at a zero crossing, then rise
            assert torch.equal(recorded[start - 1:start - 1 + len(wave)], wave)
    assert len(lengths) > 2 and 0.7 * RATE in lengths  # some batches lengthened, some not


def test_no_speech_clips_are_silence_or_noise_of_the_asked_duration():
    augment = WaveAugment(no_speech_p=0.3, no_speech_seconds=(0.5, 1.5), no_speech_silence_p=0.5)
    generator = g()
    clips = [augment.no_speech(RATE, generator) for _ in range(40)]
    assert all(0.5 * RATE <= len(c) <= 1.5 * RATE for c in clips)
    silent = sum(float(c.abs().max()) == 0.0 for c in clips)
    assert 5 <= silent <= 35  # both kinds
    assert len(augment.no_speech(RATE, generator, seconds=0.7)) == 0.7 * RATE  # as long as the utterance it replaces
    draws = sum(augment.draw_no_speech(generator) for _ in range(1000))
    assert 250 <= draws <= 350


@pytest.mark.parametrize(("options", "message"), [
    (dict(speed_p=1.5), "speed_p must be a probability in [0, 1], got 1.5"),
    (dict(speeds=(1.2, 0.9)), "speeds must be a range (low, high) within [0.5, 2], got (1.2, 0.9)"),
    (dict(warp_p=-0.1), "warp_p must be a probability in [0, 1], got -0.1"),
    (dict(warps=(0.3, 1.2)), "warps must be a range (low, high) within [0.5, 2], got (0.3, 1.2)"),
    (dict(silence=(-1.0, 1.0)), "silence must be a range (low, high) within [0, 60], got (-1.0, 1.0)"),
    (dict(snr_db=(30.0, 5.0)), "snr_db must be a range (low, high) within [-20, 100], got (30.0, 5.0)"),
    (dict(noise_colors=("white", "purple")),
     "noise_colors must be some of ('white', 'pink', 'brown'), got ['white', 'purple']"),
])
def test_bad_options_name_the_option(options, message):
    """The whole message: the option, what it must be, and the bad value."""
    with pytest.raises(ValueError) as error:
        WaveAugment(**options)
    assert str(error.value) == message


def test_settings_that_would_cut_or_poison_the_speech_are_refused():
    wave = tone(440, 0.5)
    with pytest.raises(ValueError, match="before must be a finite number ≥ 0, got -0.1"):
        pad_silence(wave, RATE, -0.1, 0.0)  # a negative pad crops the speech
    with pytest.raises(ValueError, match="snr_db must be a finite number, got nan"):
        add_noise(wave, float("nan"))  # NaN audio
    with pytest.raises(ValueError, match="rt60 must be a finite number > 0, got -0.3"):
        reverberate(wave, RATE, -0.3)
    with pytest.raises(ValueError, match="speed factor must be in"):
        change_speed(wave, float("nan"))
    faster = change_speed(wave.double(), 1.1)  # float64 in, float64 out
    assert faster.dtype == torch.float64
    assert torch.allclose(faster.float(), change_speed(wave, 1.1), atol=1e-6)
