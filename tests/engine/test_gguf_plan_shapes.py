"""check_shapes (engine/model_files/gguf_plan.py): a plan's pieces against the GGUF
tensors' shapes, each kind of mismatch named, rows given as ranges (read from their
ends) or as explicit tuples (a head permutation)."""

from __future__ import annotations

from engine.model_files.gguf_plan import Piece, TensorPlan, check_shapes

SHAPES = {"a": (8, 4), "b": (2, 3, 4), "c": (6, 5)}  # numpy order: b's row view is [6, 4]


def _plan(*pieces: Piece, shape=(8, 4)) -> TensorPlan:
    return TensorPlan("w", shape, pieces)


def test_sound_plans_have_no_problems():
    assert check_shapes([_plan(Piece("a", range(8)))], SHAPES) == []
    assert check_shapes([_plan(Piece("a", range(7, -1, -1)))], SHAPES) == []  # descending
    halves = _plan(Piece("a", range(0, 4)), Piece("b", (5, 0, 1, 2)))
    assert check_shapes([halves], SHAPES) == []
    assert check_shapes([_plan(Piece("a", range(0)), Piece("a", range(8)))], SHAPES) == []


def test_rows_outside_the_tensor_are_named():
    for rows in (range(1, 9), range(8, 0, -1), (0, 8), (-1, 2)):
        problems = check_shapes([_plan(Piece("a", rows), shape=(2, 4))], SHAPES)
        assert any("rows outside a's 8" in p for p in problems), rows


def test_a_missing_tensor_another_width_and_a_wrong_size_are_named():
    assert check_shapes([_plan(Piece("z", range(8)))], SHAPES) == ["w: no GGUF tensor z"]
    widths = check_shapes([_plan(Piece("a", range(4)), Piece("c", range(4)))], SHAPES)
    assert len(widths) == 1 and "differ in width" in widths[0]
    sizes = check_shapes([_plan(Piece("a", range(4)))], SHAPES)
    assert sizes == ["w: the pieces hold 16 values, the shape (8, 4) needs 32"]
