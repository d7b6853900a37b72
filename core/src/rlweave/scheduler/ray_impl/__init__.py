"""Ray implementation of the scheduler: cluster start/stop, placement groups, actors.

Imported only when a run needs Ray (``import rlweave`` never imports it).
"""
