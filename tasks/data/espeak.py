"""espeak-ng's synthesiser as a library: the shared object and voice data that the
``espeakng-loader`` wheel bundles, driven through `ctypes`. No executable, no system package.

The API is espeak-ng's ``speak_lib.h``: initialise for synchronous output, register a callback
that receives 16-bit samples, set voice and parameters, synthesise. The synthesiser keeps
state from one utterance to the next in function-level statics (pitch flutter phase, gain
control, echo buffer) that no call resets, so `speak` loads a fresh copy of the library for
every utterance and unloads it after: each utterance sounds as the ``espeak-ng`` command would
speak it in a new process, whatever was spoken before, in whatever order or thread.
"""

from __future__ import annotations

import _ctypes
import ctypes
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np

# speak_lib.h constants
_AUDIO_OUTPUT_SYNCHRONOUS = 2
_POS_CHARACTER = 1
_CHARS_UTF8 = 1
_RATE, _PITCH, _RANGE, _WORDGAP = 1, 3, 4, 7
_EE_OK = 0
_VOICE_HINT = ("a voice is '<language>+<variant>' with a language such as en (British), en-us, en-029, "
               "en-gb-scotland or en-gb-x-rp and a variant such as m3 or f2")

_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.c_void_p)
_lock = threading.Lock()  # the library's state is global: one utterance at a time per process
_libc = ctypes.CDLL(None)


def _paths() -> tuple[str, Path]:
    """The wheel's libespeak-ng and its espeak-ng-data folder."""
    try:
        import espeakng_loader
    except ImportError as error:  # a dependency of unitok: only a broken install lacks it
        raise RuntimeError("the built-in spoken digits need the espeakng-loader wheel (a dependency of "
                           "unitok): pip install espeakng-loader") from error
    return espeakng_loader.get_library_path(), Path(espeakng_loader.get_data_path())


def _load(library: str, data: Path) -> tuple[ctypes.CDLL, int]:
    """dlopen the library (fresh: the previous copy was closed), initialise it -> (lib, sample rate)."""
    lib = ctypes.CDLL(library)
    lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
    lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
    lib.espeak_SetParameter.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
    lib.espeak_SetSynthCallback.argtypes = [_CALLBACK]
    lib.espeak_SetSynthCallback.restype = None
    lib.espeak_Synth.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint, ctypes.c_int, ctypes.c_uint,
                                 ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p]
    lib.espeak_ng_SetRandSeed.argtypes = [ctypes.c_long]
    lib.espeak_ng_SetRandSeed.restype = None
    lib.espeak_Info.argtypes = [ctypes.c_void_p]
    lib.espeak_Info.restype = ctypes.c_char_p
    # The path is the folder that holds espeak-ng-data (the library appends the name).
    rate = lib.espeak_Initialize(_AUDIO_OUTPUT_SYNCHRONOUS, 0, str(data.parent).encode(), 0)
    if rate <= 0:
        _unload(lib)
        raise RuntimeError(f"libespeak-ng at {library} failed to initialise with data {data} (returned {rate})")
    return lib, int(rate)


def _unload(lib: ctypes.CDLL) -> None:
    lib.espeak_Terminate()
    _ctypes.dlclose(lib._handle)


def version() -> str:
    """The bundled espeak-ng's version ("1.52.0")."""
    with _lock:
        lib, _ = _load(*_paths())
        try:
            return lib.espeak_Info(None).decode()
        finally:
            _unload(lib)


def check_voices(voices: Sequence[str]) -> None:
    """Raise a ValueError naming every voice in ``voices`` that espeak-ng does not have."""
    with _lock:
        lib, _ = _load(*_paths())
        try:
            unknown = [v for v in voices if lib.espeak_SetVoiceByName(v.encode()) != _EE_OK]
        finally:
            _unload(lib)
    if unknown:
        raise ValueError(f"espeak-ng has no voice {', '.join(map(repr, unknown))}; {_VOICE_HINT}")


def speak(text: str, voice: str, rate: int = 175, pitch: int = 50, word_gap: int = 0,
          seed: int = 1, pitch_range: int | None = None) -> tuple[np.ndarray, int]:
    """Speak ``text`` -> (float32 mono waveform in [-1, 1], the engine's sample rate, 22050 Hz).

    ``rate`` in words per minute (80–450), ``pitch`` 0–99, ``word_gap`` extra pause between
    words in units of 10 ms; ``voice`` is "<language>+<variant>" as espeak-ng's ``-v``
    ("en-us+m3"); ``seed`` seeds the breath noise; ``pitch_range`` 0–100 is how far the
    intonation moves the pitch (0: monotone; None: the voice's own, 50 for most). The same call
    always gives the same samples.
    """
    if not text.strip():
        raise ValueError("espeak-ng needs non-empty text to speak")
    chunks: list[np.ndarray] = []

    def receive(samples, count: int, events) -> int:
        if count > 0:
            chunks.append(np.ctypeslib.as_array(samples, shape=(count,)).copy())
        return 0  # 0: go on synthesising

    callback = _CALLBACK(receive)  # kept alive until the library is unloaded
    with _lock:
        lib, sample_rate = _load(*_paths())
        try:
            lib.espeak_SetSynthCallback(callback)
            if lib.espeak_SetVoiceByName(voice.encode()) != _EE_OK:
                raise ValueError(f"espeak-ng has no voice {voice!r}; {_VOICE_HINT}")
            settings = [("rate", _RATE, rate), ("pitch", _PITCH, pitch), ("word_gap", _WORDGAP, word_gap)]
            if pitch_range is not None:
                settings.append(("pitch_range", _RANGE, pitch_range))
            for name, parameter, value in settings:
                if lib.espeak_SetParameter(parameter, int(value), 0) != _EE_OK:
                    raise ValueError(f"espeak-ng refused {name}={value}")
            # Breath noise draws from espeak-ng's generator and libc's rand(): seed both.
            lib.espeak_ng_SetRandSeed(seed)
            _libc.srand(seed)
            encoded = text.encode() + b"\0"
            status = lib.espeak_Synth(encoded, len(encoded), 0, _POS_CHARACTER, 0, _CHARS_UTF8, None, None)
            if status != _EE_OK:
                raise RuntimeError(f"espeak-ng failed to speak {text!r} with voice {voice!r} (status {status})")
        finally:
            _unload(lib)
    if not chunks:
        raise RuntimeError(f"espeak-ng produced no audio for {text!r} with voice {voice!r}")
    return np.concatenate(chunks).astype(np.float32) / 32768.0, sample_rate
