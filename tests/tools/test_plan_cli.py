"""``torch-neuronx plan`` refuses bad input with exit status 2 and a message, before printing anything."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from torch_neuronx.testing.plan import LLAMA3_8B
from torch_neuronx.tools.plan import cli as plan_cli
from torch_neuronx.tools.plan.layouts import PlanError


@pytest.fixture()
def model(tmp_path: Path) -> Path:
    path = tmp_path / "Meta-Llama-3-8B"
    path.mkdir()
    (path / "config.json").write_text(json.dumps(LLAMA3_8B))
    return path


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser()
    plan_cli.add_parser(parser.add_subparsers(dest="command"))
    rc = plan_cli.run(parser.parse_args(["plan", *argv]))
    out, err = capsys.readouterr()
    return rc, out, err


BASE = ["--instance", "trn1.32xlarge", "--global-batch", "32"]


@pytest.mark.parametrize(("extra", "message"), [
    (["--seq-len", "-4096"], r"--seq-len must be a whole number from 1 to 16,777,216; got -4096"),
    (["--seq-len", "0"], r"--seq-len must be a whole number from 1"),
    (["--seq-len", "99999999999"], r"--seq-len must be a whole number from 1 to 16,777,216"),
    (["--seq-len", "4096", "--layout", "0x32"], r"--layout '0x32': every degree must be at least 1"),
    (["--seq-len", "4096", "--layout", "8x0x4"], r"--layout '8x0x4': every degree must be at least 1"),
    (["--seq-len", "4096", "--layout", "8xx4"], r"write TPxFSDP, TPxFSDPxDP or TPxPPxFSDPxDP"),
    (["--seq-len", "4096", "--instances", "0"], r"--instances must be a whole number from 1"),
    (["--seq-len", "4096", "--micro-batch", "0"], r"--micro-batch must be a whole number from 1"),
    (["--seq-len", "4096", "--max-graphs", "0"], r"--max-graphs must be a whole number from 1"),
    (["--seq-len", "4096", "--hbm-reserve", "lots"], r"--hbm-reserve 'lots': give a size"),
    (["--seq-len", "4096", "--hbm-reserve", "16GiB"], r"--hbm-reserve 16.00 GiB must be at least 0 and less than"),
    (["--seq-len", "4096", "--zero1", "--layout", "8x4x1"], r"ZeRO-1 shards the optimizer over DP in place of FSDP"),
    (["--seq-len", "4096", "--layout", "1x64x1x1"], r"PP=64 stages but the model has 32 decoder layers"),
])
def test_bad_arguments_exit_2_with_a_message(model: Path, extra: list[str], message: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    import re

    rc, out, err = _run([str(model), *BASE, *extra], capsys)
    assert rc == 2 and out == ""
    assert err.startswith("torch-neuronx plan: error: ") and re.search(message, err), err
    assert "Traceback" not in err


@pytest.mark.parametrize(("content", "message"), [
    ("[[1, 2]]", r"\[1, 2\] is not a whole sequence length"),
    ("[1e400]", r"inf is not a whole sequence length"),
    ("1e400\n", r"'1e400' is not a whole sequence length"),
    ("[1.5, 3]", r"1.5 is not a whole sequence length"),
    ("[]", r"needs at least one length"),
    ("12 -3", r"needs at least one length, every length >= 1"),
    ("{\"a\": 1}", r"a JSON dict, not a list of lengths"),
    ("[1, 2", r"not a valid JSON list"),
    ("100 99999999999", r"sequence length 99999999999 is not a whole number from 1 to 16,777,216"),
])
def test_bad_length_files_exit_2(model: Path, tmp_path: Path, content: str, message: str,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    import re

    (tmp_path / "lengths").write_text(content)
    rc, out, err = _run([str(model), *BASE, "--lengths", str(tmp_path / "lengths")], capsys)
    assert rc == 2 and out == "" and re.search(message, err), err


def test_lengths_longer_than_seq_len_are_refused(model: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "lengths").write_text("100\n8000\n4096\n9000\n")
    rc, out, err = _run([str(model), *BASE, "--seq-len", "4096", "--lengths", str(tmp_path / "lengths")], capsys)
    assert rc == 2 and "2 of 4 lengths exceed --seq-len 4096 (longest 9000)" in err


def test_missing_lengths_file_and_model_config(model: Path, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = _run([str(model), *BASE, "--lengths", str(tmp_path / "nope.txt")], capsys)
    assert rc == 2 and "nope.txt: no such file" in err
    rc, _, err = _run([str(tmp_path / "missing.json"), *BASE, "--seq-len", "128"], capsys)
    assert rc == 2 and "no such config file" in err
    (tmp_path / "bad.json").write_text("{not json")
    rc, _, err = _run([str(tmp_path / "bad.json"), *BASE, "--seq-len", "128"], capsys)
    assert rc == 2 and "cannot read the model config" in err
    (tmp_path / "list.json").write_text("[1, 2]")
    rc, _, err = _run([str(tmp_path / "list.json"), *BASE, "--seq-len", "128"], capsys)
    assert rc == 2 and "holds a JSON list, not a config object" in err


@pytest.mark.parametrize(("field", "value", "message"), [
    ("num_attention_heads", 0, r"num_attention_heads=0: it must be a whole number between 1 and 16,384"),
    ("hidden_size", -5, r"hidden_size=-5"),
    ("num_hidden_layers", 1.5, r"num_hidden_layers=1.5"),
    ("vocab_size", "big", r"vocab_size='big'"),
    ("num_key_value_heads", 3, r"num_attention_heads=32 not a multiple of num_key_value_heads=3"),
    ("intermediate_size", 1e400, r"intermediate_size=inf"),
])
def test_bad_model_configs_exit_2(tmp_path: Path, field: str, value: object, message: str,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    import re

    (tmp_path / "config.json").write_text(json.dumps({**LLAMA3_8B, field: value}))
    rc, out, err = _run([str(tmp_path), *BASE, "--seq-len", "128"], capsys)
    assert rc == 2 and out == "" and re.search(message, err), err


def test_outputs_are_checked_before_anything_prints(model: Path, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = _run([str(model), *BASE, "--seq-len", "128", "--json", str(tmp_path / "no" / "plan.json")], capsys)
    assert rc == 2 and out == "" and "the folder" in err and "does not exist" in err
    rc, out, err = _run([str(model), *BASE, "--seq-len", "128", "--json", str(tmp_path)], capsys)
    assert rc == 2 and out == "" and "is a directory" in err
    (tmp_path / "file").write_text("")
    rc, out, err = _run([str(model), *BASE, "--seq-len", "128", "--plots", str(tmp_path / "file")], capsys)
    assert rc == 2 and out == "" and "is a file" in err


def test_missing_required_arguments(model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = _run([str(model), "--seq-len", "128"], capsys)
    assert rc == 2 and "give --instance, --global-batch (or --calibration)" in err


def test_calibration_prints_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _run(["--calibration"], capsys)
    assert rc == 0 and "| Llama-3.1-70B |" in out and "held out:" in out


def test_a_closed_pipe_ends_quietly(model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    class ClosedPipe:
        def write(self, text: str) -> int:
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self) -> None:
            raise BrokenPipeError(32, "Broken pipe")

        def fileno(self) -> int:
            raise OSError("no file descriptor")

    parser = argparse.ArgumentParser()
    plan_cli.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["plan", str(model), *BASE, "--seq-len", "128"])
    monkeypatch.setattr(sys, "stdout", ClosedPipe())
    assert plan_cli.run(args) == 0


def test_output_piped_to_head_ends_quietly(model: Path) -> None:
    # 16 x trn2.48xlarge: a table far longer than a pipe's buffer, so head closes it mid-write
    cmd = (f"{sys.executable} -m torch_neuronx.tools.cli plan {model} --instance trn2.48xlarge --instances 16 "
           "--global-batch 1024 --seq-len 8192 --checkpointing full | head -n 2")
    done = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.splitlines()) == 2 and "Error" not in done.stderr, done.stderr


# -- issue 30, section 4: bad input and wrong answers ----------------------------------------------------------------

def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser()
    plan_cli.add_parser(parser.add_subparsers(dest="command"))
    code = plan_cli.run(parser.parse_args(["plan", *argv]))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture()
def llama_json(tmp_path: Path) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA3_8B))
    return path


BASE = ["--instance", "trn1.32xlarge", "--global-batch", "64", "--seq-len", "4096", "--layout", "8x4"]


@pytest.mark.parametrize(("flag", "target", "message"), [
    ("--json", "/proc/plan.json", "--json /proc/plan.json cannot be written"),
    ("--json", "/dev/full", "--json /dev/full is not a regular file"),
    ("--plots", "/proc/plots", "--plots /proc/plots cannot be written"),
    ("--json", "", "--json was given an empty path"),
    ("--plots", "", "--plots was given an empty path"),
])
def test_unwritable_outputs_exit_2_before_anything_prints(flag: str, target: str, message: str, llama_json: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _cli([str(llama_json), *BASE, flag, target], capsys)
    assert code == 2 and out == "" and message in err and err.count("\n") == 1


def test_writable_outputs_twin(llama_json: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    existing = tmp_path / "plan.json"
    existing.write_text("old")
    code, out, _ = _cli([str(llama_json), *BASE, "--json", str(existing)], capsys)
    assert code == 0 and json.loads(existing.read_text())["layouts"][0]["tp"] == 8 and "wrote" in out
    fresh = tmp_path / "new.json"  # the probe leaves nothing behind when the plan itself is refused
    code, _, _ = _cli([str(llama_json), *BASE[:-2], "--layout", "3x2", "--json", str(fresh)], capsys)
    assert code == 2 and not fresh.exists()


def test_measure_below_zero_is_refused(llama_json: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _cli([str(llama_json), *BASE, "--measure", "-1"], capsys)
    assert code == 2 and out == "" and "--measure -1" in err
    from torch_neuronx.tools.plan import plan

    with pytest.raises(PlanError, match="measure=-2"):
        plan(str(llama_json), instance="trn1.32xlarge", global_batch=64, seq_len=4096, measure=-2)


def test_builder_that_is_not_callable_or_raises_exits_2_naming_it(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _cli(["os:sep", *BASE], capsys)
    assert code == 2 and "os:sep is a str, not a function" in err
    code, _, err = _cli(["json:loads", *BASE], capsys)
    assert code == 2 and "json:loads() raised TypeError" in err and "Traceback" not in err
    code, _, err = _cli(["torch_neuronx.testing.plan:tiny_llama", "--instance", "trn2.3xlarge", "--global-batch",
                         "4", "--seq-len", "32"], capsys)
    assert code == 0  # the twin: a builder that returns a config plans


def test_absurd_sizes_and_a_missing_mlp_width_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    huge = tmp_path / "huge.json"  # every dimension within its own bound, 6.9e14 parameters in all
    huge.write_text(json.dumps({"vocab_size": 1 << 16, "hidden_size": 1 << 16, "intermediate_size": 1 << 18,
                                "num_hidden_layers": 10_000, "num_attention_heads": 512, "num_key_value_heads": 512,
                                "model_type": "llama", "tie_word_embeddings": False}))
    code, out, err = _cli([str(huge), *BASE[:-2]], capsys)
    assert code == 2 and out == "" and "more than the planner's limit of 1e+14" in err
    # a Llama-2-7B shape without model_type or intermediate_size: 4 x hidden would make it 8.85B parameters
    llama2 = {"vocab_size": 32000, "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32}
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps(llama2))
    code, _, err = _cli([str(bare), *BASE[:-2]], capsys)
    assert code == 2 and "has no intermediate_size" in err
    bare.write_text(json.dumps({**llama2, "intermediate_size": 11008}))  # the twin: 6.74B, Llama-2-7B's count
    from torch_neuronx.tools.plan.model import load

    assert load(str(bare)).total_params == 6_738_415_616


def test_sequence_parallelism_needs_the_sequence_to_divide_by_tp(llama_json: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from torch_neuronx.tools.plan import plan

    code, _, err = _cli([str(llama_json), "--instance", "trn1.32xlarge", "--global-batch", "64", "--seq-len", "1001",
                         "--sequence-parallel", "--layout", "8x4"], capsys)
    assert code == 2 and "1001 tokens do not divide by 8" in err
    result = plan(str(llama_json), instance="trn1.32xlarge", global_batch=64, seq_len=1001, sequence_parallel=True,
                  pipeline=False)
    assert {lp.layout.tp for lp in result.layouts} == {1}  # 1001 = 7 x 11 x 13: no TP the model allows divides it
    assert any("left out" in n and "do not divide" in n for n in result.notes)
    twin = plan(str(llama_json), instance="trn1.32xlarge", global_batch=64, seq_len=1024, sequence_parallel=True,
                pipeline=False)
    assert 8 in {lp.layout.tp for lp in twin.layouts}


def test_calibration_json_writes_the_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from torch_neuronx.tools.plan import calibration as cal

    path = tmp_path / "cal.json"
    code, out, _ = _cli(["--calibration", "--json", str(path)], capsys)
    data = json.loads(path.read_text())
    assert code == 0 and f"wrote {path}" in out
    assert len(data["rows"]) == len(cal.ROWS) and data["summary"]["held out"]["rows"] >= 50
    code, out, err = _cli(["--calibration", "--json", "/proc/cal.json"], capsys)
    assert code == 2 and out == "" and "cannot be written" in err
