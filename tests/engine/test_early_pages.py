"""The region a GGUF load's packed weights take, made resident while the process starts:
pieces in order and apart, zeroed and writable, closed by the first piece that does not
fit, nothing kept past the load; and a model loaded through it computes what one loaded
without it does."""

from __future__ import annotations

import pytest
import torch

from engine.cpu_kernels.library import unavailable
from engine.host import early_pages
from engine.host.memory_advice import PackedArena


@pytest.fixture(autouse=True)
def no_region_left():
    early_pages.finish()
    yield
    early_pages.finish()
    assert early_pages._REGION is None


def _file(tmp_path, size: int, name: str = "model.gguf"):
    path = tmp_path / name
    path.write_bytes(b"\1" * size)
    return path


def test_only_a_readable_gguf_file_gets_a_region_and_only_one_at_a_time(tmp_path):
    assert not early_pages.prepare(tmp_path / "missing.gguf")
    assert not early_pages.prepare(_file(tmp_path, 4096, "weights.bin"))
    assert not early_pages.prepare(tmp_path)  # a folder
    assert early_pages.prepare(_file(tmp_path, 3 << 20))
    assert not early_pages.prepare(_file(tmp_path, 1 << 20, "other.gguf"))
    assert early_pages.finish() is None  # nothing was taken


def test_pieces_come_in_order_aligned_zeroed_and_writable(tmp_path):
    assert early_pages.prepare(_file(tmp_path, 5 << 20))
    pieces = [early_pages.take(n) for n in (100, 3, 1 << 20, 7)]
    addresses = [torch.frombuffer(p, dtype=torch.uint8).data_ptr() for p in pieces]
    assert addresses[0] % early_pages.HUGE_PAGE == 0  # the region starts on a huge page
    assert all(a % early_pages.ALIGNMENT == 0 for a in addresses)
    ends = [a + len(p) for a, p in zip(addresses, pieces, strict=True)]
    assert all(end <= start for end, start in zip(ends, addresses[1:], strict=False))
    for index, piece in enumerate(pieces):
        assert bytes(piece) == bytes(len(piece))
        piece[:] = bytes([index + 1]) * len(piece)
    taken = early_pages.finish()
    assert len(taken) == ends[-1] - addresses[0]
    for index, piece in enumerate(pieces):
        assert bytes(piece) == bytes([index + 1]) * len(piece)  # kept past the finish
    assert early_pages.take(16) is None  # closed


def test_pieces_written_while_the_thread_still_populates_keep_their_bytes(tmp_path):
    """The thread writes a zero to each page it makes resident: never to a page handed
    out, whatever the loader wrote there first (a piece taken the moment the region
    opens races the thread through the whole region)."""
    for attempt in range(3):
        assert early_pages.prepare(_file(tmp_path, 4096), nbytes=96 << 20)
        pieces = []
        for index in range(96 * 4):  # 256 KiB pieces, each filled as soon as taken
            piece = early_pages.take(1 << 18)
            piece[:] = bytes([index % 251 + 1]) * len(piece)
            pieces.append(piece)
        early_pages.finish()
        for index, piece in enumerate(pieces):
            assert bytes(piece) == bytes([index % 251 + 1]) * len(piece), (attempt, index)


def test_the_first_piece_that_does_not_fit_closes_the_region(tmp_path):
    assert early_pages.prepare(_file(tmp_path, 2 << 20))  # exactly 2 MiB
    first = early_pages.take(1 << 20)
    assert early_pages.take(2 << 20) is None  # too big: closed, its tail given back
    assert early_pages.take(16) is None  # so nothing after it comes from the region
    first[:] = b"\7" * len(first)
    assert len(early_pages.finish()) == 1 << 20


def test_the_arena_takes_from_the_region_first_and_collapses_what_it_took(tmp_path):
    assert early_pages.prepare(_file(tmp_path, 2 << 20))
    arena = PackedArena(chunk_bytes=4 << 20)
    inside = arena.take(1 << 18, torch.float32)  # 1 MiB: from the region
    outside = arena.take(3 << 18, torch.float32)  # 3 MiB: past it, from a chunk
    assert arena._chunks and arena._chunks[0].data_ptr() <= outside.data_ptr()
    region = early_pages._REGION
    start = region.address + region.first
    assert start <= inside.data_ptr() < start + (2 << 20)
    inside.fill_(1.5), outside.fill_(-2.0)
    arena.end_early_region()
    assert early_pages._REGION is None
    assert any(c.data_ptr() == start for c in arena._chunks)  # handed to the collapse
    arena.collapse_in_background().join(timeout=60)
    assert bool((inside == 1.5).all()) and bool((outside == -2.0).all())


def test_a_load_that_takes_nothing_gives_the_whole_region_back(tmp_path):
    assert early_pages.prepare(_file(tmp_path, 4 << 20))
    region = early_pages._REGION
    region.thread.join(timeout=60)  # populated
    assert early_pages.finish() is None
    assert region.stopped and not region.thread.is_alive()


def test_who_packs_here():
    assert early_pages.packs_here("/m/model.gguf", "cpu", 1)
    assert not early_pages.packs_here("/m/model.gguf", "cpu", 2)  # ranks load their own
    assert not early_pages.packs_here("/m/model.gguf", "cuda", 1)
    assert not early_pages.packs_here("/m/folder", "cpu", 1)


@pytest.mark.skipif(bool(unavailable()), reason=f"CPU kernels: {unavailable()}")
def test_a_model_loaded_through_the_region_computes_what_it_computes_without(tmp_path, monkeypatch):
    from engine.llm import LLM
    from tests.engine.gguf_fixtures import write_tiny_block_gguf

    path = write_tiny_block_gguf(tmp_path / "model.gguf")
    prompt = list(range(5, 40))
    settings = {"dtype": "bfloat16", "kv_cache_dtype": "bf16", "device": "cpu"}
    without = LLM(str(path), **settings).prompt_logits(prompt)

    taken = []
    take = early_pages.take

    def counted(nbytes: int):
        piece = take(nbytes)
        taken.append(piece is not None)
        return piece

    monkeypatch.setattr(early_pages, "take", counted)
    # As `resident serve` does before its imports; half the file, so the load runs past it.
    assert early_pages.prepare(path, path.stat().st_size // 2)
    through = LLM(str(path), **settings)
    assert early_pages._REGION is None  # closed by the load
    assert any(taken) and not all(taken)
    assert torch.equal(through.prompt_logits(prompt), without)


def _resident_mib() -> dict[str, int]:
    with open("/proc/self/status") as status:
        rows = [line.split() for line in status if line.startswith(("RssAnon", "RssShmem"))]
    return {row[0].rstrip(":"): int(row[1]) >> 10 for row in rows}


@pytest.mark.skipif(early_pages.LIBC is None, reason="Linux only")
def test_the_region_is_private_memory_and_its_untaken_pages_are_freed(tmp_path):
    """Python maps anonymous memory shared by default, where MADV_DONTNEED only unmaps: the
    region must be private, so what the load did not take is freed, not hidden."""
    before = _resident_mib()
    assert early_pages.prepare(_file(tmp_path, 1024), nbytes=64 << 20)
    early_pages._REGION.thread.join(timeout=60)
    populated = _resident_mib()
    assert populated["RssAnon"] - before["RssAnon"] >= 60
    assert populated["RssShmem"] - before["RssShmem"] < 4
    early_pages.take(8 << 20)
    early_pages.finish()
    assert populated["RssAnon"] - _resident_mib()["RssAnon"] >= 50
