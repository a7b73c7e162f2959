"""Test hooks read by settings.py: spans and JSON log lines written to files, modules blocked.

``RE_OTEL_SPANS=<file>``: install an OpenTelemetry SDK tracer provider whose spans are written,
one JSON object a line, to the file as each ends (a runexecutor's, and its process pool
children's: each line is one append). ``RE_BLOCK_IMPORTS=a,b``: make those packages (and their
submodules) impossible to import, as if not installed; with ``RE_IMPORT_ATTEMPTS=<file>``, every
attempt that came from django_reliable_executor's own code is written to that file.
"""

from __future__ import annotations

import importlib.abc
import json
import os
import sys
import traceback
from pathlib import Path

PACKAGE_DIR = str(Path(__file__).resolve().parent.parent.parent / "django_reliable_executor")


def span_record(span) -> dict:
    """What the tests read of an ended span."""
    context, parent = span.context, span.parent
    return {
        "name": span.name,
        "trace_id": format(context.trace_id, "032x"),
        "span_id": format(context.span_id, "016x"),
        "parent_span_id": format(parent.span_id, "016x") if parent is not None else None,
        "kind": span.kind.name,
        "attributes": dict(span.attributes or {}),
        "status": span.status.status_code.name,
        "events": [
            {"name": event.name, "attributes": dict(event.attributes or {})}
            for event in span.events
        ],
        "pid": os.getpid(),
    }


def install_span_file(path: str) -> None:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

    class FileExporter(SpanExporter):
        def export(self, spans):
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                for span in spans:
                    os.write(fd, (json.dumps(span_record(span)) + "\n").encode())
            finally:
                os.close(fd)
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(FileExporter()))
    trace.set_tracer_provider(provider)


class Blocker(importlib.abc.MetaPathFinder):
    """Refuses the blocked packages; notes the attempts made by this app's code."""

    def __init__(self, names: list[str], attempts: str | None) -> None:
        self.names = names
        self.attempts = attempts

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] not in self.names:
            return None
        if self.attempts:
            # The frame running the import statement: the first below the import machinery.
            frames = [
                frame
                for frame in traceback.extract_stack()[:-1]
                if not frame.filename.startswith("<frozen")
                and not frame.filename.endswith("importlib/__init__.py")
            ]
            importer = frames[-1] if frames else None
            if importer is not None and importer.filename.startswith(PACKAGE_DIR):
                with open(self.attempts, "a") as file:
                    file.write(f"{fullname} from {importer.filename}:{importer.lineno}\n")
        raise ModuleNotFoundError(f"No module named {fullname!r} (blocked)", name=fullname)


def block_imports(names: list[str], attempts: str | None) -> None:
    loaded = [name for name in sys.modules if name.split(".")[0] in names]
    if loaded:
        raise RuntimeError(f"already imported, cannot block: {loaded}")
    sys.meta_path.insert(0, Blocker(names, attempts))


def configure() -> None:
    blocked = os.environ.get("RE_BLOCK_IMPORTS")
    if blocked:
        block_imports(blocked.split(","), os.environ.get("RE_IMPORT_ATTEMPTS"))
    spans = os.environ.get("RE_OTEL_SPANS")
    if spans:
        install_span_file(spans)
