"""Streams and events: CUDA semantics under the emulator's synchronous execution."""

from __future__ import annotations

import time

import pytest
import torch


def test_streams_switch_and_restore() -> None:
    default = torch.neuron.current_stream()
    assert default == torch.neuron.default_stream() and default.stream_id == 0
    s = torch.neuron.Stream()
    assert s.stream_id != 0 and s.device == torch.device("neuron:0")
    with torch.neuron.stream(s):
        assert torch.neuron.current_stream() == s
        assert torch.accelerator.current_stream() == s
        y = torch.ones(4, device="neuron") * 2
    assert torch.neuron.current_stream() == default
    torch.neuron.current_stream().wait_stream(s)
    torch.neuron.wait_stream(s)
    assert s.query() and y.sum().item() == 8
    s.synchronize()


def test_events_time_and_order() -> None:
    start, end = torch.neuron.Event(enable_timing=True), torch.neuron.Event(enable_timing=True)
    start.record()
    time.sleep(0.02)
    end.record()
    end.synchronize()
    assert start.query() and end.query()
    assert 15 <= start.elapsed_time(end) < 2000
    e = torch.neuron.Event()
    e.record()
    torch.neuron.current_stream().wait_event(e)
    e.wait()


def test_elapsed_time_needs_recorded_timing_events() -> None:
    a, b = torch.neuron.Event(enable_timing=True), torch.neuron.Event(enable_timing=True)
    with pytest.raises((RuntimeError, ValueError), match="recorded"):
        a.elapsed_time(b)
    c, d = torch.neuron.Event(), torch.neuron.Event()
    c.record()
    d.record()
    with pytest.raises((RuntimeError, ValueError), match="enable_timing"):
        c.elapsed_time(d)


def test_streams_on_other_cores() -> None:
    s = torch.neuron.Stream(device=2)
    assert s.device_index == 2
    with torch.neuron.device(2), torch.neuron.stream(s):
        assert torch.neuron.current_stream() == s
    torch.neuron.synchronize(2)
    torch.accelerator.synchronize()
