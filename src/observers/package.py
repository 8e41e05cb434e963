"""What this instrumentation instruments (read by opentelemetry-instrument's dependency check)."""

_instruments = ("torch >= 2.3",)
_supports_metrics = True
