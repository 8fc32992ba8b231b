"""A trained model's way out and real model families in: LoRA merged on GPT-2's transposed Conv1D layers,
`openmanus-rl export` (a checkpoint as a Hugging Face folder that `from_pretrained` and `model.path` take, same
log-probs), `model.chat_template`, and the model check before anything starts."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from tiny_hf import save_tiny  # noqa: E402

from openmanus_rl_core.checkpoint.store import save_checkpoint
from openmanus_rl_core.cli import main
from openmanus_rl_core.models.loading import (CHATML_TEMPLATE, ModelError, apply_lora, check_model, load_tokenizer,
                                      lora_scaling, merge_lora_state, transposed_modules)
from openmanus_rl_core.config.schema import LoraConfig, ModelConfig

GPT2_ALL = ["c_attn", "c_proj", "c_fc"]  # attn.c_proj is square: only the layer type says it is transposed


def _log_probs(model, tokenizer) -> torch.Tensor:
    """Log-probs of each next token of a fixed chat, ``[T-1]``."""
    text = tokenizer.apply_chat_template([{"role": "user", "content": "take key then open door"}],
                                         tokenize=False, add_generation_prompt=True) + "<action>open door</action>"
    ids = torch.tensor([tokenizer.encode(text)])
    with torch.no_grad():
        logits = model(input_ids=ids).logits.float()
    return torch.log_softmax(logits[0, :-1], -1).gather(-1, ids[0, 1:, None])[:, 0]


def _trained_lora(folder: Path, targets: list[str]):
    """A LoRA-wrapped model of ``folder`` whose adapters moved (lora_B starts at 0)."""
    from transformers import AutoModelForCausalLM

    lora = LoraConfig(enabled=True, r=4, alpha=8.0, target_modules=targets)
    model = apply_lora(AutoModelForCausalLM.from_pretrained(str(folder)), lora)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        for name, p in model.named_parameters():
            if "lora_B" in name:
                torch.nn.init.normal_(p, std=0.2)
    return model.eval(), lora


# ------------------------------------------------------------------------------------------------ Conv1D merge
def test_gpt2_lora_merge_matches_peft_on_every_conv1d_layer(tmp_path):
    folder = save_tiny("gpt2", tmp_path / "gpt2")
    model, lora = _trained_lora(folder, GPT2_ALL)
    assert transposed_modules(model) == {f"transformer.h.0.{m}" for m in
                                         ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")}
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    merged = merge_lora_state(sd, lora_scaling(lora), transposed_modules(model))
    reference = copy.deepcopy(model).merge_and_unload().state_dict()
    assert set(merged) == set(reference)
    changed = [k for k, v in model.state_dict().items() if not torch.equal(v, sd[k])]
    for key in reference:
        torch.testing.assert_close(merged[key], reference[key], rtol=0, atol=1e-6)
    base = sd["base_model.model.transformer.h.0.attn.c_proj.base_layer.weight"]
    assert (merged["transformer.h.0.attn.c_proj.weight"] - base).abs().max() > 1e-3  # the adapter was merged
    assert changed == []  # merge_lora_state does not touch the state dict it is given


def test_gpt2_lora_merge_without_the_layer_layout_is_refused_naming_conv1d(tmp_path):
    model, lora = _trained_lora(save_tiny("gpt2", tmp_path / "gpt2"), ["c_attn"])
    with pytest.raises(ValueError, match=r"B @ A has shape \(96, 32\), the base weight \(32, 96\).*Conv1D"):
        merge_lora_state(model.state_dict(), lora_scaling(lora))


def test_llama_has_no_transposed_layers_and_merges_as_before(tmp_path):
    model, lora = _trained_lora(save_tiny("llama", tmp_path / "llama"), ["q_proj", "v_proj"])
    assert transposed_modules(model) == frozenset()
    merged = merge_lora_state(model.state_dict(), lora_scaling(lora))
    reference = copy.deepcopy(model).merge_and_unload().state_dict()
    for key in reference:
        torch.testing.assert_close(merged[key], reference[key], rtol=0, atol=1e-6)


# ---------------------------------------------------------------------------------------------------- export
def _checkpoint(tmp_path: Path, family: str, targets: list[str] | None) -> tuple[Path, object, object]:
    """A checkpoint as the trainer writes one (state "model" + "meta" with the run's config), of a model whose
    weights differ from the folder's: LoRA adapters that moved, or (full fine-tuning) perturbed weights."""
    folder = save_tiny(family, tmp_path / family)
    if targets:
        model, lora = _trained_lora(folder, targets)
    else:
        from transformers import AutoModelForCausalLM

        model, lora = AutoModelForCausalLM.from_pretrained(str(folder)).eval(), LoraConfig()
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.05 * torch.randn_like(p))
    model_cfg = ModelConfig(path=str(folder), lora=lora)
    state = {"model": {k: v.clone() for k, v in model.state_dict().items()},
             "meta": {"model_dir": str(folder), "step": 2, "config": {"model": dataclasses.asdict(model_cfg)}}}
    path = save_checkpoint(tmp_path / "run", 2, state)
    return path, model, load_tokenizer(str(folder))


