"""One exporter per state directory: the lock held, refused to a second holder, left behind
by nobody."""

from __future__ import annotations

import os

import pytest

from exporter.state.lock import LOCK_NAME, StateDirInUse, hold_state_dir, release_state_dir


class TestStateDirLock:
    def test_a_second_holder_is_refused_naming_the_first(self, tmp_path):
        fd = hold_state_dir(tmp_path)
        try:
            with pytest.raises(StateDirInUse, match=f"pid {os.getpid()}"):
                hold_state_dir(tmp_path)
        finally:
            release_state_dir(fd, tmp_path)

    def test_release_leaves_no_lock_file_and_the_next_holder_gets_it(self, tmp_path):
        release_state_dir(hold_state_dir(tmp_path), tmp_path)
        assert not (tmp_path / LOCK_NAME).exists()
        fd = hold_state_dir(tmp_path)
        assert (tmp_path / LOCK_NAME).read_text() == f"{os.getpid()}\n"
        release_state_dir(fd, tmp_path)

    @pytest.mark.parametrize(("other_file", "kept"), [(False, False), (True, True)])
    def test_a_directory_made_for_nothing_goes_too(self, tmp_path, other_file, kept):
        folder = tmp_path / "outputs"
        fd = hold_state_dir(folder)
        if other_file:
            (folder / "state.sqlite").write_bytes(b"")
        release_state_dir(fd, folder, remove_directory=True)
        assert folder.exists() is kept
