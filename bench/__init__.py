"""Running decoders over task streams: the demo, benchmarks and their reports."""
