"""``torch-neuronx plan`` on hostile input found by the second review of issue 30: every case exits 2 (or 130 for an
interrupt) with one line, never a hang, a traceback or a silent exit 0, and each has a correct twin that plans.

Each test calls the CLI's ``main`` in process with an argv, as a shell would.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from torch_neuronx.testing.plan import LLAMA3_8B, cli
from torch_neuronx.testing.plan import assert_refused as _refused
from torch_neuronx.tools.cli import main

BASE = ["--instance", "trn1.32xlarge", "--global-batch", "64", "--seq-len", "4096", "--layout", "8x4"]


def _main(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """Exit status, stdout and stderr of ``torch-neuronx plan ARGV``."""
    return cli(main, ["plan", *argv], capsys)


@pytest.fixture()
def llama(tmp_path: Path) -> Path:
    path = tmp_path / "llama.json"
    path.write_text(json.dumps(LLAMA3_8B))
    return path


def test_fifos_and_oversized_length_files_are_refused_without_blocking(llama: Path, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    from torch_neuronx.tools.plan import padding

    fifo = tmp_path / "lengths.fifo"
    os.mkfifo(fifo)  # reading it would block until a writer comes: refused before any read
    _refused(*_main([str(llama), *BASE[:-4], "--lengths", str(fifo)], capsys), "not a regular file")
    out_fifo = tmp_path / "out.fifo"
    os.mkfifo(out_fifo)  # no process reads it: opening it to write would block forever
    _refused(*_main([str(llama), *BASE, "--json", str(out_fifo)], capsys), "is not a regular file")
    lengths = tmp_path / "lengths.txt"
    lengths.write_text("512\n1024\n" * 50)
    monkeypatch.setattr(padding, "MAX_LENGTHS_BYTES", 100)
    _refused(*_main([str(llama), *BASE[:-4], "--lengths", str(lengths)], capsys), "over 0 MiB")
    monkeypatch.setattr(padding, "MAX_LENGTHS_BYTES", 1000)  # the twin: the same file under the cap plans
    code, out, _ = _main([str(llama), *BASE[:-4], "--lengths", str(lengths), "--layout", "8x4"], capsys)
    assert code == 0 and "optimal 4 buckets" in out


def test_a_model_path_longer_than_path_max_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    long = str(tmp_path / "/".join(["xxxx"] * 1100))  # 5,500 characters: the system refuses it (ENAMETOOLONG)
    _refused(*_main([long, *BASE], capsys), "File name too long")
    model = tmp_path / "llama.json"
    model.write_text(json.dumps(LLAMA3_8B))
    for flag, path in (("--json", f"{long}/p.json"), ("--plots", long), ("--lengths", long)):
        code, out, err = _main([str(model), *BASE, flag, path], capsys)
        _refused(code, out, err, "(File name too long)")
        assert "(5,5" in err and len(err) < 300  # the path shortened, its length said
    _refused(*_main(["", *BASE], capsys), "MODEL is empty")


BUILDERS = {
    "boom_at_import.py": "raise RuntimeError('import-time boom')\ndef f():\n    pass\n",
    "bad_syntax.py": "def f(:\n    pass\n",
    "exits.py": "import sys\ndef f():\n    sys.exit(0)\n",
    "interrupts.py": "def f():\n    raise KeyboardInterrupt\n",
}


@pytest.fixture()
def builders(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, text in BUILDERS.items():
        (tmp_path / name).write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))


@pytest.mark.parametrize(("model", "message"), [
    ("boom_at_import:f", "importing boom_at_import raised RuntimeError: import-time boom"),
    ("bad_syntax:f", "importing bad_syntax raised SyntaxError"),
    ("exits:f", "exits:f() raised SystemExit(0): a builder must return a model or a config"),
    ("builtins:exit", "builtins:exit() raised SystemExit(None)"),
])
def test_builders_that_fail_to_import_or_exit_are_refused(model: str, message: str, builders: None,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    _refused(*_main([model, *BASE], capsys), message)


def test_a_builder_raising_keyboard_interrupt_exits_130_in_one_line(builders: None,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _main(["interrupts:f", *BASE], capsys)
    assert code == 130 and out == "" and err == "torch-neuronx plan: interrupted\n"
    code, out, _ = _main(["torch_neuronx.testing.plan:tiny_llama", "--instance", "trn2.3xlarge", "--global-batch",
                          "4", "--seq-len", "32"], capsys)
    assert code == 0 and "parameters" in out  # the twin: a builder that returns a config plans


GPT_NEOX_20B = {"model_type": "gpt_neox", "vocab_size": 50432, "hidden_size": 6144, "intermediate_size": 24576,
                "num_hidden_layers": 44, "num_attention_heads": 64, "tie_word_embeddings": False}
BERT_LARGE = {"model_type": "bert", "vocab_size": 30522, "hidden_size": 1024, "intermediate_size": 4096,
              "num_hidden_layers": 24, "num_attention_heads": 16}
LLAMA31_70B = {"model_type": "llama", "vocab_size": 128256, "hidden_size": 8192, "num_hidden_layers": 80,
               "num_attention_heads": 64, "num_key_value_heads": 8, "tie_word_embeddings": False}


@pytest.mark.parametrize(("config", "message"), [
    (GPT_NEOX_20B, "model_type 'gpt_neox' is not a model the planner models"),  # would count 27.2B, not 20.55B
    (BERT_LARGE, "model_type 'bert' is not a model the planner models"),  # would count 434M, not 335M
    (LLAMA31_70B, "has no intermediate_size"),  # LlamaConfig's default 11008 would make it 35.8B
    ({**LLAMA3_8B, "num_hidden_layers": 1 << 40}, "num_hidden_layers=1099511627776: it must be a whole number "
                                                  "between 1 and 10,000"),
    ({**LLAMA3_8B, "num_hidden_layers": 10 ** 9}, "between 1 and 10,000"),
    ({**LLAMA3_8B, "hidden_size": 1 << 21}, "between 1 and 1,048,576"),
    ({**LLAMA3_8B, "vocab_size": 1 << 25}, "between 1 and 16,777,216"),
])
def test_unmodelled_architectures_guessed_widths_and_absurd_sizes_are_refused(
        config: dict[str, object], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    _refused(*_main([str(path), *BASE[:-2]], capsys), message)


def test_the_twins_of_the_refused_configs_plan_with_their_published_counts(tmp_path: Path) -> None:
    from torch_neuronx.tools.plan.model import load

    path = tmp_path / "config.json"
    path.write_text(json.dumps({**LLAMA31_70B, "intermediate_size": 28672}))
    assert load(str(path)).total_params == 70_553_706_496  # Llama-3.1-70B's published count
    path.write_text(json.dumps({**LLAMA3_8B, "num_hidden_layers": 126}))  # deep, but within the bound
    assert load(str(path)).layers == 126


def test_the_fits_verdict_keeps_the_measured_fragmentation_margin() -> None:
    import re

    from torch_neuronx.tools.plan.memory import FRAGMENTATION_MARGIN, MIB, Memory

    # the planted fault: reserved + the runtime's share exactly fill the core, which fitted before the margin
    full = Memory(params=8 << 30, grads=0, optimizer=0, activations=0, buffers=0, capacity=16 << 30, reserve=1 << 30,
                  segments=15 << 30)
    assert full.reserved + full.reserve == full.capacity and not full.fits
    spare = Memory(params=8 << 30, grads=0, optimizer=0, activations=0, buffers=0, capacity=16 << 30,
                   reserve=1 << 30, segments=(15 << 30) - FRAGMENTATION_MARGIN)
    assert spare.fits and spare.as_dict()["needed"] == spare.capacity  # the twin: the margin to spare fits
    # the margin covers every measured reserved peak of docs/plan.md's table above its estimate
    text = (Path(__file__).resolve().parents[2] / "docs" / "plan.md").read_text()
    pairs = [(int(e), int(m)) for e, m in re.findall(r"\| (\d+) / (\d+) MiB \|", text)]
    assert len(pairs) >= 25 and max(m - e for e, m in pairs) == 98
    assert all((m - e) * MIB <= FRAGMENTATION_MARGIN for e, m in pairs)


def test_a_failed_measure_rank_exits_2_naming_the_rank_and_its_log(monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from torch_neuronx.testing import workers

    def failing(cmds: list[tuple[list[str], dict[str, str]]], workdir: Path, timeout: float,
                **kwargs: object) -> list[workers.Proc]:
        ranks = [workers.Proc(-15, "", "", 2.5, False, stopped=True) for _ in cmds]  # stopped: rank 1 failed
        ranks[1] = workers.Proc(1, "", "Traceback ...\nFileNotFoundError: [Errno 2] /proc/nope.pickle\n", 2.0, False)
        return ranks

    monkeypatch.setattr(workers, "run_processes", failing)
    code, out, err = _main(["torch_neuronx.testing.plan:tiny_llama", "--instance", "trn2.3xlarge", "--global-batch",
                            "8", "--micro-batch", "2", "--seq-len", "32", "--precision", "fp32", "--layout", "1x4",
                            "--measure", "1"], capsys)
    last = err.splitlines()[-1] + "\n"  # after Transformers' progress bar while the checkpoint is written
    log = Path(last.rsplit("its log: ", 1)[-1].strip())
    try:
        _refused(code, out, last, "--measure of layout TP=1 x FSDP=4 x DP=1 failed: rank 1 exited 1 "
                                  "(FileNotFoundError: [Errno 2] /proc/nope.pickle); its log: ")
        assert "Traceback" not in err and "FileNotFoundError" in log.read_text()
    finally:
        log.unlink(missing_ok=True)


@pytest.mark.parametrize(("argv", "message"), [
    (["--global-batch", "abc", "--seq-len", "4096"], "argument --global-batch: 'abc' is not a whole number"),
    (["--global-batch", "64", "--seq-len", "4k"], "argument --seq-len: '4k' is not a whole number"),
    (["--global-batch", "64", "--seq-len", "4096", "--measure", "x"], "argument --measure: 'x' is not a whole"),
    (["--global-batch", "64", "--seq-len", "4096", "--hbm-reserve", "-1GiB"], "e.g. --hbm-reserve=-1GiB"),
    (["--global-batch", "64", "--seq-len", "4096", "--hbm-reserve=-1GiB"], "--hbm-reserve '-1GiB': give a size"),
])
def test_numbers_given_as_words_are_refused_in_one_line(argv: list[str], message: str, llama: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    _refused(*_main([str(llama), "--instance", "trn1.32xlarge", *argv], capsys), message)


def test_a_refused_command_leaves_no_plot_folder_and_measure_names_model_type(
        llama: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plots = tmp_path / "new" / "a" / "b"
    _refused(*_main([str(tmp_path / "nosuch.json"), *BASE, "--plots", str(plots)], capsys), "no such config file")
    assert not (tmp_path / "new").exists()
    no_type = tmp_path / "no_type.json"
    no_type.write_text(json.dumps({k: v for k, v in LLAMA3_8B.items() if k != "model_type"}))
    _refused(*_main([str(no_type), "--instance", "trn2.3xlarge", "--global-batch", "8", "--seq-len", "32",
                     "--layout", "1x4", "--measure", "1"], capsys), 'add "model_type"')


def test_the_measure_folder_goes_when_the_planner_is_killed(tmp_path: Path) -> None:
    """SIGKILL of the starter runs no cleanup: the workers' guardians remove the folder named for them."""
    import signal
    import subprocess
    import sys
    import time

    from torch_neuronx.runtime import processes

    folder = tmp_path / "neuron_plan_x"
    (folder / "checkpoint").mkdir(parents=True)
    kept = tmp_path / "kept"  # the twin: a folder not named to the guardian stays
    kept.mkdir()
    starter = ("import os, sys, time\nfrom torch_neuronx.runtime import processes\n"
               "p = processes.spawn(['sleep', '60'], env={**os.environ, processes.REMOVE_ON_STARTER_EXIT: sys.argv[1]})"
               "\nprint(p.pid, flush=True)\ntime.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", starter, str(folder)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    guardian = int(proc.stdout.readline())
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 30
    while (folder.exists() or processes.descendants(guardian) or Path(f"/proc/{guardian}").exists()) \
            and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not folder.exists() and kept.exists()
