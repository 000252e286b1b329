"""The autoscaling policy: observations in, a replica count and a readable reason out.
Pure: the operator and the simulator call the same code."""
