"""Atomic checkpoints: what is picked, what is refused, and RNG round trips."""

from __future__ import annotations

import json
import random
import zipfile

import numpy as np
import pytest
import torch

from openmanus_rl_core.checkpoint import store as ck
from openmanus_rl_core.checkpoint.rng import capture_rng_state, restore_rng_state
from openmanus_rl_core.checkpoint.store import CheckpointError, latest_checkpoint, load_checkpoint, save_checkpoint
from openmanus_rl_core.data.sampler import TaskSampler


def _state(step: int) -> dict:
    torch.manual_seed(step)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))  # state dict: lr_lambdas=[None]
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    sched.step()
    return {"model": model.state_dict(), "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
            "rng": capture_rng_state(), "sampler": {"epoch": 1, "position": step}, "step": step,
            "meta": {"env": "word_copy", "reward": 0.5}}


def test_save_layout_and_weights_only_load(tmp_path):
    state = _state(3)
    path = save_checkpoint(tmp_path, 3, state)
    assert path == tmp_path / "checkpoints" / "step_000003"
    names = sorted(p.name for p in path.iterdir())
    assert names == ["COMPLETE", "meta.json", "meta.pt", "model.pt", "optimizer.pt", "rng.pt", "sampler.pt",
                     "scheduler.pt", "step.pt"]
    manifest = json.loads((path / "COMPLETE").read_text())
    assert manifest["step"] == 3 and set(manifest["files"]) == set(names) - {"COMPLETE"}
    assert manifest["files"]["model.pt"]["size"] == (path / "model.pt").stat().st_size
    assert json.loads((path / "meta.json").read_text())["meta"] == {"env": "word_copy", "reward": 0.5}

    # every file loads on its own with weights_only=True (nothing needs the full unpickler)
    for f in path.glob("*.pt"):
        torch.load(f, weights_only=True)
    back = load_checkpoint(path)
    assert set(back) == set(state)
    for k, v in state["model"].items():
        assert torch.equal(back["model"][k], v)
    assert back["optimizer"]["param_groups"][0]["betas"] == state["optimizer"]["param_groups"][0]["betas"]
    assert torch.equal(back["optimizer"]["state"][0]["exp_avg"], state["optimizer"]["state"][0]["exp_avg"])
    assert back["step"] == 3 and back["sampler"] == {"epoch": 1, "position": 3} and back["meta"]["reward"] == 0.5
    assert list(load_checkpoint(tmp_path, keys=["model"])) == ["model"]  # a run dir resolves to its latest


def test_leftover_tmp_and_incomplete_dirs_are_never_picked(tmp_path):
    save_checkpoint(tmp_path, 1, {"step": 1})
    root = tmp_path / "checkpoints"
    # what a kill -9 in the middle of saving step 2 leaves, and a step folder whose marker never came
    (root / "step_000002.tmp-abcdef").mkdir()
    (root / "step_000002.tmp-abcdef" / "model.pt").write_bytes(b"partial")
    (root / "step_000003").mkdir()
    (root / "step_000003" / "step.pt").write_bytes(b"no marker")
    assert latest_checkpoint(tmp_path) == root / "step_000001"
    assert ck.checkpoint_problem(root / "step_000003").endswith("no COMPLETE marker (an interrupted save); it cannot be used")
    with pytest.raises(CheckpointError, match="no COMPLETE marker"):
        load_checkpoint(root / "step_000003")
    # the next save clears the tmp leftover and becomes the newest
    save_checkpoint(tmp_path, 4, {"step": 4})
    assert not (root / "step_000002.tmp-abcdef").exists()
    assert latest_checkpoint(tmp_path) == root / "step_000004"


