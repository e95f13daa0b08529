"""Training with Trainer, TRL's SFTTrainer, PEFT and Accelerate on neuron, unmodified, against the same run on CPU."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from datasets import Dataset
from transformers import DataCollatorForLanguageModeling, Trainer, TrainingArguments

import torch_neuronx.compile
from torch_neuronx.testing import hf as hf_tiny

NEURON0 = torch.device("neuron:0")
pytestmark = pytest.mark.usefixtures("clean_accelerate")


def _common(tmp_path: Any, use_cpu: bool, **kwargs: Any) -> dict[str, Any]:
    return {"output_dir": str(tmp_path / ("cpu" if use_cpu else "neuron")), "use_cpu": use_cpu, "report_to": [],
            "save_strategy": "no", "logging_steps": 1, "seed": 0, "disable_tqdm": True,
            "dataloader_num_workers": 0, **kwargs}


def _losses(trainer: Trainer) -> list[float]:
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


def _assert_learns(losses: list[float]) -> None:
    assert losses and all(math.isfinite(x) for x in losses), losses
    assert losses[-1] < 0.8 * losses[0], losses


def _lm_dataset(tokenizer: Any, n: int = 64) -> Dataset:
    return Dataset.from_dict({"text": hf_tiny.corpus(n)}).map(
        lambda b: tokenizer(b["text"]), batched=True, remove_columns=["text"])


def _train_lm(tmp_path: Any, tokenizer: Any, use_cpu: bool, model: Any | None = None,
              **kwargs: Any) -> Trainer:
    args = TrainingArguments(**_common(tmp_path, use_cpu, **{"per_device_train_batch_size": 8,
                                                             "learning_rate": 5e-3, **kwargs}))
    trainer = Trainer(model=model if model is not None else hf_tiny.llama(), args=args,
                      train_dataset=_lm_dataset(tokenizer),
                      data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False))
    trainer.train()
    return trainer


def test_trainer_picks_neuron_and_trains_bf16(tmp_path: Any, tokenizer: Any) -> None:
    trainer = _train_lm(tmp_path, tokenizer, use_cpu=False, bf16=True, max_steps=8)
    assert trainer.args.device == NEURON0
    assert next(trainer.model.parameters()).device == NEURON0
    assert trainer.accelerator.mixed_precision == "bf16"
    losses = _losses(trainer)
    _assert_learns(losses)
    ref = _losses(_train_lm(tmp_path, tokenizer, use_cpu=True, bf16=True, max_steps=8))
    # Same seed, same data order, same bf16 autocast policy: the curves agree to bf16 rounding.
    assert losses == pytest.approx(ref, abs=5e-2), (losses, ref)


def test_torch_compile_argument_picks_neuron_backend(tmp_path: Any) -> None:
    args = TrainingArguments(**_common(tmp_path, use_cpu=False, torch_compile=True))
    assert args.torch_compile_backend == "neuron"


def test_trainer_torch_compile_trains(tmp_path: Any, tokenizer: Any) -> None:
    torch._dynamo.reset()
    torch.neuron.reset_dynamo_metrics()
    # One layer: a cold compile of the training graph dominates this test's time.
    trainer = _train_lm(tmp_path, tokenizer, use_cpu=False, model=hf_tiny.llama(layers=1), bf16=True, max_steps=6,
                        torch_compile=True)
    assert trainer.args.torch_compile_backend == "neuron"
    assert trainer.accelerator.state.dynamo_plugin.backend.value == "NEURON"
    metrics = torch_neuronx.compile.metrics.snapshot()
    # Same-length batches: one graph, no recompilation across steps.
    assert metrics["graphs_compiled"] >= 1 and metrics["recompilations"] == 0, metrics
    _assert_learns(_losses(trainer))
    torch._dynamo.reset()


def _sft(tmp_path: Any, tokenizer: Any, use_cpu: bool, steps: int) -> Any:
    from trl import SFTConfig, SFTTrainer

    # ~10k tokens: four full 2048-token rows and a shorter last one.
    dataset = Dataset.from_dict({"text": hf_tiny.corpus(400)})
    args = SFTConfig(**_common(tmp_path, use_cpu, per_device_train_batch_size=1, learning_rate=5e-3,
                               max_steps=steps, bf16=True, packing=True, packing_strategy="wrapped",
                               max_length=2048))
    return SFTTrainer(model=hf_tiny.llama(max_positions=2048), args=args, train_dataset=dataset,
                      processing_class=tokenizer)


def test_sft_packing_wrapped_pads_to_128(tmp_path: Any, tokenizer: Any) -> None:
    trainer = _sft(tmp_path, tokenizer, use_cpu=False, steps=3)
    assert trainer.args.device == NEURON0
    # TRL's "auto" resolves to 128 on neuron: one compiled graph per 128-token bucket, not per length.
    assert trainer.args.pad_to_multiple_of == 128
    lengths = [len(row) for row in trainer.train_dataset["input_ids"]]
    assert lengths[:-1] == [2048] * (len(lengths) - 1) and lengths[-1] < 2048
    shapes = set()
    for batch in trainer.get_train_dataloader():
        assert batch["input_ids"].device == NEURON0
        assert batch["input_ids"].shape == batch["labels"].shape
        shapes.add(batch["input_ids"].shape[1])
    # Full rows stay 2048; the short last row is padded up to the next multiple of 128.
    assert shapes == {2048, -(-lengths[-1] // 128) * 128}, shapes
    trainer.train()
    losses = _losses(trainer)
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0], losses
    ref = _sft(tmp_path, tokenizer, use_cpu=True, steps=1)
    ref.train()
    assert losses[0] == pytest.approx(_losses(ref)[0], abs=1e-2)


def test_peft_lora_trains_only_adapters(tmp_path: Any, tokenizer: Any) -> None:
    from peft import LoraConfig, get_peft_model

    def lora_model() -> Any:
        return get_peft_model(hf_tiny.llama(), LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"],
                                                          lora_dropout=0.0, task_type="CAUSAL_LM"))

    model = lora_model()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer = _train_lm(tmp_path, tokenizer, use_cpu=False, model=model, max_steps=8, learning_rate=2e-2)
    assert next(trainer.model.parameters()).device == NEURON0
    changed = {n for n, p in trainer.model.named_parameters() if not torch.equal(p.detach().cpu(), before[n])}
    assert changed and all("lora_" in n for n in changed), changed
    losses = _losses(trainer)
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0], losses
    ref = _losses(_train_lm(tmp_path, tokenizer, use_cpu=True, model=lora_model(), max_steps=8, learning_rate=2e-2))
    assert losses == pytest.approx(ref, abs=1e-3), (losses, ref)


def _accelerate_run(mixed_precision: str | None, cpu: bool = False,
                    optimizer_first: bool = False) -> tuple[Any, list[float]]:
    """A plain Accelerate loop. optimizer_first: the documented order (optimizer made from the CPU model)."""
    from accelerate import Accelerator

    accelerator = Accelerator(mixed_precision=mixed_precision, cpu=cpu)
    torch.manual_seed(0)
    model = hf_tiny.llama()
    ids = torch.tensor(hf_tiny.tokenizer()(hf_tiny.corpus(32))["input_ids"])
    loader = torch.utils.data.DataLoader(ids, batch_size=8, shuffle=False)
    if optimizer_first:
        opt = torch.optim.AdamW(model.parameters(), lr=5e-3)
        model, opt, loader = accelerator.prepare(model, opt, loader)
    else:
        model = accelerator.prepare(model)
        opt = torch.optim.AdamW(model.parameters(), lr=5e-3)
        opt, loader = accelerator.prepare(opt, loader)
    assert next(model.parameters()).device.type == accelerator.device.type
    losses = []
    for _ in range(2):
        for batch in loader:
            loss = model(input_ids=batch, labels=batch).loss
            accelerator.backward(loss)
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
    return accelerator, losses


@pytest.mark.parametrize("mixed_precision", [None, "bf16"], ids=["fp32", "bf16"])
def test_accelerator_picks_neuron_and_trains(mixed_precision: str | None) -> None:
    accelerator, losses = _accelerate_run(mixed_precision)
    # Single process: accelerate picks the bare accelerator type, as it does with torch.device("cuda").
    assert accelerator.device.type == "neuron"
    assert accelerator.mixed_precision == (mixed_precision or "no")
    _assert_learns(losses)
    if mixed_precision == "bf16":
        # autocast is really on: a Linear under accelerator.autocast() computes in bf16.
        with accelerator.autocast():
            y = torch.nn.Linear(4, 4).to(accelerator.device)(torch.ones(2, 4, device=accelerator.device))
        assert y.dtype == torch.bfloat16
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
    _, ref = _accelerate_run(mixed_precision, cpu=True)
    assert losses == pytest.approx(ref, abs=5e-2 if mixed_precision else 1e-3), (losses, ref)


def test_accelerator_optimizer_made_before_prepare_trains() -> None:
    _, losses = _accelerate_run(None, optimizer_first=True)
    _assert_learns(losses)


def test_accelerator_refuses_fp16_on_neuron() -> None:
    """Accelerate allows fp16 only on devices it lists (not neuron); bf16 is Trainium's format."""
    from accelerate import Accelerator

    with pytest.raises(ValueError, match="fp16 mixed precision requires a device in .*not 'neuron'"):
        Accelerator(mixed_precision="fp16")
