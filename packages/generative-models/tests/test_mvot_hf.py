"""P12 transformers integration: MVoTTrainer (Trainer.compute_loss override, optionally on a peft LoRA model)
and ImageBlockLogitsProcessor inside ``generate`` on a tiny random Llama."""

from __future__ import annotations

import pytest
import torch

from icml25.generative_models import mvot
from icml25.kernels.experiment import torch_threads

transformers = pytest.importorskip("transformers")
hf = pytest.importorskip("icml25.generative_models.mvot_hf")

N_TEXT, K = 8, 6
IDS = torch.arange(N_TEXT, N_TEXT + K).flip(0)  # codebook k <-> LM id N_TEXT + K - 1 - k
BOI, EOI = 3, 4


def _dataset(n: int = 16) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    rows = []
    for _ in range(n):
        codes = torch.randint(0, K, (4,), generator=g)
        rows.append(mvot.build_interleaved_example([([5], codes)], image_token_ids=IDS, boi_id=BOI, eoi_id=EOI,
                                                   prompt=[codes.flip(0)], bos_id=1, eos_id=2))  # fmt: skip
    return rows


def test_generate_with_processor_emits_fixed_image_blocks() -> None:
    with torch_threads(1):
        model = hf.build_mvot_llama(N_TEXT + K, hidden=16, layers=1, heads=2, seed=0).eval()
        proc = hf.ImageBlockLogitsProcessor(IDS, BOI, EOI, n_tokens=5)
        prompt = torch.tensor([[1, 5, BOI], [1, 6, BOI]])
        out = model.generate(prompt, logits_processor=transformers.LogitsProcessorList([proc]), max_new_tokens=7,
                             do_sample=True, top_k=0, pad_token_id=0)  # fmt: skip
    new = out[:, prompt.shape[1] :]
    assert torch.isin(new[:, :5], IDS).all()  # never a text token inside the block, even when sampling
    assert (new[:, 5] == EOI).all()  # closed after exactly 5 image tokens


def test_trainer_compute_loss_matches_mvot_loss_and_trains(tmp_path) -> None:
    codebook = torch.randn(K, 3, generator=torch.Generator().manual_seed(0))
    loss_fn = mvot.MVoTLoss(mvot.codebook_distance_matrix(codebook), IDS, weight=1.0)
    rows = _dataset()
    with torch_threads(1):
        model = hf.build_mvot_llama(N_TEXT + K, hidden=16, layers=1, heads=2, seed=0)
        args = transformers.TrainingArguments(
            output_dir=str(tmp_path), per_device_train_batch_size=8, max_steps=30, learning_rate=5e-3,
            report_to=[], save_strategy="no", logging_steps=1000, use_cpu=True, disable_tqdm=True,
        )  # fmt: skip
        trainer = hf.MVoTTrainer(model=model, args=args, train_dataset=rows, mvot_loss=loss_fn)
        batch = {k: torch.stack([r[k] for r in rows[:8]]) for k in rows[0]}
        with torch.no_grad():
            before = trainer.compute_loss(model, batch)
            direct = loss_fn(model(input_ids=batch["input_ids"]).logits, batch["labels"])
        torch.testing.assert_close(before, direct["loss"])
        assert set(trainer.last_loss_parts) == {"ce", "discrepancy"}
        trainer.train()
        with torch.no_grad():
            after = trainer.compute_loss(model, batch)
    assert float(after) < float(before) - 0.3


def test_trainer_with_peft_lora_trains_adapters_and_lm_head(tmp_path) -> None:
    peft = pytest.importorskip("peft")
    loss_fn = mvot.MVoTLoss(mvot.codebook_distance_matrix(torch.randn(K, 3)), IDS)
    with torch_threads(1):
        base = hf.build_mvot_llama(N_TEXT + K, hidden=16, layers=1, heads=2, seed=0)
        cfg = peft.LoraConfig(r=8, lora_alpha=16, lora_dropout=0.1, modules_to_save=["lm_head"],
                              target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], task_type="CAUSAL_LM")  # fmt: skip
        model = peft.get_peft_model(base, cfg)
        frozen = base.model.embed_tokens.weight.detach().clone()
        args = transformers.TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=8, max_steps=3,
                                              report_to=[], save_strategy="no", use_cpu=True, disable_tqdm=True)  # fmt: skip
        hf.MVoTTrainer(model=model, args=args, train_dataset=_dataset(8), mvot_loss=loss_fn).train()
    assert torch.equal(base.model.embed_tokens.weight, frozen)
    assert any("lora_A" in n and p.requires_grad for n, p in model.named_parameters())
    assert any("modules_to_save" in n and p.requires_grad for n, p in model.named_parameters())


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="n_tokens must be an int >= 1"):
        hf.ImageBlockLogitsProcessor(IDS, BOI, EOI, 0)
    with pytest.raises(TypeError, match="mvot_loss must be an MVoTLoss"):
        hf.MVoTTrainer(model=None, mvot_loss="ce")
    with pytest.raises(ValueError, match="hidden must be divisible by heads"):
        hf.build_mvot_llama(10, hidden=10, heads=4)
