"""bus/watch.py's stretch: work on the loop gives it back once it has run its stretch, not before."""

from __future__ import annotations

import pytest

from mesh_provisioner.bus import watch


def test_a_stretch_is_over_once_it_has_run_its_time_and_the_next_begins(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    monkeypatch.setattr(watch.time, "perf_counter", lambda: now[0])
    stretch = watch.Stretch()
    now[0] += watch.STRETCH / 2
    assert not stretch.over()
    now[0] += watch.STRETCH
    assert stretch.over()
    assert not stretch.over(), "the next stretch began when the last was over"
