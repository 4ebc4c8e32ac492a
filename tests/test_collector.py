"""The pytest process's collector (harness/speed/gc_pause.py): paused from the plugin's
configure to the run loop, then what is alive is frozen and collections resume."""

import gc

import pytest

from harness.speed import gc_pause as collector


@pytest.fixture
def restore_gc():
    enabled = gc.isenabled()
    yield
    gc.unfreeze()
    (gc.enable if enabled else gc.disable)()


def test_pause_then_settle_freezes_what_is_alive(restore_gc):
    gc.enable()
    collector.pause()
    assert not gc.isenabled()
    collector.pause()  # a second pause (xdist worker, inline pytest) changes nothing
    kept = [[] for _ in range(1000)]  # tracked by the collector
    frozen = gc.get_freeze_count()
    collector.settle()
    assert gc.isenabled() and gc.get_freeze_count() >= frozen + len(kept)
    collector.settle()  # without a pause: nothing (no second freeze)
    assert gc.isenabled()


def test_settle_keeps_a_disabled_collector_disabled(restore_gc):
    gc.disable()
    collector.pause()
    collector.settle()
    assert not gc.isenabled()  # as the caller had it
