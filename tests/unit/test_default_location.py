"""Where runs live when no database is named."""

from __future__ import annotations

from pathlib import Path

import pytest


def test_the_default_database_follows_xdg_data_home_when_it_is_absolute(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A relative ``XDG_DATA_HOME`` is ignored, as the XDG spec says (it named a different file
    from each directory); an absolute one is where runs live; ``WORKFLOW_ENGINE_DB`` wins."""
    from workflow_engine.storage._location import default_db_path

    monkeypatch.delenv("WORKFLOW_ENGINE_DB", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    home_default = tmp_path / ".local" / "share" / "workflow-engine" / "runs.db"
    monkeypatch.setenv("XDG_DATA_HOME", "relative/data")
    assert default_db_path() == home_default
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    assert default_db_path() == tmp_path / "data" / "workflow-engine" / "runs.db"
    monkeypatch.setenv("WORKFLOW_ENGINE_DB", "mine.db")
    assert default_db_path() == Path("mine.db")
