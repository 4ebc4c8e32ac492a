"""The context_order layer: ranks of a later tier wait (bounded) for the registered ranks of
the tiers before them; the launcher registers only the run's first launches."""

from __future__ import annotations

import threading
import time

from harness.launch.context_order import ContextOrder
from harness.worker import context_gate


def _rank_env(order: ContextOrder, world: int, launch: str) -> dict:
    env = order.env(world, launch)
    assert context_gate.VAR in env
    return env


def test_a_later_tier_waits_for_the_ranks_before_it(tmp_path):
    order = ContextOrder(tmp_path / "gate", worlds=[2, 4, 8])
    big, mid, small = (_rank_env(order, w, n) for w, n in ((8, "L001"), (4, "L002"), (2, "L003")))
    assert context_gate.wait_turn(big, wait_s=5) < 0.1  # the largest world never waits
    done = []

    def rank(env, name):
        context_gate.wait_turn(env, wait_s=5)
        done.append((name, time.time()))
    waiters = [threading.Thread(target=rank, args=(mid, "mid")),
               threading.Thread(target=rank, args=(small, "small"))]
    for t in waiters:
        t.start()
    time.sleep(0.3)
    assert not done  # eight ranks of L001 have no context yet
    t_big = time.time()
    for r in range(8):
        context_gate.ready(r, big)
    deadline = time.time() + 5
    while not done and time.time() < deadline:  # (polled: a loaded CI host may be slow)
        time.sleep(0.02)
    time.sleep(0.1)
    assert [n for n, _ in done] == ["mid"]  # the 2-rank tier still waits for L002's ranks
    for r in range(4):
        context_gate.ready(r, mid)
    for t in waiters:
        t.join(5)
    assert [n for n, _ in done] == ["mid", "small"]
    assert all(t >= t_big for _, t in done)


def test_the_wait_is_bounded(tmp_path):
    order = ContextOrder(tmp_path / "gate", worlds=[2, 8])
    order.env(8, "L001")  # registered; its ranks never come
    t0 = time.time()
    waited = context_gate.wait_turn(_rank_env(order, 2, "L002"), wait_s=0.4)
    assert 0.35 <= waited and time.time() - t0 < 2.0


def test_only_the_first_launches_of_a_run_with_tiers_are_gated(tmp_path):
    assert ContextOrder(tmp_path / "a", worlds=[4]).env(4, "L001") == {}  # one tier
    order = ContextOrder(tmp_path / "b", worlds=[2, 4], window_s=0.2)
    assert order.env(4, "L001") and order.env(7, "L002") == {}  # a world it does not know
    time.sleep(0.3)
    assert order.env(2, "L003") == {}  # after the window: a later lane, a relaunch
    assert context_gate.wait_turn({}) == 0.0  # no gate: no wait


def test_launcher_gates_cuda_launches_only(tmp_path):
    from pathlib import Path

    from harness.launch.feed import FixedFeed
    from harness.launch.launcher import Launcher, Task
    from harness.spec.matrix import expand
    from harness.spec.scenario import load_scenario
    root = Path(__file__).resolve().parents[1]
    cases = expand(load_scenario(root / "scenarios" / "smoke.yaml"))
    case = next(c for c in cases if max(c.world_sizes) == 2)

    def launch_env(device, accelerations):
        ln = Launcher(tmp_path / device / accelerations, "reference", device,
                      env={"HARNESS_ACCELERATIONS": accelerations})
        ln.modules = {2: {"Linear"}, 8: {"Linear"}}  # what expect() records
        task = Task(f"{case.key}.train", case, "train", tmp_path / "ckpt")
        return ln._launch([task], 2, {}, FixedFeed([task]), True).env
    assert context_gate.VAR in launch_env("cuda", "context_order")
    assert context_gate.VAR not in launch_env("cuda", "none")
    assert context_gate.VAR not in launch_env("cpu", "context_order")
