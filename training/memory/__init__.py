"""Memory: tracing (tracer.py), the estimate before launch (estimate.py), advice after an OOM (advice.py)."""
