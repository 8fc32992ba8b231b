"""The reward-model component on a tiny Qwen2ForSequenceClassification built from a config (no download): scores
equal a direct forward pass, batched == one by one, truncation keeps the end, and the composer's batch path
(one compute_batch call per batch, per-sample error counting, fallback when the batch call fails)."""

from __future__ import annotations

import math
import pickle

import pytest
import torch

from openmanus_rl_core.models.loading import build_tokenizer
from openmanus_rl_core.protocols import ParsedAction, Trajectory, Turn
from openmanus_rl_core.plugin.registry import registry
from openmanus_rl_core.rewards.composer import ComponentSpec, RewardComposer
from openmanus_rl_core.testing import check_reward
from openmanus_rl_reward_model import RewardModelScorer

TEXTS = ["What is 17 + 25?", "42", "<action>42</action>", "I am not sure, maybe 41 or 43", "Say: apple", "apple"]


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model: threads only add overhead on a small CPU
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory):
    from transformers import Qwen2Config, Qwen2ForSequenceClassification

    out = tmp_path_factory.mktemp("rm")
    tok = build_tokenizer(TEXTS * 3, vocab_size=300, out_dir=out)
    config = Qwen2Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, num_labels=1,
                         pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    model = Qwen2ForSequenceClassification(config)
    with torch.no_grad():  # a visible spread of scores
        model.score.weight.normal_(0.0, 1.0)
    model.save_pretrained(out)
    return out


def traj(prompt: str, replies: list[str], task_id: int = 0) -> Trajectory:
    turns = [Turn(r, ParsedAction("action", r, True), f"obs {i}", 0.0, i == len(replies) - 1, {}, (0, 1))
             for i, r in enumerate(replies)]
    return Trajectory(task_id=task_id, seed=0, group_id=0, initial_observation=prompt, turns=turns)


