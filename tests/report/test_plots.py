"""The report's plots (asyncrl.report.plots): the tool time of an agentic run per step."""


def test_tool_time_of_an_agentic_run_is_plotted_per_step():
    from asyncrl.report.plots import tool_waits

    records = [{"step": 0, "elapsed_s": 0.0}, {"step": 1, "elapsed_s": 10.0, "step_time_s": 10.0, "agent_tool_s": 30.0},
               {"step": 2, "elapsed_s": 15.0, "step_time_s": 5.0, "agent_tool_s": 40.0}]
    assert tool_waits(records) == ([10.0, 15.0], [3.0, 2.0])  # 30 s of tools in 10 s, then 10 s in 5 s
    assert tool_waits(records[:1]) == ([], [])
