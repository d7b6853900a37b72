"""The run loop and its utilities (data, checkpoints, metrics, plots, console progress).

``rlweave.runner.loop.run`` drives a whole training run; it imports torch and Ray only
when called. Import submodules directly; this package module imports nothing heavy.
"""
