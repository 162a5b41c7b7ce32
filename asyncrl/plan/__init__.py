"""The planner: predict a run before it starts (``asyncrl plan``). :mod:`.simulate` is a discrete-event
simulation of asyncrl itself (the real staleness gate and batch assembly, simulated time); :mod:`.costs` the
cost model and hardware profiles (measured, fitted from a run, or from GPU specifications); :mod:`.lengths`
response-length distributions; :mod:`.calibrate` measures a profile on this machine or fits one from a run
directory. docs/planner.md explains the model and where its predictions were wrong."""
