"""Acoustic conditions for training speech models: speed, vocal-tract length (a frequency warp
the frames are read with), reverberation, silence, noise, telephone band and loudness, drawn at
random for each utterance (training only), and clips with no speech in them at all.

Each condition is also a small pure function (`change_speed`, `reverberate`, `pad_silence`,
`add_noise`, `telephone_band`, `colored_noise`) so an evaluation can apply one condition
exactly. Everything works on one mono float waveform (T,) at a known sample rate.

Axis legend: T samples.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Literal

import torch
from torch import Tensor

from tokenizers_mm.audio import WARPS, resample
from tokenizers_mm.checks import check_number

NoiseColor = Literal["white", "pink", "brown"]
NOISE_COLORS: tuple[NoiseColor, ...] = ("white", "pink", "brown")
TELEPHONE_RATE = 8000  # narrow-band telephony: 8 kHz samples, 300–3400 Hz


def _uniform(low: float, high: float, generator: torch.Generator | None) -> float:
    return low + (high - low) * float(torch.rand((), generator=generator))


def _chance(p: float, generator: torch.Generator | None) -> bool:
    return p > 0 and float(torch.rand((), generator=generator)) < p


def _fft_size(n: int) -> int:
    """The power of two ≥ n (FFTs of awkward lengths are many times slower)."""
    return 1 << max(0, n - 1).bit_length()


def power(wave: Tensor) -> float:
    """Mean power of a waveform (its mean square)."""
    return float(wave.double().pow(2).mean())


NOISE_BANK = 1 << 19  # samples of each coloured noise made once (33 s at 16 kHz); clips are cut from it


@functools.lru_cache(maxsize=4)
def _noise_bank(color: NoiseColor) -> Tensor:
    """A long stretch of ``color`` noise, made once per process from a fixed seed."""
    return _shaped_noise(NOISE_BANK, color, torch.Generator().manual_seed(NOISE_COLORS.index(color)))


def _shaped_noise(num_samples: int, color: NoiseColor, generator: torch.Generator | None) -> Tensor:
    noise = torch.randn(num_samples, generator=generator)
    if color != "white" and num_samples > 1:
        n = _fft_size(num_samples)
        spectrum = torch.fft.rfft(noise, n=n)
        f = torch.arange(spectrum.shape[0], dtype=torch.float32).clamp_min(1.0)
        spectrum = spectrum / (f.sqrt() if color == "pink" else f)
        noise = torch.fft.irfft(spectrum, n=n)[:num_samples]
    return noise


def colored_noise(num_samples: int, color: NoiseColor = "white", generator: torch.Generator | None = None) -> Tensor:
    """Gaussian noise (T,) with unit power whose spectrum falls as 1/f^0 (white), 1/f (pink)
    or 1/f² (brown). Pink and brown clips up to `NOISE_BANK` samples are cut at a random place
    from one long stretch made once (shaping each clip anew costs two FFTs)."""
    if color not in NOISE_COLORS:
        raise ValueError(f"noise color must be one of {NOISE_COLORS}, got {color!r}")
    if color == "white" or num_samples > NOISE_BANK:
        noise = _shaped_noise(num_samples, color, generator)
    else:
        start = int(torch.randint(NOISE_BANK - num_samples + 1, (), generator=generator))
        noise = _noise_bank(color)[start:start + num_samples]
        noise = noise - noise.mean()  # brown noise wanders: each clip about its own mean
    return noise / math.sqrt(max(power(noise), 1e-20))


def add_noise(wave: Tensor, snr_db: float, color: NoiseColor = "white", generator: torch.Generator | None = None,
              reference_power: float | None = None) -> Tensor:
    """``wave`` plus noise ``snr_db`` dB below ``reference_power`` (default: the wave's own power)."""
    check_number("snr_db", snr_db)
    signal = power(wave) if reference_power is None else reference_power
    scale = math.sqrt(signal / 10 ** (snr_db / 10))
    return wave + scale * colored_noise(wave.shape[0], color, generator).to(wave.dtype)


def pad_silence(wave: Tensor, sample_rate: int, before: float, after: float) -> Tensor:
    """Digital silence (zeros): ``before`` seconds ahead of ``wave``, ``after`` seconds behind it."""
    check_number("before", before, 0.0)  # a negative pad would cut the speech
    check_number("after", after, 0.0)
    return torch.nn.functional.pad(wave, (round(before * sample_rate), round(after * sample_rate)))


def change_speed(wave: Tensor, factor: float) -> Tensor:
    """Play ``wave`` ``factor`` times faster (Kaldi-style speed perturbation: resampling, so
    the pitch and the formants move with the tempo); ``factor`` is rounded to 0.01."""
    if not (math.isfinite(factor) and 50 <= round(factor * 100) <= 200):
        raise ValueError(f"speed factor must be in [0.5, 2], got {factor}")
    return resample(wave.float(), round(factor * 100), 100).to(wave.dtype)  # resample's kernel is float32


def reverberate(wave: Tensor, sample_rate: int, rt60: float, direct_ratio_db: float = 0.0,
                generator: torch.Generator | None = None, keep_tail: bool = True) -> Tensor:
    """``wave`` in a synthetic room: convolved with an impulse response of a direct path plus
    exponentially decaying noise that falls 60 dB in ``rt60`` seconds, the direct path
    ``direct_ratio_db`` dB above the reverberant tail's energy. With ``keep_tail`` the result is
    longer by ``rt60`` (else it stops where the input does); its power is the input's."""
    check_number("rt60", rt60, 0.0, low_open=True)
    n = max(2, round(rt60 * sample_rate))
    t = torch.arange(n, dtype=torch.float32) / sample_rate
    tail = torch.randn(n, generator=generator) * torch.exp(-3 * math.log(10) * t / rt60)  # 60 dB in rt60
    tail[0] = 0.0
    tail = tail * math.sqrt(10 ** (-direct_ratio_db / 10) / max(float(tail.pow(2).sum()), 1e-20))
    tail[0] = 1.0  # the direct path
    size = wave.shape[0] + n - 1
    fft = _fft_size(size)
    out = torch.fft.irfft(torch.fft.rfft(wave, n=fft) * torch.fft.rfft(tail.to(wave.dtype), n=fft), n=fft)
    out = out[:size if keep_tail else wave.shape[0]]
    return out * math.sqrt(power(wave) / max(power(out), 1e-20))


def telephone_band(wave: Tensor, sample_rate: int, mu_law: bool = True) -> Tensor:
    """``wave`` as a narrow-band telephone line carries it: down to 8 kHz and back (nothing above
    4 kHz survives), nothing below 300 Hz, and (``mu_law``) G.711's 8-bit μ-law quantisation."""
    import torchaudio

    F = torchaudio.functional
    narrow = resample(wave, sample_rate, TELEPHONE_RATE)
    n, fft = narrow.shape[0], _fft_size(narrow.shape[0])
    spectrum = torch.fft.rfft(narrow, n=fft)
    spectrum[: math.ceil(300 * fft / TELEPHONE_RATE)] = 0  # bins below 300 Hz
    narrow = torch.fft.irfft(spectrum, n=fft)[:n]
    if mu_law:
        peak = float(narrow.abs().max())
        if peak > 0:
            narrow = F.mu_law_decoding(F.mu_law_encoding(narrow / peak, 256), 256) * peak
    return resample(narrow, TELEPHONE_RATE, sample_rate).to(wave.dtype)


class WaveAugment:
    """Random acoustic conditions for training utterances (T,) at ``sample_rate``, each drawn with
    its own probability, in the order a recording meets them: the speaker's speed and a room
    (`speaker`), then silence around the speech, background noise, the telephone channel and
    loudness (`recording`). `no_speech` makes a clip with no speech at all (noise or silence)
    for the transcript "".

    `batch` serves a training batch: every utterance is padded with silence to the batch's
    longest (a random share before, the rest after), and with chance ``silence_p`` the whole
    batch is lengthened by two draws from ``silence`` — long silences at little cost, since
    the model reads the batch's padded length whatever fills it.

    Parameter-free and picklable; draws from ``generator`` or torch's global generator (seeded
    per data-loader worker by Lightning), like `tokenizers_mm.SpecAugment`. The default chances
    leave about half the utterances clean: on the built-in digits, stronger ones (noise 0.4 at
    8–30 dB, room 0.2, speed 0.3, telephone 0.15, silence 0.2) left the recipe's tiny Conformer
    at 12 % held-out CER after its 800 steps, against about 1 % with these.

    Args:
        speed_p / speeds: chance and range of the speed factor (resampling: tempo and pitch).
        warp_p / warps: chance and range of a vocal-tract-length perturbation (Jaitly & Hinton,
            2013): the frequency warp `draw_warp` gives the frames (`SpectrogramTokenizer.features`'s
            ``warp``): formants and harmonics ``warp`` times higher, the tempo kept. Off by default.
        reverb_p / rt60 / direct_ratio_db: chance of a room, its reverberation time (s) and
            direct-to-reverberant ratio (dB) ranges.
        silence_p / silence: chance of silence around one utterance (a batch: of lengthening
            it), and the range of seconds drawn for each side.
        noise_p / snr_db / noise_colors: chance of noise, its signal-to-noise ratio range (dB,
            against the speech before padding), and the colours drawn from.
        telephone_p: chance of the telephone channel (`telephone_band`).
        gain_db: range of the loudness change (dB).
        no_speech_p: the chance that a training item is replaced by a `no_speech` clip (the data
            pipeline asks `draw_no_speech`). no_speech_seconds / no_speech_silence_p: such a clip's
            duration range (when none is asked for), and the chance that it is digital silence
            rather than noise.
    """

    def __init__(
        self,
        speed_p: float = 0.2,
        speeds: tuple[float, float] = (0.9, 1.1),
        warp_p: float = 0.0,
        warps: tuple[float, float] = (0.9, 1.1),
        reverb_p: float = 0.1,
        rt60: tuple[float, float] = (0.1, 0.5),
        direct_ratio_db: tuple[float, float] = (0.0, 10.0),
        silence_p: float = 0.1,
        silence: tuple[float, float] = (0.0, 2.0),
        noise_p: float = 0.3,
        snr_db: tuple[float, float] = (10.0, 30.0),
        noise_colors: Sequence[NoiseColor] = NOISE_COLORS,
        telephone_p: float = 0.1,
        gain_db: tuple[float, float] = (-30.0, 0.0),
        no_speech_p: float = 0.03,
        no_speech_seconds: tuple[float, float] = (0.5, 3.0),
        no_speech_silence_p: float = 0.2,
    ) -> None:
        for name, p in (("speed_p", speed_p), ("warp_p", warp_p), ("reverb_p", reverb_p), ("silence_p", silence_p),
                        ("noise_p", noise_p), ("telephone_p", telephone_p), ("no_speech_p", no_speech_p),
                        ("no_speech_silence_p", no_speech_silence_p)):
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"{name} must be a probability in [0, 1], got {p}")
        for name, (low, high), lowest, highest in (
                ("speeds", speeds, 0.5, 2.0), ("warps", warps, *WARPS), ("rt60", rt60, 0.01, 5.0), ("silence", silence, 0.0, 60.0),
                ("no_speech_seconds", no_speech_seconds, 0.05, 60.0), ("snr_db", snr_db, -20.0, 100.0),
                ("direct_ratio_db", direct_ratio_db, -30.0, 60.0), ("gain_db", gain_db, -80.0, 20.0)):
            if not lowest <= low <= high <= highest:
                raise ValueError(f"{name} must be a range (low, high) within [{lowest:g}, {highest:g}], "
                                 f"got {(low, high)}")
        unknown = [c for c in noise_colors if c not in NOISE_COLORS]
        if unknown or not noise_colors:
            raise ValueError(f"noise_colors must be some of {NOISE_COLORS}, got {list(noise_colors)}")
        self.speed_p, self.speeds = speed_p, (float(speeds[0]), float(speeds[1]))
        self.warp_p, self.warps = warp_p, (float(warps[0]), float(warps[1]))
        self.reverb_p, self.rt60 = reverb_p, (float(rt60[0]), float(rt60[1]))
        self.direct_ratio_db = (float(direct_ratio_db[0]), float(direct_ratio_db[1]))
        self.silence_p, self.silence = silence_p, (float(silence[0]), float(silence[1]))
        self.noise_p, self.snr_db = noise_p, (float(snr_db[0]), float(snr_db[1]))
        self.noise_colors = tuple(noise_colors)
        self.telephone_p = telephone_p
        self.gain_db = (float(gain_db[0]), float(gain_db[1]))
        self.no_speech_p = no_speech_p
        self.no_speech_seconds = (float(no_speech_seconds[0]), float(no_speech_seconds[1]))
        self.no_speech_silence_p = no_speech_silence_p

    def __repr__(self) -> str:
        return (f"WaveAugment(speed_p={self.speed_p}, speeds={self.speeds}, warp_p={self.warp_p}, "
                f"warps={self.warps}, reverb_p={self.reverb_p}, "
                f"rt60={self.rt60}, silence_p={self.silence_p}, silence={self.silence}, noise_p={self.noise_p}, "
                f"snr_db={self.snr_db}, telephone_p={self.telephone_p}, gain_db={self.gain_db}, "
                f"no_speech_p={self.no_speech_p})")

    def _color(self, generator: torch.Generator | None) -> NoiseColor:
        return self.noise_colors[int(torch.randint(len(self.noise_colors), (), generator=generator))]

    def __call__(self, wave: Tensor, sample_rate: int, generator: torch.Generator | None = None) -> Tensor:
        """One utterance (T,) -> the same speech under random conditions (T', longer or shorter)."""
        return self.recording(self.speaker(wave, sample_rate, generator), sample_rate, generator=generator)

    def speaker(self, wave: Tensor, sample_rate: int, generator: torch.Generator | None = None) -> Tensor:
        """What reaches the microphone: the utterance at another speed, maybe in a room."""
        if wave.dim() != 1:
            raise ValueError(f"WaveAugment takes one mono waveform (samples,), got shape {tuple(wave.shape)}")
        if _chance(self.speed_p, generator):
            wave = change_speed(wave, _uniform(*self.speeds, generator))
        if _chance(self.reverb_p, generator):  # the tail past the utterance's end is cut: no longer batches
            wave = reverberate(wave, sample_rate, _uniform(*self.rt60, generator),
                               _uniform(*self.direct_ratio_db, generator), generator, keep_tail=False)
        return wave

    def recording(self, wave: Tensor, sample_rate: int, length: int | None = None,
                  generator: torch.Generator | None = None) -> Tensor:
        """What is recorded: silence around the speech (to ``length`` samples, a random share
        before; without ``length``, with chance ``silence_p``, a draw from ``silence`` on each
        side), background noise, the telephone channel, loudness."""
        speech_power = power(wave)
        if length is not None:
            if length < wave.shape[0]:
                raise ValueError(f"cannot pad {wave.shape[0]} samples to {length}")
            before = int(torch.randint(length - wave.shape[0] + 1, (), generator=generator))
            wave = torch.nn.functional.pad(wave, (before, length - wave.shape[0] - before))
        elif _chance(self.silence_p, generator):
            wave = pad_silence(wave, sample_rate, _uniform(*self.silence, generator), _uniform(*self.silence, generator))
        if _chance(self.noise_p, generator):
            wave = add_noise(wave, _uniform(*self.snr_db, generator), self._color(generator), generator,
                             reference_power=speech_power)
        if _chance(self.telephone_p, generator):
            wave = telephone_band(wave, sample_rate)
        return wave * 10 ** (_uniform(*self.gain_db, generator) / 20)

    def batch(self, waves: Sequence[Tensor], sample_rate: int, generator: torch.Generator | None = None) -> list[Tensor]:
        """Utterances as `speaker` left them -> recordings of one common length: the longest,
        lengthened (chance ``silence_p``) by two draws from ``silence``; each utterance sits at
        a random place in it. (The telephone channel's trip to 8 kHz and back may leave a
        recording a few samples longer; `collate_speech` pads the batch after.)"""
        length = max(w.shape[0] for w in waves)
        if _chance(self.silence_p, generator):
            length += round((_uniform(*self.silence, generator) + _uniform(*self.silence, generator)) * sample_rate)
        return [self.recording(w, sample_rate, length, generator) for w in waves]

    def draw_warp(self, generator: torch.Generator | None = None) -> float:
        """A vocal-tract-length warp for one training utterance's frames: a draw from ``warps``
        with chance ``warp_p``, else 1.0 (none)."""
        return _uniform(*self.warps, generator) if _chance(self.warp_p, generator) else 1.0

    def draw_no_speech(self, generator: torch.Generator | None = None) -> bool:
        """Whether this training item becomes a `no_speech` clip (chance ``no_speech_p``)."""
        return _chance(self.no_speech_p, generator)

    def no_speech(self, sample_rate: int, generator: torch.Generator | None = None,
                  seconds: float | None = None) -> Tensor:
        """A clip (T,) with no speech: digital silence, or noise of a random colour (at -20 dB
        full scale; `recording` then sets the loudness), ``seconds`` long (default: a draw from
        ``no_speech_seconds``; a data pipeline gives the length of the utterance it replaces, so
        the clip does not lengthen its batch)."""
        if seconds is None:
            seconds = _uniform(*self.no_speech_seconds, generator)
        n = max(1, round(seconds * sample_rate))
        if _chance(self.no_speech_silence_p, generator):
            return torch.zeros(n)
        return 0.1 * colored_noise(n, self._color(generator), generator)
