"""Facts about the hardware a rank runs on, measured or read once per process
(:mod:`rlweave.devices.cpu`: how fast this CPU runs bf16). Importing this package imports
no torch."""
