"""asyncrl's cache directory (asyncrl.cache)."""

from asyncrl.cache import cache_dir, source_key, writable_dir, write_atomically


def test_the_cache_follows_xdg_and_falls_back_to_none(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache_dir() == tmp_path / "asyncrl"
    assert writable_dir("x") == tmp_path / "asyncrl" / "x" and (tmp_path / "asyncrl" / "x").is_dir()
    (tmp_path / "f").write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "f"))
    assert writable_dir("x") is None


def test_source_key_changes_with_a_source_file(tmp_path):
    (tmp_path / "a.py").write_text("x = 1\n")
    before = source_key(tmp_path)
    assert source_key(tmp_path) == before
    (tmp_path / "a.py").write_text("x = 12\n")
    assert source_key(tmp_path) != before


def test_write_atomically_leaves_no_temporary_file(tmp_path):
    write_atomically(tmp_path / "t.txt", "hello")
    assert (tmp_path / "t.txt").read_text() == "hello" and [p.name for p in tmp_path.iterdir()] == ["t.txt"]
