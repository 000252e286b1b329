"""Calibration: the engine profile's step-time fields fitted to what the engines export."""
