"""Audio -> log-mel spectrogram frames (the "tokens" of speech models), and SpecAugment.

Waveforms (tensors, numpy arrays, with their sample rate) or audio files (read with soundfile)
are resampled to the configured rate, turned into log-mel frames with torchaudio (25 ms windows
every 10 ms by default) and normalised per utterance, over the utterance's speech frames, or with
global statistics. SpecAugment (frequency and time masks) is a separate, training-only transform
that data pipelines apply to the frames.

Axis legend: B batch, T samples, C channels, N frames, F mel bins.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor

from tokenizers_mm.tokens import Tokens, collate

Normalize = Literal["utterance", "speech", "global", "none"]
NORMALIZES = ("utterance", "speech", "global", "none")
NORMALIZE_EPS = 1e-5  # keeps silent (constant) mel bins finite under per-utterance normalisation
DB = math.log(10) / 10  # one decibel of power in natural-log units (log-mel values are natural logs)
# Vocal-tract-length perturbation's bend (Jaitly & Hinton, 2013): frequencies scale by the warp up to
# F_hi = 4.8 kHz at 16 kHz audio (0.6 of the Nyquist frequency, times min(warp, 1) / warp), then
# follow a straight line that keeps the Nyquist frequency where it is.
VTLP_BOUNDARY = 0.6
WARPS = (0.5, 2.0)  # the warp factors accepted


# the file types read as audio (soundfile's common formats)
AUDIO_SUFFIXES = (".wav", ".flac", ".ogg", ".mp3", ".aiff", ".aif", ".opus")


@dataclass(frozen=True)
class SpectrogramConfig:
    """How waveforms become log-mel frames; stored with a model so inference matches training.

    Every field is plain JSON (``to_dict`` / ``from_dict``), so the config travels inside a
    model's config file.

    Args:
        sample_rate: the rate the frames are computed at (Hz).
        n_mels: F, mel bins per frame. win_ms / hop_ms: window length and frame step.
        n_fft: FFT size; None: the next power of two ≥ the window (400 samples -> 512).
        f_min / f_max: the mel filterbank's range in Hz (f_max None: half the sample rate).
        log_offset: added to the mel power before the log, so silence stays finite.
        trim_db / trim_margin_ms: None, or drop the leading and trailing frames more than
            ``trim_db`` below the loudest frame's energy (silence before and after the speech),
            keeping ``trim_margin_ms`` of them on each side — the margin the training audio has.
        floor_db: None, or raise every log-mel value to at most this many dB below the
            utterance's loudest, before normalising: digital silence, a faint noise floor and the
            empty band above 4 kHz of telephone audio all read the same (Whisper's 80 dB clamp).
        normalize: "utterance" (each mel bin to zero mean, unit variance over the utterance),
            "speech" (the same, with the statistics taken over the utterance's speech frames only:
            those within ``speech_db`` of its loudest frame, so padding it with silence changes
            nothing), "global" (with ``global_mean`` / ``global_std``, one value per mel bin) or
            "none".
        speech_db: for normalize="speech", how far below the loudest frame's energy (dB) a frame
            still counts as speech.
        resample: resample audio at another rate to ``sample_rate``; False makes that an error.
        downmix: average the channels of multi-channel audio; False makes it an error.
    """

    sample_rate: int = 16000
    n_mels: int = 80
    win_ms: float = 25.0
    hop_ms: float = 10.0
    n_fft: int | None = None
    f_min: float = 0.0
    f_max: float | None = None
    log_offset: float = 1e-6
    trim_db: float | None = None
    trim_margin_ms: float = 100.0
    floor_db: float | None = None
    normalize: Normalize = "utterance"
    speech_db: float = 40.0
    global_mean: tuple[float, ...] | None = None
    global_std: tuple[float, ...] | None = None
    resample: bool = True
    downmix: bool = False

    def __post_init__(self) -> None:
        for name in ("global_mean", "global_std"):  # JSON has no tuples
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, tuple(float(v) for v in value))
        if self.sample_rate < 1000:
            raise ValueError(f"sample_rate must be ≥ 1000 Hz, got {self.sample_rate}")
        if self.n_mels < 1:
            raise ValueError(f"n_mels must be ≥ 1, got {self.n_mels}")
        if not 0 < self.hop_ms <= self.win_ms:
            raise ValueError(f"need 0 < hop_ms ≤ win_ms, got hop_ms={self.hop_ms}, win_ms={self.win_ms}")
        if self.hop_length < 1:  # a window or hop that rounds to no sample
            raise ValueError(f"hop_ms={self.hop_ms} is less than one sample at {self.sample_rate} Hz")
        if self.n_fft is not None and self.n_fft < self.win_length:
            raise ValueError(f"n_fft={self.n_fft} is shorter than the window ({self.win_length} samples)")
        nyquist = self.sample_rate / 2
        f_max = nyquist if self.f_max is None else self.f_max
        if not 0.0 <= self.f_min < f_max <= nyquist:
            raise ValueError(f"need 0 ≤ f_min < f_max ≤ {nyquist:g} Hz (half the sample rate), "
                             f"got f_min={self.f_min}, f_max={self.f_max}")
        if self.log_offset <= 0:
            raise ValueError(f"log_offset must be positive, got {self.log_offset}")
        if self.normalize not in NORMALIZES:
            raise ValueError(f"normalize must be one of {', '.join(map(repr, NORMALIZES))}, got {self.normalize!r}")
        if self.trim_db is not None and not self.trim_db > 0:
            raise ValueError(f"trim_db must be positive (dB below the loudest frame) or None, got {self.trim_db}")
        if not self.trim_margin_ms >= 0:
            raise ValueError(f"trim_margin_ms must be ≥ 0, got {self.trim_margin_ms}")
        if self.floor_db is not None and not self.floor_db > 0:
            raise ValueError(f"floor_db must be positive (dB below the loudest value) or None, got {self.floor_db}")
        if not self.speech_db > 0:
            raise ValueError(f"speech_db must be positive (dB below the loudest frame), got {self.speech_db}")
        if self.normalize == "global":
            if self.global_mean is None or self.global_std is None:
                raise ValueError("normalize='global' needs global_mean and global_std (one value per mel bin); "
                                 "compute them with SpectrogramTokenizer.global_stats(training audio)")
            if len(self.global_mean) != self.n_mels or len(self.global_std) != self.n_mels:
                raise ValueError(f"global_mean / global_std need {self.n_mels} values (one per mel bin), "
                                 f"got {len(self.global_mean)} and {len(self.global_std)}")
            if any(not s > 0 for s in self.global_std):
                raise ValueError("global_std values must be positive")

    @property
    def win_length(self) -> int:
        """Window length in samples."""
        return round(self.sample_rate * self.win_ms / 1000)

    @property
    def hop_length(self) -> int:
        """Frame step in samples."""
        return round(self.sample_rate * self.hop_ms / 1000)

    @property
    def fft_size(self) -> int:
        return self.n_fft if self.n_fft is not None else 1 << (self.win_length - 1).bit_length()

    def num_frames(self, num_samples: int) -> int:
        """Frames computed from ``num_samples`` samples (centred windows: 1 + T // hop)."""
        return 1 + num_samples // self.hop_length

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SpectrogramConfig:
        """Build from a plain dict (a JSON file's); unknown keys are an error."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown SpectrogramConfig key(s) {unknown}; known keys: {', '.join(sorted(known))}")
        return cls(**data)

    @classmethod
    def stored(cls, settings: dict[str, Any], n_mels: int) -> dict[str, Any]:
        """What a model's config keeps of ``settings`` (fields given in part) for a model reading
        ``n_mels`` bins: every field, as `to_dict` gives them (tuples, not JSON's lists, so a config
        equals itself read back from a checkpoint); empty stays empty (the defaults). Settings of
        another ``n_mels`` are refused: the model could not read their frames."""
        settings = dict(settings)
        if settings.get("n_mels", n_mels) != n_mels:
            raise ValueError(f"spectrogram n_mels={settings['n_mels']} differs from n_mels={n_mels}")
        return cls.from_dict({"n_mels": n_mels, **settings}).to_dict() if settings else {}

    @classmethod
    def for_model(cls, settings: dict[str, Any], n_mels: int) -> SpectrogramConfig:
        """The frames a model reading ``n_mels`` bins is fed: its stored ``settings``, else the
        defaults at ``n_mels`` (not the default 80 bins)."""
        return cls.from_dict(settings or {"n_mels": n_mels})


class SpectrogramTokenizer:
    """Audio (file paths, 1-D / (1, T) tensors or arrays, or a list of them) -> log-mel `Tokens`.

    Parameter-free and picklable (the torchaudio transforms are built lazily in each process),
    so it runs in data-loader workers. A 2-D input is (channels, samples); batch several
    utterances by passing a list. Float input is taken as is; int16 / int32 PCM is scaled to
    [-1, 1].
    """

    def __init__(self, config: SpectrogramConfig | None = None, **options: Any) -> None:
        if config is not None and options:
            raise ValueError("give either a SpectrogramConfig or keyword options, not both")
        self.config = config if config is not None else SpectrogramConfig(**options)
        self._mel: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {"config": self.config}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.config, self._mel = state["config"], None

    @property
    def n_mels(self) -> int:
        return self.config.n_mels

    # ------------------------------------------------------------------ waveforms
    def load(self, audio: Any, sample_rate: int | None = None) -> Tensor:
        """One utterance -> a float32 mono waveform (T,) at ``config.sample_rate``.

        ``sample_rate`` is the rate of a tensor / array, and required for one: a bare waveform
        says nothing about its rate, and none is assumed. Files carry their own (a
        ``sample_rate`` given with a file is ignored).
        """
        name = "audio"
        kind = {np.ndarray: "numpy array", Tensor: "tensor"}.get(type(audio), type(audio).__name__)
        if isinstance(audio, (str, Path)):
            name = str(audio)
            audio, sample_rate = read_audio(audio)  # (C, T)
        elif isinstance(audio, np.ndarray):
            audio = torch.from_numpy(np.ascontiguousarray(audio))
        if not isinstance(audio, Tensor):
            raise TypeError(f"unsupported audio type {kind}; give a file path, a tensor or an array (with its "
                            "sample_rate)")
        if sample_rate is None:
            raise ValueError(
                f"a bare waveform ({kind} of shape {tuple(audio.shape)}) needs its sample rate: pass "
                f"sample_rate= in Hz (e.g. sample_rate=16000); frames are computed at {self.config.sample_rate} Hz "
                "and other rates are resampled, but no rate is assumed")
        if (isinstance(sample_rate, bool) or not isinstance(sample_rate, (int, float, np.integer, np.floating))
                or not float(sample_rate).is_integer() or not 1000 <= sample_rate <= 384_000):
            raise ValueError(f"sample_rate must be a whole number of Hz between 1000 and 384000, got {sample_rate!r}")
        rate = int(sample_rate)
        wave = _to_float(audio, name)
        if wave.dim() == 2:
            if wave.shape[0] != 1:
                if not self.config.downmix:
                    raise ValueError(
                        f"{name} has {wave.shape[0]} channels (shape (channels, samples) = {tuple(wave.shape)}) "
                        "but the tokenizer expects mono: downmix it with waveform.mean(dim=0) (for a "
                        "(samples, channels) array, .mean(axis=1)), or set downmix=True")
                wave = wave.mean(dim=0, keepdim=True)
            wave = wave[0]
        elif wave.dim() != 1:
            raise ValueError(f"{name} must be (samples,) or (channels, samples), got shape {tuple(wave.shape)}; "
                             "pass a list to encode several utterances")
        if wave.numel() == 0:
            raise ValueError(f"{name} is empty (0 samples)")
        if not bool(torch.isfinite(wave).all()):
            raise ValueError(f"{name} contains {int((~torch.isfinite(wave)).sum())} NaN/inf samples")
        if rate != self.config.sample_rate:
            if not self.config.resample:
                raise ValueError(f"{name} is at {rate} Hz but the tokenizer expects {self.config.sample_rate} Hz; "
                                 f"resample it to {self.config.sample_rate} Hz or set resample=True")
            wave = resample(wave, rate, self.config.sample_rate)
        # the STFT reflects fft_size // 2 samples at each end, which needs that many and one more
        shortest = max(self.config.win_length, self.config.fft_size // 2 + 1)
        if wave.numel() < shortest:
            raise ValueError(f"{name} has {wave.numel()} samples at {self.config.sample_rate} Hz, fewer than the "
                             f"{shortest} one {self.config.win_ms:g} ms window of a {self.config.fft_size}-point FFT needs")
        return wave

    # ------------------------------------------------------------------ frames
    def log_mel(self, wave: Tensor, warp: float = 1.0) -> Tensor:
        """A mono waveform (T,) at the configured rate -> un-normalised log-mel frames (N, F).

        ``warp`` ≠ 1 reads the spectrum through a filterbank whose frequencies are warped
        (`warped_mel_filterbank`): the same speech from a vocal tract 1/``warp`` as long, its
        formants and harmonics ``warp`` times higher, its timing unchanged (training only)."""
        check_warp(warp)
        if self._mel is None:
            import torchaudio

            c = self.config
            self._mel = torchaudio.transforms.MelSpectrogram(
                sample_rate=c.sample_rate, n_fft=c.fft_size, win_length=c.win_length, hop_length=c.hop_length,
                f_min=c.f_min, f_max=c.f_max, n_mels=c.n_mels, power=2.0, center=True, pad_mode="reflect")
        with torch.no_grad():
            if warp == 1.0:
                mel = self._mel(wave.float())  # (F, N)
            else:
                spectrum = self._mel.spectrogram(wave.float())  # (K, N) power of the FFT bins
                mel = warped_mel_filterbank(self.config, warp).T @ spectrum  # (F, N)
        return torch.log(mel + self.config.log_offset).T.contiguous()

    def trim(self, frames: Tensor) -> Tensor:
        """One utterance's (N, F) log-mel frames without the silence before and after its speech
        (frames more than ``trim_db`` below the loudest), less a margin of ``trim_margin_ms``
        (unchanged when ``trim_db`` is None)."""
        c = self.config
        if c.trim_db is None:
            return frames
        speech = speech_frames(frames, c.trim_db).nonzero()[:, 0]
        margin = round(c.trim_margin_ms / c.hop_ms)
        return frames[max(0, int(speech[0]) - margin): int(speech[-1]) + 1 + margin]

    def floor(self, frames: Tensor) -> Tensor:
        """One utterance's (N, F) log-mel frames with no value more than ``floor_db`` below its
        loudest (unchanged when ``floor_db`` is None)."""
        if self.config.floor_db is None:
            return frames
        return frames.clamp_min(frames.max() - self.config.floor_db * DB)

    def normalize(self, frames: Tensor) -> Tensor:
        """Apply the configured floor and normalisation to one utterance's (N, F) log-mel frames."""
        c = self.config
        frames = self.floor(frames)
        if c.normalize in ("utterance", "speech"):
            stats = frames[speech_frames(frames, c.speech_db)] if c.normalize == "speech" else frames
            mean = stats.mean(dim=0, keepdim=True)
            std = stats.std(dim=0, keepdim=True, unbiased=False) if stats.shape[0] > 1 else torch.ones_like(mean)
            frames = (frames - mean) / (std + NORMALIZE_EPS)
        elif c.normalize == "global":
            frames = (frames - torch.tensor(c.global_mean)) / torch.tensor(c.global_std)
        return frames

    def features(self, audio: Any, sample_rate: int | None = None, warp: float = 1.0) -> Tensor:
        """One utterance (a file, or a waveform with its ``sample_rate``) -> normalised log-mel
        frames (N, F), N = 1 + T // hop (fewer when ``trim_db`` trims silence); ``warp``: a
        vocal-tract-length perturbation for training (`log_mel`), 1.0 for none."""
        check_warp(warp)
        frames = self.normalize(self.trim(self.log_mel(self.load(audio, sample_rate), warp)))
        if not bool(torch.isfinite(frames).all()):
            raise ValueError(f"the spectrogram has {int((~torch.isfinite(frames)).sum())} NaN/inf values; "
                             "check the audio and the normalisation statistics")
        return frames

    def encode(self, audio: Any, sample_rate: int | None = None) -> Tokens:
        """One utterance or a list (files, or waveforms all at ``sample_rate``) -> `Tokens` with
        (B, N, F) features padded with 0 and the attention mask (its row sums are the
        utterances' frame counts)."""
        items = list(audio) if isinstance(audio, (list, tuple)) else [audio]
        if not items:
            raise ValueError("got an empty list of audio")
        return collate([self.features(item, sample_rate) for item in items], modality="audio")

    def __call__(self, audio: Any, sample_rate: int | None = None) -> Tokens:
        return self.encode(audio, sample_rate)

    def global_stats(self, audio: Iterable[Any], sample_rate: int | None = None) -> tuple[tuple[float, ...],
                                                                                         tuple[float, ...]]:
        """Per-mel-bin mean and std of the log-mel frames over a corpus (for normalize="global")."""
        total, total_sq, count = torch.zeros(self.n_mels, dtype=torch.float64), torch.zeros(
            self.n_mels, dtype=torch.float64), 0
        for item in audio:
            frames = self.floor(self.trim(self.log_mel(self.load(item, sample_rate)))).double()
            total += frames.sum(dim=0)
            total_sq += (frames**2).sum(dim=0)
            count += frames.shape[0]
        if count == 0:
            raise ValueError("global_stats needs at least one utterance")
        mean = total / count
        std = (total_sq / count - mean**2).clamp_min(0).sqrt().clamp_min(NORMALIZE_EPS)
        return tuple(mean.tolist()), tuple(std.tolist())


def speech_frames(frames: Tensor, within_db: float) -> Tensor:
    """Which of one utterance's (N, F) log-mel frames are speech -> (N,) bool: those whose energy
    (summed over the mel bins) is within ``within_db`` of the loudest frame's. Silence, pauses
    and a faint background fall below; the loudest frame is always speech."""
    energy = torch.logsumexp(frames, dim=1)  # (N,) log of each frame's mel power
    return energy >= energy.max() - within_db * DB


def check_warp(warp: float) -> None:
    """Refuse a vocal-tract-length warp factor outside `WARPS`."""
    if isinstance(warp, bool) or not isinstance(warp, (int, float)) or not WARPS[0] <= warp <= WARPS[1]:
        raise ValueError(f"warp must be a factor in [{WARPS[0]:g}, {WARPS[1]:g}] (1.0: no warp), got {warp!r}")


def warp_frequencies(freqs: Tensor, warp: float, sample_rate: int) -> Tensor:
    """Vocal-tract-length perturbation's piecewise-linear frequency map (Jaitly & Hinton, 2013):
    f -> warp · f up to a boundary (`VTLP_BOUNDARY`), then a straight line to the Nyquist
    frequency, which stays where it is."""
    nyquist = sample_rate / 2
    boundary = VTLP_BOUNDARY * nyquist * min(warp, 1.0) / warp
    bent = nyquist - (nyquist - warp * boundary) / (nyquist - boundary) * (nyquist - freqs)
    return torch.where(freqs <= boundary, warp * freqs, bent)


def _hz_to_mel(hz: float) -> float:
    return 2595.0 * math.log10(1.0 + hz / 700.0)  # the HTK mel scale, torchaudio's default


@functools.lru_cache(maxsize=128)
def warped_mel_filterbank(config: SpectrogramConfig, warp: float) -> Tensor:
    """(K, F) triangular mel filters over the K = n_fft / 2 + 1 FFT bins, as torchaudio's
    MelSpectrogram builds them (HTK mel scale, peaks of 1, no area normalisation), each bin
    taken at its warped frequency (`warp_frequencies`): energy at f lands in the filter of
    warp(f). Warp 1.0 gives torchaudio's filterbank; built once per (config, warp)."""
    c = config
    f_max = c.sample_rate / 2 if c.f_max is None else c.f_max
    freqs = warp_frequencies(torch.linspace(0, c.sample_rate // 2, c.fft_size // 2 + 1), warp, c.sample_rate)
    mels = torch.linspace(_hz_to_mel(c.f_min), _hz_to_mel(f_max), c.n_mels + 2)
    peaks = 700.0 * (10 ** (mels / 2595.0) - 1.0)  # (F + 2,) the filters' edges and centres in Hz
    widths = peaks[1:] - peaks[:-1]
    slopes = peaks[None, :] - freqs[:, None]  # (K, F + 2)
    rising, falling = -slopes[:, :-2] / widths[:-1], slopes[:, 2:] / widths[1:]
    return torch.clamp_min(torch.minimum(rising, falling), 0.0)


@functools.lru_cache(maxsize=64)
def _resampler(orig_freq: int, new_freq: int) -> torch.nn.Module:
    """A torchaudio resampler, its windowed-sinc kernel built once per pair of rates."""
    import torchaudio

    return torchaudio.transforms.Resample(orig_freq, new_freq)


def resample(wave: Tensor, orig_freq: int, new_freq: int) -> Tensor:
    """``wave`` (T,) from ``orig_freq`` to ``new_freq`` samples a second (torchaudio's sinc filter)."""
    if orig_freq == new_freq:
        return wave
    with torch.no_grad():
        return _resampler(int(orig_freq), int(new_freq))(wave)


def read_audio(path: str | Path) -> tuple[Tensor, int]:
    """An audio file (anything libsndfile reads: wav, flac, ogg, …) -> (C, T) float32 and its rate."""
    import soundfile

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"audio file {path} does not exist")
    try:
        data, rate = soundfile.read(str(path), dtype="float32", always_2d=True)  # (T, C)
    except (RuntimeError, soundfile.LibsndfileError) as error:
        raise ValueError(f"cannot read audio file {path}: {error}") from error
    return torch.from_numpy(np.ascontiguousarray(data.T)), int(rate)


def _to_float(audio: Tensor, name: str) -> Tensor:
    if audio.dtype == torch.int16:
        return audio.float() / 32768.0
    if audio.dtype == torch.int32:
        return audio.float() / 2147483648.0
    if not audio.dtype.is_floating_point:
        raise TypeError(f"{name} must be float or int16/int32 PCM samples, got {audio.dtype}")
    return audio.float()


class SpecAugment:
    """SpecAugment's masks (Park et al., 2019) on one utterance's (N, F) frames: training only.

    ``freq_masks`` bands of up to ``freq_width`` mel bins and ``time_masks`` spans of up to
    ``time_width`` frames (and at most ``max_time_fraction`` of the utterance each) are set to
    ``mask_value`` — 0, the mean after normalisation. Parameter-free and picklable; draws from
    ``generator`` or torch's global generator (seeded per data-loader worker by Lightning).
    """

    def __init__(self, freq_masks: int = 2, freq_width: int = 15, time_masks: int = 2, time_width: int = 25,
                 max_time_fraction: float = 0.2, mask_value: float = 0.0) -> None:
        if min(freq_masks, freq_width, time_masks, time_width) < 0:
            raise ValueError(f"mask counts and widths must be ≥ 0, got freq {freq_masks}×{freq_width}, "
                             f"time {time_masks}×{time_width}")
        if not 0.0 <= max_time_fraction <= 1.0:
            raise ValueError(f"max_time_fraction must be in [0, 1], got {max_time_fraction}")
        self.freq_masks, self.freq_width = freq_masks, freq_width
        self.time_masks, self.time_width = time_masks, time_width
        self.max_time_fraction, self.mask_value = max_time_fraction, mask_value

    def __repr__(self) -> str:
        return (f"SpecAugment(freq_masks={self.freq_masks}, freq_width={self.freq_width}, "
                f"time_masks={self.time_masks}, time_width={self.time_width}, "
                f"max_time_fraction={self.max_time_fraction})")

    def __call__(self, frames: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """(N, F) -> a masked copy (N, F)."""
        if frames.dim() != 2:
            raise ValueError(f"SpecAugment takes one utterance's (frames, mel bins), got shape {tuple(frames.shape)}")
        out = frames.clone()
        N, F = out.shape
        for _ in range(self.freq_masks):
            start, width = _span(F, self.freq_width, generator)
            out[:, start:start + width] = self.mask_value
        longest = min(self.time_width, math.floor(self.max_time_fraction * N))
        for _ in range(self.time_masks):
            start, width = _span(N, longest, generator)
            out[start:start + width] = self.mask_value
        return out


def _span(size: int, max_width: int, generator: torch.Generator | None) -> tuple[int, int]:
    """A random (start, width) with width uniform in [0, min(max_width, size)]."""
    width = int(torch.randint(0, min(max_width, size) + 1, (), generator=generator))
    start = int(torch.randint(0, size - width + 1, (), generator=generator))
    return start, width
