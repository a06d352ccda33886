"""Small benchmark scripts: ``python -m dpnotebook.benchmarks.<name>``."""
