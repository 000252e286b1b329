"""The serving stand-in for test clusters (`kvscale sim serve`): kwok pods run no containers,
so one process plays the engine of every Running pod of an InferenceService with the
simulator's fleet, in real time, and exposes the engine's metrics (names from
kvscale.metrics.engines) per pod for a real Prometheus to scrape."""
