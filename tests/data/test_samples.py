"""The shipped sample files (asyncrl/assets/data) are what asyncrl.data.samples writes."""

from asyncrl.data.samples import DATA_DIR, render_all


def test_shipped_samples_are_what_the_generator_writes():
    for name, text in render_all().items():
        assert (DATA_DIR / name).read_text(encoding="utf-8") == text, f"run python -m asyncrl.data.samples ({name})"