@pytest.mark.parametrize("family,targets", [("llama", None), ("llama", ["q_proj", "v_proj"]), ("gpt2", None),
                                            ("gpt2", GPT2_ALL)])
def test_export_writes_a_hugging_face_folder_with_the_checkpoints_log_probs(tmp_path, family, targets):
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    ckpt, trained, tokenizer = _checkpoint(tmp_path, family, targets)
    out = tmp_path / "exported"
    assert main(["export", f"trainer.checkpoint={ckpt}", f"export.dir={out}"]) == 0
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json"} <= {
        p.name for p in out.iterdir()}
    reloaded = AutoModelForCausalLM.from_pretrained(str(out), local_files_only=True).eval()
    assert not any("lora" in k for k in reloaded.state_dict())
    reloaded_tok = AutoTokenizer.from_pretrained(str(out), local_files_only=True)
    assert reloaded_tok.chat_template == CHATML_TEMPLATE
    assert GenerationConfig.from_pretrained(str(out)).eos_token_id == tokenizer.eos_token_id
    expected = _log_probs(trained, tokenizer)
    got = _log_probs(reloaded, reloaded_tok)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
    untrained = AutoModelForCausalLM.from_pretrained(str(tmp_path / family)).eval()
    assert (_log_probs(untrained, tokenizer) - expected).abs().max() > 1e-3  # the export carries the training
    assert json.loads((out / "omrl_export.json").read_text())["step"] == 2
    umask = os.umask(0)
    os.umask(umask)
    assert {p.name: oct(p.stat().st_mode & 0o777) for p in out.iterdir()} == {
        p.name: oct(0o666 & ~umask) for p in out.iterdir()}  # every file alike, as the umask says
    # model.path=<exported> is accepted as it is (the model check, and the loader every command uses).
    check_model(ModelConfig(path=str(out)))
    # eval and rollout load the same policy from the checkpoint (the engine gets these merged weights).
    from openmanus_rl_core.commands.from_run import adopt_run_config, load_policy
    from openmanus_rl_core.config.loading import check, compose

    named = [f"trainer.checkpoint={ckpt}"]
    c, run_ckpt = adopt_run_config(check(compose(named), training=False), named, log=lambda message: None)
    policy, policy_tok, weights = load_policy(c, run_ckpt)
    policy.load_state_dict(weights)
    torch.testing.assert_close(_log_probs(policy.eval(), policy_tok), expected, rtol=0, atol=1e-5)


def test_export_refuses_a_non_empty_folder_and_a_missing_dir(tmp_path, capsys):
    ckpt, _, _ = _checkpoint(tmp_path, "llama", None)
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    assert main(["export", f"trainer.checkpoint={ckpt}", f"export.dir={tmp_path / 'busy'}"]) == 2
    assert "export.dir=" in capsys.readouterr().err and (tmp_path / "busy" / "notes.txt").read_text() == "mine"
    assert main(["export", f"trainer.checkpoint={ckpt}"]) == 2
    assert "export.dir: required" in capsys.readouterr().err


# ---------------------------------------------------------------------------------- chat template, model check
def test_model_chat_template_as_text_or_file_fills_a_tokenizer_without_one(tmp_path):
    folder = save_tiny("gpt2", tmp_path / "m", chat_template=False)
    assert load_tokenizer(str(folder)).chat_template is None
    with pytest.raises(ModelError, match=r"model.path=.*no chat template; set model.chat_template"):
        check_model(ModelConfig(path=str(folder)))
    msgs = [{"role": "user", "content": "hi"}]
    for given in (CHATML_TEMPLATE, str(tmp_path / "chatml.jinja")):
        (tmp_path / "chatml.jinja").write_text(CHATML_TEMPLATE)
        check_model(ModelConfig(path=str(folder), chat_template=given))
        tok = load_tokenizer(str(folder), given)
        assert tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) == (
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    with pytest.raises(ModelError, match=r"model.chat_template='no/such.jinja' is neither"):
        load_tokenizer(str(folder), "no/such.jinja")


def test_model_check_names_the_problem(tmp_path):
    folder = save_tiny("gpt2", tmp_path / "m")
    with pytest.raises(ModelError, match=r"model.path=.*nowhere: no such folder"):
        check_model(ModelConfig(path=str(tmp_path / "nowhere")))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelError, match=r"no config.json in that folder"):
        check_model(ModelConfig(path=str(tmp_path / "empty")))
    with pytest.raises(ModelError, match=r"\['q_proj'\] not in this gpt2 model; its linear layers are "
                                         r"\['c_attn', 'c_fc', 'c_proj'\]"):
        check_model(ModelConfig(path=str(folder), lora=LoraConfig(enabled=True, target_modules=["q_proj"])))
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "vocab_size": 300}))
    with pytest.raises(ModelError, match=r"the tokenizer has \d+ tokens but the model's embedding only 300"):
        check_model(ModelConfig(path=str(folder)))


