"""`owned_files` by itself; a run's writes through it are tests/trainer/run/test_output_files.py's
question."""

from __future__ import annotations

from common import owned_files


def test_checking_a_directory_makes_nothing(tmp_path):
    """`owned_files.check_dir` (what ``train.py`` checks before Ray) has no side effects."""
    owned_files.check_dir(tmp_path / "a" / "b")
    assert list(tmp_path.iterdir()) == []
    owned_files.check_dir(tmp_path)
