"""Freed CPU memory kept for reuse (`unitok.cpu_memory`): a buffer allocated again, as each
training step allocates its logits again, finds the freed pages instead of faulting fresh ones in."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from unitok import cpu_memory
from unitok.cpu_memory import OPT_OUT_ENV, keep_freed_memory, keep_freed_memory_unless_opted_out

BUFFER_PAGES = 16 * 1024  # a 64 MiB float buffer in 4 KiB pages: above glibc's 32 MiB mmap threshold

# Runs in a fresh interpreter: the allocator setting is for the whole process.
FAULTS_OF_A_REUSED_BUFFER = f"""
import resource, sys
import torch
from unitok.cpu_memory import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory()

def faults_of_one_buffer():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    x = torch.empty({BUFFER_PAGES} * 1024)  # 4-byte floats: 4 KiB a 1024
    x.fill_(1.0)  # touch every page
    del x
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

# The first rounds grow the heap until the buffer fits between Python's small objects; the
# last rounds are the steady state a training loop runs in.
print(sum([faults_of_one_buffer() for _ in range(8)][4:]))
"""


def faults_of_a_reused_buffer(choice: str) -> int:
    out = subprocess.run([sys.executable, "-c", FAULTS_OF_A_REUSED_BUFFER, choice], check=True,
                         capture_output=True, text=True, timeout=120)
    return int(out.stdout.split()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator: Linux only (CI runs Linux)")
def test_a_buffer_freed_and_allocated_again_costs_no_page_faults():
    kept = faults_of_a_reused_buffer("keep")
    default = faults_of_a_reused_buffer("default")
    assert kept < BUFFER_PAGES // 100, f"{kept} page faults for 4 rounds of a buffer of {BUFFER_PAGES} pages"
    # glibc as it is unmaps the freed buffer, so the second one faults its pages in again
    # (fewer with transparent huge pages, still more than none)
    assert default > kept


def test_the_unitok_command_keeps_freed_memory_unless_opted_out(monkeypatch):
    calls = []
    monkeypatch.setattr(cpu_memory, "keep_freed_memory", lambda: calls.append(1) or True)
    monkeypatch.delenv(OPT_OUT_ENV, raising=False)
    assert keep_freed_memory_unless_opted_out() and calls == [1]
    monkeypatch.setenv(OPT_OUT_ENV, "default")
    assert not keep_freed_memory_unless_opted_out() and calls == [1]


def test_a_bad_setting_is_a_clear_error(monkeypatch):
    monkeypatch.setenv(OPT_OUT_ENV, "off")
    with pytest.raises(ValueError, match=r"UNITOK_MALLOC='off'.*'keep'.*'default'"):
        keep_freed_memory_unless_opted_out()
    with pytest.raises(ValueError, match=r"trim_threshold.*got -1"):
        keep_freed_memory(trim_threshold=-1)


@pytest.mark.parametrize("threshold", [True, 2.5e6, float("nan"), "1024", 0, 2**31])
def test_a_trim_threshold_that_is_not_a_whole_number_of_bytes_in_range_is_refused_by_name(threshold):
    # True was taken as a 1-byte threshold; a float failed inside ctypes without naming the argument
    with pytest.raises(ValueError, match=rf"trim_threshold must be .*, got {re.escape(repr(threshold))}"):
        keep_freed_memory(trim_threshold=threshold)


def test_the_cli_reads_the_setting_before_anything_else(monkeypatch):
    from tasks.cli import main

    monkeypatch.setenv(OPT_OUT_ENV, "bogus")
    with pytest.raises(ValueError, match="UNITOK_MALLOC='bogus'"):
        main(["fit", "--config", "configs/gpt/tiny.yaml", "--print_config"])