def test_a_model_without_chat_template_stops_train_before_ray_with_one_line(tmp_path, command_here):
    folder = save_tiny("llama", tmp_path / "m", chat_template=False)
    proc = command_here(["train", f"model.path={folder}", f"trainer.run_dir={tmp_path / 'run'}"])
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines[-1].startswith("error: model.path=") and "set model.chat_template" in lines[-1]
    assert "Traceback" not in proc.stderr and not (tmp_path / "run").exists()  # nothing started


def _plain_checkpoint(tmp_path: Path, rollout: dict | None = None) -> tuple[Path, Path]:
    """A llama checkpoint whose model folder has no pad id in its configs (only its tokenizer knows it)."""
    from transformers import AutoModelForCausalLM

    folder = save_tiny("llama", tmp_path / "llama")
    for name in ("config.json", "generation_config.json"):
        data = json.loads((folder / name).read_text())
        data.pop("pad_token_id", None)
        (folder / name).write_text(json.dumps(data))
    model = AutoModelForCausalLM.from_pretrained(str(folder))
    config = {"model": dataclasses.asdict(ModelConfig(path=str(folder)))}
    if rollout is not None:
        from openmanus_rl_core.config.loading import load

        run = load(["env=key_door", *(f"rollout.{k}={v}" for k, v in rollout.items())], training=False)
        config = {**{s: dataclasses.asdict(getattr(run, s)) for s in ("env", "rollout")}, **config}
    state = {"model": {k: v.clone() for k, v in model.state_dict().items()},
             "meta": {"model_dir": str(folder), "step": 1, "config": config}}
    return save_checkpoint(tmp_path / "run", 1, state), folder


def test_the_exported_generation_config_carries_the_tokenizers_pad_token_id(tmp_path):
    from transformers import GenerationConfig

    ckpt, folder = _plain_checkpoint(tmp_path)
    tok = load_tokenizer(str(folder))
    assert tok.pad_token_id is not None and tok.pad_token_id != tok.eos_token_id
    assert GenerationConfig.from_pretrained(str(folder)).pad_token_id is None  # the folder itself does not say
    out = tmp_path / "exported"
    assert main(["export", f"trainer.checkpoint={ckpt}", f"export.dir={out}"]) == 0
    gen = GenerationConfig.from_pretrained(str(out))
    assert (gen.pad_token_id, gen.eos_token_id) == (tok.pad_token_id, tok.eos_token_id)
    assert json.loads((out / "generation_config.json").read_text())["pad_token_id"] == tok.pad_token_id


@pytest.mark.parametrize("command_line, turns", [
    ([], 7),  # the run's own rollout.max_turns
    (["rollout.max_turns=3"], 3),  # K on the command line wins
    (["rollout.temperature=0.5"], 7),  # naming another rollout key keeps the run's max_turns
    (["rollout.temperature=0.5", "rollout.max_turns=2"], 2),
])
def test_eval_and_rollout_from_a_checkpoint_play_the_max_turns_the_command_line_names(tmp_path, command_line,
                                                                                        turns):
    from openmanus_rl_core.commands.from_run import adopt_run_config
    from openmanus_rl_core.config.loading import check, compose

    ckpt, _ = _plain_checkpoint(tmp_path, rollout={"max_turns": 7})
    named = [f"trainer.checkpoint={ckpt}", *command_line]
    c, _ = adopt_run_config(check(compose(named), training=False), named, log=lambda message: None)
    assert c.env.name == "key_door" and c.rollout.max_turns == turns


@pytest.mark.parametrize("umask", [0o077, 0o002])
def test_export_gives_every_file_the_permissions_the_umask_says(tmp_path, umask):
    ckpt, _, _ = _checkpoint(tmp_path, "llama", None)
    out = tmp_path / "exported"
    before = os.umask(umask)
    try:
        assert main(["export", f"trainer.checkpoint={ckpt}", f"export.dir={out}"]) == 0
    finally:
        os.umask(before)
    modes = {p.name: oct(p.stat().st_mode & 0o777) for p in out.rglob("*") if p.is_file()}
    assert len(modes) >= 5 and set(modes.values()) == {oct(0o666 & ~umask)}, modes  # 0o600 / 0o664, all alike
