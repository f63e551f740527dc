"""The engine's GGUF header reader against gguf's own GGUFReader: the same metadata and
the same tensors (type, shape, offset, bytes) on files written by gguf's writer, and a
clear refusal of damaged headers instead of an exception from deep inside."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter

from engine.model_files.gguf_header import GGUFFile, HeaderError
from tests.engine.gguf_fixtures import tiny_llama, tiny_tokenizer, write_tiny_gguf


def _reference_metadata(reader: GGUFReader) -> dict:
    """gguf's fields as plain values, arrays of arrays left out."""
    out = {}
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or not field.types:
            continue
        if field.types[0] == GGUFValueType.ARRAY and len(field.types) != 2:
            continue
        value = field.contents()
        if field.types[-1] == GGUFValueType.FLOAT32:
            value = (
                [float(str(np.float32(v))) for v in value]
                if isinstance(value, list)
                else float(str(np.float32(value)))
            )
        out[name] = value
    return out


def _check_same(path):
    reference, ours = GGUFReader(path), GGUFFile(path)
    assert ours.metadata == _reference_metadata(reference)
    assert [t.name for t in ours.tensors] == [t.name for t in reference.tensors]
    for mine, theirs in zip(ours.tensors, reference.tensors, strict=True):
        assert mine.tensor_type == theirs.tensor_type
        assert mine.shape.tolist() == theirs.shape.tolist()
        assert (mine.n_elements, mine.n_bytes) == (theirs.n_elements, theirs.n_bytes)
        assert mine.data_offset == theirs.data_offset
        assert mine.data.dtype == theirs.data.dtype and mine.data.shape == theirs.data.shape
        assert np.array_equal(mine.data, theirs.data)


def test_a_model_file_reads_as_gguf_reads_it(tmp_path):
    tokenizer = tiny_tokenizer()
    path = tmp_path / "tiny.gguf"
    types = {"model.layers.0.mlp.down_proj.weight": GGMLQuantizationType.Q4_1}
    types["model.layers.1.self_attn.q_proj.weight"] = GGMLQuantizationType.Q8_0
    write_tiny_gguf(path, tiny_llama(tokenizer.get_vocab_size(), False), tokenizer, types)
    _check_same(path)


def test_every_value_type_reads_as_gguf_reads_it(tmp_path):
    path = tmp_path / "values.gguf"
    writer = GGUFWriter(path, "llama")
    writer.add_uint8("t.u8", 200)
    writer.add_int8("t.i8", -5)
    writer.add_uint16("t.u16", 60000)
    writer.add_int16("t.i16", -300)
    writer.add_uint32("t.u32", 4_000_000_000)
    writer.add_int32("t.i32", -7)
    writer.add_float32("t.f32", 1e-5)
    writer.add_uint64("t.u64", 2**63 + 5)
    writer.add_int64("t.i64", -(2**40))
    writer.add_float64("t.f64", 0.1)
    writer.add_bool("t.bool", True)
    writer.add_string("t.str", "héllo ✓")
    writer.add_array("t.ints", [1, 2, 3])
    writer.add_array("t.floats", [0.5, 1e-6])
    writer.add_array("t.strs", ["a", "", "ü"])
    writer.add_array("t.bools", [True, False])
    writer.add_array("t.empty", [])
    writer.add_tensor("w", np.arange(64, dtype=np.float32).reshape(2, 32))
    writer.add_tensor("h", np.ones((3, 5), dtype=np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    _check_same(path)
    ours = GGUFFile(path)
    assert ours.metadata["t.f32"] == 1e-5 and ours.metadata["t.strs"] == ["a", "", "ü"]


def _header(*parts: bytes) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + b"".join(parts)


def _string(text: bytes) -> bytes:
    return struct.pack("<Q", len(text)) + text


@pytest.mark.parametrize(
    "content, message",
    [
        (b"GGUF" + struct.pack("<I", 1), "version 1"),
        (b"GGUF" + struct.pack(">I", 3) + bytes(16), "version"),  # big-endian
        (_header(_string(b"k"), struct.pack("<I", 99)), "unknown GGUF value type"),
        (_header(struct.pack("<Q", 2**60)), "past the end"),  # a key longer than the file
        (_header(_string(b"k"), struct.pack("<IIQ", 9, 4, 2**59)), "past the end"),
        (_header(_string(b"\xff\xfe"), struct.pack("<IB", 0, 1)), "decode"),
        (b"GGUF" + struct.pack("<IQQ", 3, 1, 0) + _string(b"t") + struct.pack("<I", 1), "unpack"),
        # string arrays (a vocabulary): a string longer than the file, a cut-off length,
        # bytes that are not UTF-8
        (
            _header(
                _string(b"k"), struct.pack("<IIQ", 9, 8, 2), _string(b"a"), struct.pack("<Q", 2**40)
            ),
            "past the end",
        ),
        (_header(_string(b"k"), struct.pack("<IIQ", 9, 8, 3), _string(b"a"), b"\x01"), "unpack"),
        (_header(_string(b"k"), struct.pack("<IIQ", 9, 8, 1), _string(b"\xc3")), "decode"),
    ],
    ids=[
        "v1",
        "big-endian",
        "value-type",
        "key-length",
        "array-length",
        "utf8",
        "cut-info",
        "vocab-string-length",
        "vocab-cut",
        "vocab-utf8",
    ],
)
def test_damaged_headers_are_refused_with_a_reason(tmp_path, content, message):
    path = tmp_path / "bad.gguf"
    path.write_bytes(content)
    with pytest.raises(HeaderError, match=message):
        GGUFFile(path)


def test_a_tensor_past_the_end_is_refused(tmp_path):
    path = tmp_path / "cut.gguf"
    info = _string(b"w") + struct.pack("<IQQIQ", 2, 32, 4, int(GGMLQuantizationType.F32), 0)
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 1, 0) + info + bytes(64))
    with pytest.raises(HeaderError, match="cut off"):
        GGUFFile(path)
