"""The report's plots (asyncrl.report.plots): the tool time of an agentic run per step."""


def test_tool_time_of_an_agentic_run_is_plotted_per_step():
    from asyncrl.report.plots import tool_waits

    records = [
        {"step": 0, "elapsed_s": 0.0},
        {"step": 1, "elapsed_s": 10.0, "step_time_s": 10.0, "agent_tool_s": 30.0},
        {"step": 2, "elapsed_s": 15.0, "step_time_s": 5.0, "agent_tool_s": 40.0},
    ]
    assert tool_waits(records) == ([10.0, 15.0], [3.0, 2.0])  # 30 s of tools in 10 s, then 10 s in 5 s
    assert tool_waits(records[:1]) == ([], [])


def test_matplotlib_keeps_its_cache_in_asyncrls_cache_directory(tmp_path):
    """The font cache is made once, in ~/.cache/asyncrl/matplotlib, not in a new /tmp/asyncrl-mpl-* each run."""
    import os
    import subprocess
    import sys

    code = "import os; from asyncrl.report.plots import pyplot; pyplot(); print(os.environ['MPLCONFIGDIR'])"
    env = {k: v for k, v in os.environ.items() if k != "MPLCONFIGDIR"} | {"XDG_CACHE_HOME": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == str(tmp_path / "asyncrl" / "matplotlib"), out.stderr
