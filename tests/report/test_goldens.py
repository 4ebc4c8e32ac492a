"""Goldens (exact mode): compare never writes, --update-goldens rewrites explicitly."""

import json

from synth_history import A, B, C, make_case, write_run

from harness.__main__ import main
from harness.report import goldens

KEY = "cpu-cpu-torch2.13.0-tenone"
LOSS_A = [1.0532013177871704, 1.0484539270401, 1.0185208320617676]
LOSS_B = [2.12910747528076, 2.04788017272949, 1.97825014591217]


def _run(report_dir, n, loss_a=LOSS_A, with_c=False, **kw):
    cases = [make_case(A, trace=loss_a), make_case(B, trace=LOSS_B)]
    if with_c:
        cases.append(make_case(C, trace=[3.0, 2.0]))
    return write_run(report_dir, n, cases, **kw)


def test_key():
    assert goldens.golden_key(dict(device="cuda", gpu_name="NVIDIA H100 80GB HBM3",
                                   torch_version="2.9.0", te_version="2.8.0")) == \
        "cuda-NVIDIA_H100_80GB_HBM3-torch2.9.0-te2.8.0"
    assert goldens.golden_key(dict(device="cpu", gpu_name="", torch_version="2.13.0",
                                   te_version="")) == KEY


def test_goldens_roundtrip(report_dir, tmp_path, capsys):
    hist, gold = str(report_dir / "history"), tmp_path / "goldens"
    args = ["goldens", "--history", hist, "--goldens", str(gold)]
    _run(report_dir, 0)
    # no file yet: fails, says how to create it, writes nothing
    assert main(args) == 1
    assert "--update-goldens" in capsys.readouterr().out
    assert not gold.exists()
    assert main(args + ["--update-goldens"]) == 0
    out = capsys.readouterr().out
    assert f"created {gold / KEY}.json" in out and out.count("added") == 2
    doc = json.loads((gold / f"{KEY}.json").read_text())
    cid = "synth[fp32-dp2-Linear-sync-none]"
    assert doc[cid] == {"loss": {"start_step": 0, "end_step": 2, "step_interval": 1,
                                 "values": LOSS_A}}
    assert main(args) == 0
    assert "OK: 2 trace(s) bitwise equal" in capsys.readouterr().out
    # a later run whose last step differs in the last bit: a mismatch, and still no write
    bumped = LOSS_A[:2] + [LOSS_A[2] + 2.220446049250313e-16]
    _run(report_dir, 1, loss_a=bumped, with_c=True)
    before = (gold / f"{KEY}.json").read_text()
    assert main(args) == 1
    out = capsys.readouterr().out
    assert f"MISMATCH {cid}: loss: 1/3 step(s) differ; first at step 2" in out
    assert "MISSING  synth[bf16-dp4-Linear-sync-none]" in out
    assert (gold / f"{KEY}.json").read_text() == before
    # the earlier run still matches
    assert main(args + ["--run", "run000-cpu"]) == 0
    capsys.readouterr()
    # explicit update: prints what changed
    assert main(args + ["--update-goldens"]) == 0
    out = capsys.readouterr().out
    assert "changed  synth[fp32-dp2-Linear-sync-none] loss: 1/3 step(s) differ" in out
    assert "added    synth[bf16-dp4-Linear-sync-none]" in out
    assert json.loads((gold / f"{KEY}.json").read_text())[cid]["loss"]["values"] == bumped
    assert main(args + ["--update-goldens"]) == 0
    assert "up to date" in capsys.readouterr().out


def test_goldens_other_key_and_no_trace(report_dir, tmp_path, capsys):
    gold = tmp_path / "goldens"
    _run(report_dir, 0)
    main(["goldens", "--history", str(report_dir / "history"), "--goldens", str(gold),
          "--update-goldens"])
    # a GPU run has its own key: no file for it
    _run(report_dir, 1, device="cuda", gpu="NVIDIA H100", te_version="2.8.0")
    assert main(["goldens", "--history", str(report_dir / "history"), "--goldens",
                 str(gold)]) == 1
    assert "cuda-NVIDIA_H100-torch2.13.0-te2.8.0" in capsys.readouterr().out
    # a run without trace rows: nothing to compare
    write_run(report_dir, 2, [make_case(A)])
    assert main(["goldens", "--history", str(report_dir / "history"), "--goldens",
                 str(gold)]) == 2
