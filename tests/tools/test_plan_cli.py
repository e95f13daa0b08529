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
    ("num_attention_heads", 0, r"num_attention_heads=0: it must be a whole number between 1 and 2\*\*40"),
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
