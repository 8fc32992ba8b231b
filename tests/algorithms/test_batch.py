"""Batch: row selection, combination, padding and alignment errors."""

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from openmanus_rl_core.batch import Batch, MissingKeyError

T = torch.tensor


def make(n=4):
    return Batch(
        tensors={"x": torch.arange(n * 2).view(n, 2), "r": torch.arange(n, dtype=torch.float32)},
        non_tensors={"name": [f"s{i}" for i in range(n)], "info": [{"i": i, "tags": [i, i + 1]} for i in range(n)]},
        meta={"temperature": 1.0},
    )


def names(b):
    return list(b.non_tensors["name"])


# ------------------------------------------------------------------------------------------------ basics
def test_len_and_key_access():
    b = make()
    assert len(b) == 4
    assert b["x"].shape == (4, 2)
    assert b["name"][2] == "s2"
    assert b["info"][1] == {"i": 1, "tags": [1, 2]}  # a list-valued sample stays one object, not a new dim
    assert "r" in b and "nope" not in b


def test_setitem_routes_tensors_and_values():
    b = make()
    b["y"] = torch.zeros(4, 3)
    b["label"] = ["a", "b", "c", "d"]
    assert "y" in b.tensors and "label" in b.non_tensors
    b["label"] = torch.ones(4)  # replacing moves the key to the other store
    assert "label" in b.tensors and "label" not in b.non_tensors


def test_misaligned_sizes_raise_naming_fields_and_sizes():
    with pytest.raises(ValueError, match=r"x=3.*name=2"):
        Batch({"x": torch.zeros(3)}, {"name": ["a", "b"]})
    b = make()
    with pytest.raises(ValueError, match=r"'y' has size 5.*batch has 4"):
        b["y"] = torch.zeros(5)


def test_missing_key_is_a_keyerror_naming_it():
    with pytest.raises(MissingKeyError, match="'nope'") as info:
        make()["nope"]
    assert isinstance(info.value, KeyError)


# ----------------------------------------------------------------------------------------------- indexing
def test_int_index_gives_one_row_batch():
    row = make()[-1]
    assert len(row) == 1 and names(row) == ["s3"] and row["x"].tolist() == [[6, 7]]
    with pytest.raises(IndexError):
        make()[4]


def test_slice_list_tensor_and_mask_indexing():
    b = make()
    assert names(b[1:3]) == ["s1", "s2"]
    assert names(b[[3, 0]]) == ["s3", "s0"] and b[[3, 0]]["r"].tolist() == [3.0, 0.0]
    assert names(b[T([2, 2])]) == ["s2", "s2"]
    assert names(b[np.array([1])]) == ["s1"]
    mask = T([True, False, True, False])
    assert names(b[mask]) == ["s0", "s2"] and b[mask]["x"].tolist() == [[0, 1], [4, 5]]
    assert names(b[[False, True, False, True]]) == ["s1", "s3"]
    assert len(b[[]]) == 0
    with pytest.raises(IndexError, match="bool mask has length 3"):
        b[T([True, False, True])]


def test_select_keeps_named_fields_only():
    s = make().select(["x", "name"])
    assert s.keys() == ["x", "name"] and s.meta == {"temperature": 1.0}
    with pytest.raises(MissingKeyError, match="'zz'"):
        make().select(["x", "zz"])


# -------------------------------------------------------------------------------------- splitting/combining
def test_chunk_makes_near_equal_parts():
    parts = make(5).chunk(3)
    assert [len(p) for p in parts] == [2, 2, 1]
    assert [names(p) for p in parts] == [["s0", "s1"], ["s2", "s3"], ["s4"]]


def test_split_by_size():
    assert [len(p) for p in make(5).split(2)] == [2, 2, 1]


def test_concat_requires_same_fields():
    a, b = make(2), make(2).select(["x"])
    with pytest.raises(ValueError, match="same fields"):
        Batch.concat([a, b])


def test_pad_to_divisor_appends_copies_of_the_leading_rows():
    b = make(5)
    padded, pad = b.pad_to_divisor(4)
    assert pad == 3 and len(padded) == 8
    assert names(padded)[5:] == ["s0", "s1", "s2"]  # padding copies leading rows
    assert padded[:5] == b
    same, zero = b.pad_to_divisor(5)
    assert zero == 0 and same is b


def test_to_device_moves_tensors():
    b = make().to("cpu")
    assert b["x"].device.type == "cpu" and names(b) == names(make())


# ------------------------------------------------------------------------------------------ property tests
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-1000, 1000) | st.floats(allow_nan=False, width=32) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=6,
)


@st.composite
def batches(draw, min_size=0):
    n = draw(st.integers(min_size, 7))
    width = draw(st.integers(1, 3))
    x = torch.tensor(draw(st.lists(st.integers(-100, 100), min_size=n * width, max_size=n * width))).view(n, width)
    values = draw(st.lists(json_values, min_size=n, max_size=n))
    return Batch({"x": x, "f": x.float() / 3}, {"v": values}, {"k": draw(st.integers())})


PROPS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@PROPS
@given(batches(), st.integers(1, 8))
def test_split_and_chunk_then_concat_round_trip(b, size):
    if len(b):
        assert Batch.concat(b.split(size)) == b
    assert Batch.concat(b.chunk(size)) == b


@PROPS
@given(batches(min_size=1), st.integers(1, 8))
def test_pad_keeps_the_rows_in_front(b, divisor):
    padded, pad = b.pad_to_divisor(divisor)
    assert len(padded) % divisor == 0 and len(padded) == len(b) + pad
    assert padded[: len(b)] == b
