"""Which rank's error a case names when its ranks fall out of step (worker/runner.py
root_cause): the rank that raised, not the ranks left waiting in a collective for it."""

from harness.worker.runner import root_cause

GLOO_WAIT = ("RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/"
             "unbound_buffer.cc:78] Timed out waiting 60000ms for recv operation to complete")
FSDP2 = ("AssertionError: When a parameter is unevenly sharded by FSDP (orig size=torch.Size"
         "([30, 48]), FSDP world size=4), fsdp_pre_all_gather must return all-gather inputs "
         "with the padded sharded size torch.Size([8, 48]) but got [torch.Size([6, 48])]")


def test_the_rank_that_raised_is_named_not_the_ranks_that_waited():
    """The QA probe's 30-row Linear on dp4 (current scaling): rank 3 asserted at once, ranks
    0-2 timed out in the all-gather 60 s later -- and the case had named rank 0's timeout."""
    failed = [(0, GLOO_WAIT), (1, GLOO_WAIT), (2, GLOO_WAIT), (3, FSDP2)]
    assert root_cause(failed) == (3, FSDP2)
    assert root_cause([(1, "RuntimeError: Connection closed by peer"), (2, "ValueError: x")]) \
        == (2, "ValueError: x")


def test_only_waits_or_only_own_errors_name_the_first_rank():
    assert root_cause([(0, GLOO_WAIT), (2, GLOO_WAIT)]) == (0, GLOO_WAIT)
    assert root_cause([(0, "RuntimeError: injected fault: rank 0 raises"), (1, GLOO_WAIT)]) \
        == (0, "RuntimeError: injected fault: rank 0 raises")
    assert root_cause([(1, "KeyError: 'a'"), (3, "KeyError: 'b'")]) == (1, "KeyError: 'a'")
