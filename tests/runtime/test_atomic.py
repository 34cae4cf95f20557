"""runtime.atomic: one file written whole or not at all, on a local path and through pyarrow."""

from __future__ import annotations

import pytest

from runtime.atomic import atomic_output, temporary_sibling, write_bytes, write_text


def names(folder):
    return sorted(p.name for p in folder.iterdir())


@pytest.mark.parametrize("uri", [False, True], ids=["path", "file-uri"])
def test_overwrite_replaces_the_whole_file_and_leaves_no_temporary(tmp_path, uri):
    target = tmp_path / "sub" / "run.json"
    where = f"file://{target}" if uri else target
    write_text(where, "a much longer first version\n")
    write_bytes(where, b"short\n")
    assert target.read_bytes() == b"short\n"  # not the tail of the old one
    assert names(target.parent) == ["run.json"]


@pytest.mark.parametrize("uri", [False, True], ids=["path", "file-uri"])
def test_a_write_that_fails_part_way_leaves_the_old_file_and_no_temporary(tmp_path, uri):
    target = tmp_path / "model.pt"
    where = f"file://{target}" if uri else str(target)
    write_text(where, "old")
    with pytest.raises(RuntimeError, match="disk died"):
        with atomic_output(where) as f:
            f.write(b"half of the ne")
            raise RuntimeError("disk died")
    assert target.read_text() == "old"
    assert names(tmp_path) == ["model.pt"]


def test_a_failed_first_write_leaves_nothing(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        with atomic_output(tmp_path / "x.csv", "part") as f:
            f.write(b"1,2\n")
            raise KeyboardInterrupt
    assert names(tmp_path) == []


def test_the_temporary_is_a_hidden_sibling(tmp_path):
    tmp = temporary_sibling(tmp_path / "SHA256SUMS", "part")
    assert tmp.startswith(f"{tmp_path}/.SHA256SUMS.part-")
    assert temporary_sibling("name").startswith(".name.tmp-")  # a bare name stays in the cwd