def test_corrupted_file_is_detected_and_the_previous_checkpoint_chosen(tmp_path, caplog):
    save_checkpoint(tmp_path, 1, _state(1))
    p2 = save_checkpoint(tmp_path, 2, _state(2))
    raw = bytearray((p2 / "model.pt").read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # same size, one flipped byte: only the checksum can tell
    (p2 / "model.pt").write_bytes(bytes(raw))
    assert ck.checkpoint_problem(p2, verify="size") is None
    assert "model.pt does not match its SHA-256" in ck.checkpoint_problem(p2)
    with caplog.at_level("WARNING"):
        assert latest_checkpoint(tmp_path) == tmp_path / "checkpoints" / "step_000001"
    assert "skipping checkpoint of step 2" in caplog.text
    # a truncated file is caught by its size, even by the cheap check
    (p2 / "optimizer.pt").write_bytes(b"x")
    assert "optimizer.pt has 1 bytes" in ck.checkpoint_problem(p2, verify="size")
    with pytest.raises(CheckpointError, match="optimizer.pt has 1 bytes"):
        load_checkpoint(p2)


@pytest.mark.parametrize("verify", ["sha256", "size", None])
def test_a_manifest_listing_a_file_that_is_missing_is_refused_naming_the_file(tmp_path, verify):
    p1 = save_checkpoint(tmp_path, 1, _state(1))
    p2 = save_checkpoint(tmp_path, 2, _state(2))
    (p2 / "optimizer.pt").unlink()
    assert ck.checkpoint_problem(p2, verify=verify) == f"{p2}: optimizer.pt is listed in the manifest but missing"
    assert latest_checkpoint(tmp_path, verify=verify) == p1
    with pytest.raises(CheckpointError, match="optimizer.pt is listed in the manifest but missing"):
        load_checkpoint(p2, keys=["model"])  # even when only another key is wanted


def test_a_manifest_key_without_a_file_entry_is_refused_naming_the_file(tmp_path):
    p = save_checkpoint(tmp_path, 1, _state(1))
    manifest = json.loads((p / "COMPLETE").read_text())
    del manifest["files"]["sampler.pt"]
    (p / "COMPLETE").write_text(json.dumps(manifest))
    for verify in ("sha256", "size", None):
        assert ck.checkpoint_problem(p, verify) == f"{p}: the manifest lists key 'sampler' but no file sampler.pt"
    with pytest.raises(CheckpointError, match="no file sampler.pt"):
        load_checkpoint(p)


def test_no_checkpoint_and_empty_run_dir(tmp_path):
    assert latest_checkpoint(tmp_path) is None
    with pytest.raises(CheckpointError, match="no complete checkpoint"):
        load_checkpoint(tmp_path)


def test_resave_same_step_replaces_it(tmp_path):
    save_checkpoint(tmp_path, 5, {"step": 5, "meta": {"v": 1}})
    save_checkpoint(tmp_path, 5, {"step": 5, "meta": {"v": 2}})
    assert load_checkpoint(tmp_path)["meta"] == {"v": 2}
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step_000005"]


def test_keep_last_prunes_older_checkpoints(tmp_path):
    for step in (1, 2, 3, 4):
        save_checkpoint(tmp_path, step, {"step": step}, keep_last=2)
    assert [s for s, _ in ck.list_checkpoints(tmp_path)] == [3, 4]
    (tmp_path / "checkpoints" / "step_000002").mkdir()  # an older incomplete one goes too
    save_checkpoint(tmp_path, 10, {"step": 10}, keep_last=2)
    assert [s for s, _ in ck.list_checkpoints(tmp_path)] == [4, 10]
    assert latest_checkpoint(tmp_path).name == "step_000010"  # numeric order, not string order
    with pytest.raises(CheckpointError, match="keep_last=0"):
        ck.prune_checkpoints(tmp_path, 0)


def test_a_newer_incomplete_step_never_makes_pruning_delete_the_usable_checkpoints(tmp_path):
    for step in (1, 2):
        save_checkpoint(tmp_path, step, {"step": step})
    root = tmp_path / "checkpoints"
    (root / "step_000003").mkdir()  # a save interrupted before its marker, newer than every complete one
    (root / "step_000003" / "model.pt").write_bytes(b"partial")
    assert ck.prune_checkpoints(tmp_path, 1) == [root / "step_000001"]
    assert [s for s, _ in ck.list_checkpoints(tmp_path)] == [2, 3]
    assert latest_checkpoint(tmp_path) == root / "step_000002"
    assert load_checkpoint(tmp_path)["step"] == 2


def test_unsafe_values_are_refused_before_writing(tmp_path):
    with pytest.raises(CheckpointError, match=r"state\['rng'\]\['np'\]: numpy array int64\[3\]"):
        save_checkpoint(tmp_path, 1, {"rng": {"np": np.arange(3)}})
    with pytest.raises(CheckpointError, match=r"state\['meta'\]\['obj'\]: .*is not weights_only-safe"):
        save_checkpoint(tmp_path, 1, {"meta": {"obj": object()}})
    with pytest.raises(CheckpointError, match="cannot be a file name"):
        save_checkpoint(tmp_path, 1, {"../x": 1})
    assert ck.list_checkpoints(tmp_path) == [] and not list((tmp_path / "checkpoints").glob("*"))
    # numpy scalars are harmless: stored as Python numbers
    save_checkpoint(tmp_path, 1, {"meta": {"loss": np.float32(0.25), "n": np.int64(3)}})
    assert load_checkpoint(tmp_path)["meta"] == {"loss": 0.25, "n": 3}


def test_a_pickled_object_is_refused_by_load(tmp_path):
    class Evil:
        def __reduce__(self):
            return (eval, ("0",))  # a builtin no library replaces (Ray swaps `print`)

    p = save_checkpoint(tmp_path, 1, {"step": 1})
    torch.save({"x": Evil()}, p / "step.pt")  # someone swaps a file and rewrites the manifest to match
    manifest = json.loads((p / "COMPLETE").read_text())
    manifest["files"]["step.pt"] = {"size": (p / "step.pt").stat().st_size, "sha256": ck._sha256(p / "step.pt")}
    (p / "COMPLETE").write_text(json.dumps(manifest))
    assert zipfile.is_zipfile(p / "step.pt")
    with pytest.raises(CheckpointError, match=r"step.pt: refused by torch.load\(weights_only=True\)") as err:
        load_checkpoint(p)
    assert "it asks for the Python object `eval`" in str(err.value)
    # torch's own text advises loading it unsafely; the message must not pass that on
    assert "weights_only` set to `False`" not in str(err.value) and "safe_globals" not in str(err.value)
    assert err.value.__cause__ is None and err.value.__suppress_context__


def test_rng_restore_reproduces_the_same_numbers(tmp_path):
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    random.random(), np.random.rand(), torch.rand(1), np.random.randn()  # leave numpy with a cached gaussian
    save_checkpoint(tmp_path, 1, {"rng": capture_rng_state()})
    expected = (random.random(), random.gauss(0, 1), np.random.rand(4).tolist(), np.random.randn(), torch.rand(5))

    random.seed(99)
    np.random.seed(99)
    torch.manual_seed(99)
    rng = load_checkpoint(tmp_path)["rng"]
    assert isinstance(rng["python"], list) and isinstance(rng["numpy"]["key"], list)
    restore_rng_state(rng)
    got = (random.random(), random.gauss(0, 1), np.random.rand(4).tolist(), np.random.randn(), torch.rand(5))
    assert got[:4] == expected[:4]
    assert torch.equal(got[4], expected[4])


def test_resume_round_trip_of_sampler_model_and_rng(tmp_path):
    """What the trainer does: save mid-run, restore, and the continuation matches the uninterrupted run."""

    def run(model, opt, sampler, steps):
        out = []
        for _ in range(steps):
            batch = sampler.next_batch()
            x = torch.tensor([[float(t["task_id"])] for t in batch]) + torch.randn(len(batch), 1)
            loss = (model(x) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            out.append(round(loss.item(), 6))
        return out

    tasks = [{"task_id": i, "seed": 0} for i in range(5)]

    def fresh():
        torch.manual_seed(0)
        m = torch.nn.Linear(1, 1)
        return m, torch.optim.Adam(m.parameters(), lr=0.01), TaskSampler(tasks, 2, seed=3)

    m, o, s = fresh()
    full = run(m, o, s, 6)

    m, o, s = fresh()
    first = run(m, o, s, 3)
    save_checkpoint(tmp_path, 3, {"model": m.state_dict(), "optimizer": o.state_dict(), "sampler": s.state_dict(),
                                  "rng": capture_rng_state(), "step": 3})
    torch.manual_seed(123)  # the crashed process's RNG is gone
    m, o, s = fresh()
    state = load_checkpoint(latest_checkpoint(tmp_path))
    m.load_state_dict(state["model"])
    o.load_state_dict(state["optimizer"])
    s.load_state_dict(state["sampler"])
    restore_rng_state(state["rng"])
    assert first + run(m, o, s, 3) == full


# ------------------------------------------------------------------------- loads, fallback, failed saves
def _flip_a_byte(f) -> None:
    raw = bytearray(f.read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # same size: only the checksum can tell
    f.write_bytes(bytes(raw))


def _plant_pickle(path, key: str) -> None:
    """Replace ``<key>.pt`` by a pickle that runs code, and rewrite the manifest to match (what an attacker with
    write access does)."""
    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    torch.save({"x": Evil()}, path / f"{key}.pt")
    manifest = json.loads((path / "COMPLETE").read_text())
    f = path / f"{key}.pt"
    manifest["files"][f.name] = {"size": f.stat().st_size, "sha256": ck._sha256(f)}
    (path / "COMPLETE").write_text(json.dumps(manifest))


def test_an_explicitly_named_checkpoint_is_checked_by_sha256_on_every_load(tmp_path):
    p = save_checkpoint(tmp_path, 1, _state(1))
    _flip_a_byte(p / "optimizer.pt")
    # a folder named directly (eval trainer.checkpoint=..., trainer.resume=<path>), even when only other keys
    # are read: the whole manifest is checked
    for keys in (None, ["model", "meta"]):
        with pytest.raises(CheckpointError, match="optimizer.pt does not match its SHA-256"):
            load_checkpoint(p, keys=keys)
    with pytest.raises(CheckpointError, match="optimizer.pt does not match its SHA-256"):
        ck.open_checkpoint(p)


def test_a_refused_newest_checkpoint_falls_back_to_the_previous_one(tmp_path, caplog):
    save_checkpoint(tmp_path, 1, _state(1))
    p2 = save_checkpoint(tmp_path, 2, _state(2))
    _plant_pickle(p2, "optimizer")
    assert ck.checkpoint_problem(p2) is None  # the manifest matches: only the load can refuse it
    with caplog.at_level("WARNING"):
        path, state = ck.load_latest_checkpoint(tmp_path)
    assert path.name == "step_000001" and state["step"] == 1 and state["sampler"] == {"epoch": 1, "position": 1}
    assert "checkpoint of step 2 refused, trying the one before" in caplog.text
    assert "it asks for the Python object `print`" in caplog.text
    assert "weights_only` set to `False`" not in caplog.text and "safe_globals" not in caplog.text
    # the same through a run directory
    assert load_checkpoint(tmp_path)["step"] == 1
    # a folder named directly is never swapped for another
    with pytest.raises(CheckpointError, match="optimizer.pt: refused"):
        load_checkpoint(p2)


def test_when_no_checkpoint_loads_the_error_lists_each_and_why(tmp_path):
    p1 = save_checkpoint(tmp_path, 1, _state(1))
    p2 = save_checkpoint(tmp_path, 2, _state(2))
    p3 = save_checkpoint(tmp_path, 3, _state(3))
    _flip_a_byte(p1 / "model.pt")
    _plant_pickle(p2, "rng")
    (p3 / "COMPLETE").unlink()
    assert ck.load_latest_checkpoint(tmp_path / "elsewhere") is None  # no checkpoint at all: nothing to refuse
    with pytest.raises(CheckpointError) as err:
        ck.load_latest_checkpoint(tmp_path)
    lines = str(err.value).splitlines()
    assert lines[0] == f"none of the 3 checkpoint(s) in {tmp_path / 'checkpoints'} can be used:"
    assert lines[1] == "  step_000003: no COMPLETE marker (an interrupted save); it cannot be used"
    assert lines[2].startswith("  step_000002: rng.pt: refused by torch.load(weights_only=True)")
    assert lines[3] == "  step_000001: model.pt does not match its SHA-256 in the manifest (the file is damaged)"


class _FullDisk:
    """A file opened for writing that takes ``room`` bytes and then fails as a full disk does."""

    def __init__(self, f, room: int):
        self.f, self.room = f, room

    def write(self, b) -> int:
        if len(b) > self.room:
            raise OSError(28, "No space left on device")
        self.room -= len(b)
        return self.f.write(b)

    def __getattr__(self, name):
        return getattr(self.f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()


def test_a_full_disk_during_a_save_names_the_path_and_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    p1 = save_checkpoint(tmp_path, 1, _state(1))
    before = {f.name: f.read_bytes() for f in p1.iterdir()}
    real_open = open
    monkeypatch.setattr(ck, "open", lambda path, mode="r", *a, **kw: (
        _FullDisk(real_open(path, mode, *a, **kw), room=600) if "w" in mode else real_open(path, mode, *a, **kw)),
        raising=False)
    with pytest.raises(CheckpointError) as err:
        save_checkpoint(tmp_path, 2, _state(2))
    msg = str(err.value)
    assert msg.startswith(f"{tmp_path / 'checkpoints' / 'step_000002'}: saving step 2 failed writing ")
    assert "model.pt: No space left on device (errno 28)" in msg and "(step_000001) are untouched" in msg
    assert err.value.__cause__ is None and err.value.__suppress_context__  # torch's internal error not chained
    monkeypatch.undo()
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step_000001"]  # no partial folder left
    assert {f.name: f.read_bytes() for f in p1.iterdir()} == before
    assert load_checkpoint(tmp_path)["step"] == 1


def test_a_real_failed_write_names_the_path_and_keeps_the_previous_checkpoint(tmp_path):
    """The kernel refuses the write (RLIMIT_FSIZE, the per-process cap on file size: EFBIG) in a child process."""
    import subprocess
    import sys

    save_checkpoint(tmp_path, 1, _state(1))
    script = f"""
import resource, signal
import torch
from openmanus_rl_core.checkpoint.store import CheckpointError, save_checkpoint
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the cap then fails with EFBIG instead of killing
resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, resource.RLIM_INFINITY))
try:
    save_checkpoint({str(tmp_path)!r}, 2, {{"model": {{"w": torch.zeros(100_000)}}, "step": 2}})
except CheckpointError as exc:
    print(exc)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"{tmp_path / 'checkpoints' / 'step_000002'}: saving step 2 failed writing ")
    assert "model.pt: File too large (errno 27)" in out.stdout
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step_000001"]
    assert load_checkpoint(tmp_path)["step"] == 1