def direct_score(rm_dir, text: str, max_length: int | None = None) -> float:
    """The model's logit for one text, computed here without the component (no padding at all)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(rm_dir))
    model = AutoModelForSequenceClassification.from_pretrained(str(rm_dir)).eval()
    ids = tok(text)["input_ids"]
    if max_length is not None:
        ids = ids[-max_length:]
    with torch.no_grad():
        return float(model(input_ids=torch.tensor([ids])).logits[0, 0])


BATCH = [traj("What is 17 + 25?", ["42"], 0), traj("What is 17 + 25?", ["<action>42</action>"], 1),
         traj("Say: apple", ["apple"], 2), traj("Say: apple", ["I am not sure, maybe 41 or 43 " * 3], 3),
         traj("x", ["a", "b", "apple"], 4)]


def test_registered_and_conforms(rm_dir):
    entry = next(e for e in registry("reward").entries() if e.name == "reward_model")
    assert entry.dist == "openmanus-rl-reward-model"
    rm = registry("reward").build("reward_model", model_path=str(rm_dir), device="cpu")
    assert isinstance(rm, RewardModelScorer)
    check_reward(rm, BATCH)


def test_score_is_the_models_logit_for_prompt_plus_response(rm_dir):
    rm = RewardModelScorer(str(rm_dir), device="cpu")
    t = BATCH[1]
    assert rm.text_of(t) == "What is 17 + 25?<action>42</action>"
    assert rm.compute(t) == pytest.approx(direct_score(rm_dir, "What is 17 + 25?<action>42</action>"), abs=1e-5)
    assert rm.device.type == "cpu" and rm.model.config.num_labels == 1


def test_batched_equals_one_by_one(rm_dir):
    rm = RewardModelScorer(str(rm_dir), batch_size=2, device="cpu")
    batched = rm.compute_batch(BATCH)
    single = [rm.compute(t) for t in BATCH]
    assert batched == pytest.approx(single, abs=1e-5)
    assert len(set(round(v, 4) for v in batched)) > 1  # the texts get different scores


def test_text_modes_template_truncation_and_sigmoid(rm_dir):
    t = traj("Start.", ["go", "look", "done"])
    conv = RewardModelScorer(str(rm_dir), device="cpu", text="conversation", template="Q: {prompt}\nA: {response}")
    assert conv.text_of(t) == "Q: Start.\nA: go\nobs 0\nlook\nobs 1\ndone"
    long_text = "What is 17 + 25? " + "maybe 41 or 43 " * 20
    short = RewardModelScorer(str(rm_dir), device="cpu", max_length=8, template="{response}")
    # truncation keeps the last 8 tokens (the answer end of the text)
    assert short.compute(traj("", [long_text])) == pytest.approx(direct_score(rm_dir, long_text, 8), abs=1e-5)
    sig = RewardModelScorer(str(rm_dir), device="cpu", sigmoid=True)
    raw = RewardModelScorer(str(rm_dir), device="cpu")
    assert sig.compute(BATCH[0]) == pytest.approx(1 / (1 + math.exp(-raw.compute(BATCH[0]))), abs=1e-6)


def test_device_auto_is_the_trainers_device(rm_dir):
    rm = RewardModelScorer(str(rm_dir)).load()
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert rm.device.type == expected and next(rm.model.parameters()).device.type == expected


def test_bad_arguments(rm_dir, tmp_path):
    with pytest.raises(FileNotFoundError, match="not a model folder"):
        RewardModelScorer(str(tmp_path / "nothing"))
    for kwargs, match in [({"batch_size": 0}, "batch_size"), ({"max_length": 1}, "max_length"),
                          ({"template": "{prompt}"}, "template"), ({"text": "all"}, "text"),
                          ({"truncation_side": "middle"}, "truncation_side")]:
        with pytest.raises(ValueError, match=match):
            RewardModelScorer(str(rm_dir), **kwargs)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            RewardModelScorer(str(rm_dir), device="cuda").load()
    with pytest.raises(ValueError, match="dtype"):
        RewardModelScorer(str(rm_dir), device="cpu", dtype="float99").load()


def test_wrong_num_labels(tmp_path):
    from transformers import Qwen2Config, Qwen2ForSequenceClassification

    tok = build_tokenizer(TEXTS, vocab_size=300, out_dir=tmp_path)
    Qwen2ForSequenceClassification(Qwen2Config(
        vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, num_labels=3, pad_token_id=tok.pad_token_id)).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="num_labels=3"):
        RewardModelScorer(str(tmp_path), device="cpu").load()


def test_pickles_without_the_model(rm_dir):
    rm = RewardModelScorer(str(rm_dir), device="cpu").load()
    copy = pickle.loads(pickle.dumps(rm))
    assert copy.model is None
    assert copy.compute(BATCH[0]) == pytest.approx(rm.compute(BATCH[0]), abs=1e-6)


# ------------------------------------------------------------------------------------- composer batch path
class Spy(RewardModelScorer):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.batch_calls, self.single_calls = [], 0

    def compute_batch(self, trajectories):
        self.batch_calls.append(len(trajectories))
        return super().compute_batch(trajectories)

    def compute(self, trajectory):
        self.single_calls += 1
        return super().compute(trajectory)


def test_composer_calls_compute_batch_once_per_batch(rm_dir):
    composer = RewardComposer.from_config({"rm": {"name": "reward_model", "weight": 0.5,
                                                  "kwargs": {"model_path": str(rm_dir), "device": "cpu"}}})
    expected = RewardModelScorer(str(rm_dir), device="cpu").compute_batch(BATCH)
    spy = Spy(str(rm_dir), batch_size=3, device="cpu")
    composer.specs[0].component = spy
    breakdowns, metrics = composer.compose_batch(BATCH)
    assert spy.batch_calls == [len(BATCH)] and spy.single_calls == 0
    assert [b.raw["rm"] for b in breakdowns] == pytest.approx(expected, abs=1e-5)
    assert metrics["reward/rm/mean"] == pytest.approx(0.5 * sum(expected) / len(expected), abs=1e-5)
    assert metrics["reward/rm/errors"] == 0.0
    # compose() of one trajectory still works (compute)
    assert composer.compose(BATCH[0]).raw["rm"] == pytest.approx(expected[0], abs=1e-5)


class Batchy:
    """compute_batch with per-sample failures: NaN for task 1, an exception object for task 2."""

    def __init__(self, fail_whole=False, wrong_length=False):
        self.fail_whole, self.wrong_length, self.single = fail_whole, wrong_length, 0

    def compute_batch(self, trajectories):
        if self.fail_whole:
            raise RuntimeError("GPU out of memory")
        if self.wrong_length:
            return [1.0]
        return [float("nan") if t.task_id == 1 else RuntimeError("bad row") if t.task_id == 2 else 1.0
                for t in trajectories]

    def compute(self, trajectory):
        self.single += 1
        if trajectory.task_id == 3:
            raise ValueError("scorer crashed")
        return 2.0


def test_composer_batch_errors_are_counted_per_sample():
    comp = Batchy()
    composer = RewardComposer([ComponentSpec("b", "batchy", 1.0, comp)])
    breakdowns, metrics = composer.compose_batch(BATCH[:4])
    assert [b.total for b in breakdowns] == [1.0, 0.0, 0.0, 1.0]
    assert metrics["reward/b/errors"] == 2.0 and comp.single == 0
    assert "non-finite" in breakdowns[1].errors["b"] and "bad row" in breakdowns[2].errors["b"]


@pytest.mark.parametrize("kw", [{"fail_whole": True}, {"wrong_length": True}])
def test_composer_falls_back_to_compute_when_the_batch_call_fails(kw, caplog):
    comp = Batchy(**kw)
    composer = RewardComposer([ComponentSpec("b", "batchy", 1.0, comp)])
    with caplog.at_level("WARNING"):
        breakdowns, metrics = composer.compose_batch(BATCH[:4])
    assert comp.single == 4
    assert [b.total for b in breakdowns] == [2.0, 2.0, 2.0, 0.0]
    assert metrics["reward/b/errors"] == 1.0
    assert "one trajectory at a time" in caplog.text
