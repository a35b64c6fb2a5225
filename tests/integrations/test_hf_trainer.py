"""Recipe: Hugging Face ``Trainer`` with ``trainer.train()`` inside one session
(docs/integrations.md). A GPT-2 built from config (no download) trains 4 optimizer steps of 2
accumulated micro-batches, evaluates every 2 steps and saves a checkpoint at the end; at half
its measured peak the parameters, the logged losses and the saved checkpoint equal the run
without tritondtr, bit for bit; so they do at half and 30 % with offload (NOTE [ Offload ]),
where steps after the first prefetch in the previous one's order."""

from __future__ import annotations

import pytest
import torch

import tritondtr

from .common import assert_evicted_within_budget, assert_same_parameters, half_peak

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

VOCAB, TOKENS = 128, 16


class _Tokens(torch.utils.data.Dataset):
    """Random token ids, labels = inputs (causal LM)."""

    def __init__(self, n: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, VOCAB, (n, TOKENS), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def _trainer(out, *, bf16: bool, checkpointing: bool):
    config = transformers.GPT2Config(
        n_embd=32, n_layer=2, n_head=2, vocab_size=VOCAB, n_positions=TOKENS,
        bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config)
    if checkpointing:  # transformers 5 renamed it
        enable = getattr(model, "activation_checkpointing_enable", None)
        (enable or model.gradient_checkpointing_enable)()
    args = transformers.TrainingArguments(
        output_dir=str(out), max_steps=4, per_device_train_batch_size=4,
        gradient_accumulation_steps=2, eval_strategy="steps", eval_steps=2, save_steps=4,
        logging_steps=1, bf16=bf16, use_cpu=True, seed=0, report_to="none",
        dataloader_num_workers=0, disable_tqdm=True,
    )  # fmt: skip
    return transformers.Trainer(
        model=model, args=args, train_dataset=_Tokens(32, 1), eval_dataset=_Tokens(8, 2)
    )


def _train(out, budget, *, session: bool = True, offload=False, **kw):
    trainer = _trainer(out, **kw)
    if not session:
        trainer.train()
        return trainer, None
    kw = {"offload": offload, "cost": "analytic"} if offload else {}  # deterministic choices
    with tritondtr.enable(budget=budget, **kw) as s:  # the recipe: the whole train() inside
        trainer.train()
    return trainer, s.stats


def _logged(trainer) -> list:
    """What the Trainer logged that depends on the values (not on wall time)."""
    keys = ("loss", "grad_norm", "eval_loss", "step")
    return [{k: v for k, v in row.items() if k in keys} for row in trainer.state.log_history]


@pytest.mark.parametrize(
    "bf16,checkpointing",
    [(False, False), (True, False), (False, True)],
    ids=["fp32", "bf16-autocast", "gradient-checkpointing-too"],
)
def test_trainer_train_inside_one_session(tmp_path, bf16, checkpointing):
    eager, _ = _train(
        tmp_path / "eager", None, session=False, bf16=bf16, checkpointing=checkpointing
    )
    _, measured = _train(tmp_path / "measure", None, bf16=bf16, checkpointing=checkpointing)
    budget = half_peak(measured)
    trainer, stats = _train(tmp_path / "dtr", budget, bf16=bf16, checkpointing=checkpointing)

    assert_evicted_within_budget(stats, budget)
    assert_same_parameters(trainer.model, eager.model)
    logged = _logged(trainer)
    assert logged == _logged(eager) and sum("eval_loss" in row for row in logged) == 2
    saved = safetensors_torch.load_file(tmp_path / "dtr" / "checkpoint-4" / "model.safetensors")
    want = eager.model.state_dict()
    assert saved and all(torch.equal(t, want[k]) for k, t in saved.items())
    assert stats.offloads == 0
    if bf16:  # autocast ran: its casts were tracked and recomputed like any op
        assert trainer.accelerator.mixed_precision == "bf16"
        assert stats.op_counts["aten._to_copy.default"] > 0


@pytest.mark.parametrize("share", [0.5, 0.3], ids=["50pct", "30pct"])
def test_trainer_train_with_offload_inside_one_session(tmp_path, share):
    eager, _ = _train(tmp_path / "eager", None, session=False, bf16=False, checkpointing=False)
    _, measured = _train(tmp_path / "measure", None, bf16=False, checkpointing=False)
    budget = int(measured.peak_bytes * share)
    trainer, stats = _train(
        tmp_path / "dtr", budget, offload="1TB/s", bf16=False, checkpointing=False
    )  # a link far faster than any CPU op: every victim offloaded, at every scale tried
    assert stats.evictions > 0 and stats.peak_bytes <= budget + stats.max_op_out_bytes
    assert_same_parameters(trainer.model, eager.model)
    assert _logged(trainer) == _logged(eager)
    assert stats.offloads > 0 and stats.prefetches > 0 and stats.rematerializations == 0
