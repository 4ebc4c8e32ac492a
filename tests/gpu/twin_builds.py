"""Run by tests/gpu/test_te_fresh_amax_cuda.py in a process of its own (a one-rank gloo group):
the one-rank twin of a TE DelayedScaling case built and trained after the CUDA generator was put
in different states; prints one JSON line per build."""

import json
import sys

import torch
import torch.distributed as dist

from harness import backends
from harness.distributed.single import single_rank_run, twin_mesh
from harness.spec.matrix import expand
from harness.spec.scenario import load_scenario


def main(scenario: str, case_id: str, builds: int) -> None:
    dist.init_process_group("gloo")
    torch.cuda.set_device(0)
    dev = torch.device("cuda", 0)
    case = next(c for c in expand(load_scenario(scenario), "te") if c.id == case_id)
    be = backends.get("te")
    weight = be.reference_model(case, case.train.seed, dev).state_dict()["weight"]
    for i in range(builds):
        torch.cuda.manual_seed(1000 + i)  # TE's reset_parameters draws from this generator
        with be.case_context(case), be.isolated():
            model = be.build_twin(case, *twin_mesh(case, be, "cuda"), case.train.seed, dev)
            history = model.fp8_meta["scaling_fwd"].amax_history
            first = [float(v) for v in history[0]]
            del model
            losses = single_rank_run(case, be, dev, "cuda")[0]
        print(json.dumps(dict(build=i, amax_row0=first, losses=losses,
                              weight_amax=float(weight.abs().max()))), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
