"""Timing forward passes: the grid of shapes, the timer, the profile sweep, the device's peaks.
torch-only; its models come from models/ and its draft passes from drafters/."""
