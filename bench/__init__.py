"""NodeMedic benchmarks (``make bench``); each writes its results into docs/benchmarks.json."""
