"""A Llama-style and a GPT-2-style model, built locally, each trained for 2 steps with and without LoRA through
`openmanus-rl train`, exported with `openmanus-rl export` and evaluated with `openmanus-rl eval` (each the console
script's function, ``cli.main``, in this process; train on the tests' shared Ray), and reloaded: the folder gives
the checkpoint's log-probs, and `model.path=<folder>` is accepted by the model check (and, for one of them,
evaluates)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from tiny_hf import save_tiny  # noqa: E402

from openmanus_rl_core.testing import SMALL_RUN  # noqa: E402

# model.path replaces the tiny model and picks the pretrained recipe (no warm-up): the warm-up is asked for, so the
# weights move even when every reward of the random model is 0
RUN = [*SMALL_RUN, "trainer.val_at_end=false", "actor.lr=0.01", "warmup.enabled=true", "warmup.lr=0.01"]
LORA = {"llama": ["model.lora.enabled=true", "model.lora.r=4", "model.lora.target_modules=[q_proj,v_proj]"],
        "gpt2": ["model.lora.enabled=true", "model.lora.r=4", "model.lora.target_modules=[c_attn,c_proj,c_fc]"]}


def _log_probs(model, tokenizer) -> torch.Tensor:
    text = tokenizer.apply_chat_template([{"role": "user", "content": "You are in a room."}], tokenize=False,
                                         add_generation_prompt=True) + "<action>take key</action>"
    ids = torch.tensor([tokenizer.encode(text)])
    with torch.no_grad():
        return torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), -1).gather(-1, ids[0, 1:, None])[:, 0]


@pytest.mark.slow
@pytest.mark.parametrize("family,lora", [
    # make test trains the hardest case (GPT-2's transposed Conv1D under LoRA); make test-long the other three
    pytest.param("llama", False, marks=pytest.mark.long), pytest.param("llama", True, marks=pytest.mark.long),
    pytest.param("gpt2", False, marks=pytest.mark.long), ("gpt2", True),
])
def test_train_two_steps_export_and_reload(tmp_path, ray_local, command_here, family, lora):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from openmanus_rl_core.checkpoint.store import load_checkpoint
    from openmanus_rl_core.models.loading import apply_lora, check_model
    from openmanus_rl_core.config.schema import LoraConfig, ModelConfig

    folder = save_tiny(family, tmp_path / family)
    run_dir, out = tmp_path / "run", tmp_path / "exported"
    train = command_here(["train", *RUN, *(LORA[family] if lora else []), f"model.path={folder}",
                          f"trainer.run_dir={run_dir}"])
    assert train.returncode == 0, train.stderr[-3000:]
    ckpt = run_dir / "checkpoints" / "step_000002"
    export = command_here(["export", f"trainer.checkpoint={ckpt}", f"export.dir={out}"])
    assert export.returncode == 0, export.stderr[-3000:]

    # The checkpoint's policy as PEFT runs it (adapters unmerged), independent of the export's merge.
    state = load_checkpoint(ckpt, keys=["model", "meta"])
    assert state["meta"]["step"] == 2
    trained = AutoModelForCausalLM.from_pretrained(str(folder), local_files_only=True)
    if lora:
        trained = apply_lora(trained, LoraConfig(**state["meta"]["config"]["model"]["lora"]))
    trained.load_state_dict(state["model"], strict=True)
    trained.eval()
    tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    reloaded = AutoModelForCausalLM.from_pretrained(str(out), local_files_only=True).eval()
    got = _log_probs(reloaded, AutoTokenizer.from_pretrained(str(out), local_files_only=True))
    torch.testing.assert_close(got, _log_probs(trained, tokenizer), rtol=0, atol=1e-5)
    base = AutoModelForCausalLM.from_pretrained(str(folder), local_files_only=True).eval()
    assert (got - _log_probs(base, tokenizer)).abs().max() > 1e-4  # two steps moved the weights
    check_model(ModelConfig(path=str(out)))
    if (family, lora) != ("gpt2", False):  # one eval of an exported folder is enough: it loads as model.path does
        return
    result = tmp_path / "eval.json"
    ev = command_here(["eval", "env=key_door", "env.val_tasks=4", "rollout.max_new_tokens=8", f"model.path={out}",
                       f"trainer.eval_output={result}", f"trainer.run_dir={tmp_path / 'ev'}"])
    assert ev.returncode == 0, ev.stderr[-3000:]
    assert json.loads(result.read_text())["tasks"] == 4
