"""Where runs live when no database is named."""

from __future__ import annotations

import os
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


@pytest.mark.parametrize("home", ["", None])
def test_an_empty_or_unset_home_is_the_user_s_own(
    monkeypatch: pytest.MonkeyPatch, home: str | None
) -> None:
    """An empty ``HOME`` read as ``/`` (Python's ``expanduser``): runs went to
    ``/.local/share`` (outside tester 99). Empty or unset, it is the password database's."""
    import pwd

    from workflow_engine.storage._location import home_directory

    if home is None:
        monkeypatch.delenv("HOME", raising=False)
    else:
        monkeypatch.setenv("HOME", home)
    assert home_directory("the home directory is", "set HOME") == pwd.getpwuid(os.getuid()).pw_dir


def test_a_home_that_names_no_directory_is_a_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """``HOME=~`` raised a bare ``RuntimeError`` from ``Path.home()``: a traceback at every
    command (outside tester 99)."""
    from workflow_engine import UsageError
    from workflow_engine.storage._location import default_db_path

    monkeypatch.delenv("WORKFLOW_ENGINE_DB", raising=False)
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    monkeypatch.setenv("HOME", "~")
    with pytest.raises(UsageError, match=r"\$HOME is '~'; give --db PATH, or set WORKFLOW_ENGINE"):
        default_db_path()


def test_a_tilde_in_the_variable_is_the_home_directory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``WORKFLOW_ENGINE_DB='~/runs.db'`` (quoted: no shell expands it) made a directory named
    ``~`` in the current one (outside tester 99)."""
    from workflow_engine.storage._location import default_db_path

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("WORKFLOW_ENGINE_DB", "~/runs.db")
    assert default_db_path() == tmp_path / "runs.db"


@pytest.mark.parametrize("home", ["", None])
def test_a_tilde_follows_the_same_home_as_the_default(
    monkeypatch: pytest.MonkeyPatch, home: str | None
) -> None:
    """``--db '~/t.db'`` under an empty ``HOME`` made ``/t.db`` (``os.path.expanduser`` takes
    an empty ``HOME`` for ``/``), while the default database went to the user's own home
    (outside tester 100)."""
    import pwd

    from workflow_engine.storage._location import expand_home

    if home is None:
        monkeypatch.delenv("HOME", raising=False)
    else:
        monkeypatch.setenv("HOME", home)
    own = pwd.getpwuid(os.getuid()).pw_dir
    assert expand_home("~/t.db") == f"{own}/t.db"
    assert expand_home("~") == own
    assert expand_home("~root/t.db") == f"{pwd.getpwnam('root').pw_dir}/t.db"
    assert expand_home("a/~/t.db") == "a/~/t.db"
    monkeypatch.setenv("HOME", "/")
    assert expand_home("~/t.db") == "/t.db"  # (it was //t.db: outside tester 101)


def test_a_tilde_under_a_home_of_tilde_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """``HOME='~'`` with ``--db '~/x.db'`` made a directory named ``~`` in the current one, a
    trap for ``rm -rf ~`` (outside tester 100)."""
    from workflow_engine import UsageError
    from workflow_engine.storage._location import expand_home

    monkeypatch.setenv("HOME", "~")
    with pytest.raises(UsageError, match=r"cannot tell where '~/x.db' is: \$HOME is '~'"):
        expand_home("~/x.db")


def test_a_tilde_of_no_user_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--db '~nosuchuser/x.db'`` was left as written, as a shell leaves it, and the store then
    made a directory named ``~nosuchuser`` in the current one (outside tester 101)."""
    from workflow_engine import UsageError
    from workflow_engine.storage._location import expand_home

    for path in ("~no-such-user-here/t.db", "~no-such-user-here"):
        with pytest.raises(UsageError, match=r"there is no user 'no-such-user-here'; give a pa"):
            expand_home(path)


@pytest.mark.parametrize("kind", ["missing", "a file"])
def test_a_home_that_is_not_a_directory_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, kind: str
) -> None:
    """A ``HOME`` naming no directory was made, parents and all, by the first command that
    stored a run there (outside tester 101): the store makes its own folders, not a home."""
    from workflow_engine import UsageError
    from workflow_engine.storage._location import default_db_path, expand_home

    home = tmp_path / "nobody"
    if kind == "a file":
        home.write_text("")
    monkeypatch.delenv("WORKFLOW_ENGINE_DB", raising=False)
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    monkeypatch.setenv("HOME", str(home))
    said = rf"\$HOME is '{home}', which is not a directory"
    with pytest.raises(UsageError, match=rf"the default database is: {said}"):
        default_db_path()
    with pytest.raises(UsageError, match=rf"'~/x.db' is: {said}"):
        expand_home("~/x.db")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))  # (not needed then)
    assert default_db_path() == tmp_path / "workflow-engine" / "runs.db"


def test_a_user_s_home_that_is_not_a_directory_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``--db '~nobody/x.db'`` made ``/nonexistent/x.db``, nobody's home and all, as a missing
    ``$HOME`` was made (outside tester 102)."""
    import pwd

    from workflow_engine import UsageError
    from workflow_engine.storage._location import expand_home

    real = pwd.getpwnam
    gone = str(tmp_path / "nonexistent")
    entry = real("root")
    fake = pwd.struct_passwd((*entry[:5], gone, *entry[6:]))
    monkeypatch.setattr(pwd, "getpwnam", lambda name: fake if name == "nobody-here" else real(name))
    with pytest.raises(UsageError, match=rf"user 'nobody-here' has the home '{gone}', which is no"):
        expand_home("~nobody-here/x.db")
    assert expand_home("~root") == real("root").pw_dir


def test_a_relative_home_that_names_no_directory_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A relative ``HOME`` naming no directory was made in the current one, as a home (outside
    tester 102); one that exists there is used."""
    from workflow_engine import UsageError
    from workflow_engine.storage._location import default_db_path

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("WORKFLOW_ENGINE_DB", raising=False)
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    monkeypatch.setenv("HOME", "relhome")
    with pytest.raises(UsageError, match=r"\$HOME is 'relhome', which is not a directory"):
        default_db_path()
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "relhome").mkdir()
    assert default_db_path() == Path("relhome/.local/share/workflow-engine/runs.db")
