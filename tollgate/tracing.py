"""OpenTelemetry tracing, optional (pip install 'tollgate[otel]', TOLLGATE_OTEL=1): Django's
own instrumentation traces each request, and each worker attempt is a span named for its
run, step and attempt. Spans go to the OTLP endpoint the standard OTEL_EXPORTER_OTLP_*
variables name."""

from __future__ import annotations

from contextlib import contextmanager, nullcontext

_tracer = None


def setup(exporter=None) -> None:
    """Install the tracer provider and the Django instrumentation (once)."""
    global _tracer
    from opentelemetry import trace
    from opentelemetry.instrumentation.django import DjangoInstrumentor
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    if exporter is None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        processor = BatchSpanProcessor(OTLPSpanExporter())
    else:
        processor = SimpleSpanProcessor(exporter)
    provider = TracerProvider(resource=Resource.create({"service.name": "tollgate"}))
    provider.add_span_processor(processor)
    trace.set_tracer_provider(provider)
    DjangoInstrumentor().instrument()
    _tracer = provider.get_tracer("tollgate")


def attempt_span(run_id: int, step: str, attempt: int):
    """A span around a worker's attempt, when tracing is on."""
    if _tracer is None:
        return nullcontext()
    return _span("tollgate.attempt", run_id=run_id, step=step, attempt=attempt)


@contextmanager
def _span(name: str, **attributes):
    with _tracer.start_as_current_span(name) as span:
        for key, value in attributes.items():
            span.set_attribute(f"tollgate.{key}", value)
        yield span
